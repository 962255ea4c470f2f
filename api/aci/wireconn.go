package aci

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/coder/websocket"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// WireConn is one ACI connection at the message level: the upgrade with
// its token and subprotocol, the encoding of requests and the checked
// decoding of replies that Session uses, in order, with no reader
// goroutine, no handshake unless asked, no reconnection. Protocol tests
// and tools use it to send what a Session never would (requests before
// hello, raw frames through Conn, duplicate ids) and to read replies and
// events in the order they arrive.
type WireConn struct {
	Conn *websocket.Conn
	// Events holds the events Call and WaitReady read past, oldest first.
	Events []*aciv1.Event

	json   bool
	nextID uint64
	wbuf   []byte
	rd     msgReader
}

// DialWire opens a connection as Dial does (the same options and plaintext
// rule) without the hello handshake. On a refused upgrade the HTTP response
// is returned with the error.
func DialWire(ctx context.Context, rawURL, token string, opts ...DialOption) (*WireConn, *http.Response, error) {
	cfg, hc, err := prepareDial(rawURL, token, opts)
	if err != nil {
		return nil, nil, err
	}
	ws, resp, err := dialWS(ctx, rawURL, token, hc, &cfg)
	if err != nil {
		return nil, resp, err
	}
	return &WireConn{Conn: ws, json: cfg.json}, resp, nil
}

// Close closes the connection normally.
func (w *WireConn) Close() error { return w.Conn.Close(websocket.StatusNormalClosure, "") }

// NextID allocates a request id.
func (w *WireConn) NextID() uint64 { w.nextID++; return w.nextID }

// Send writes m, assigning the next id when it has none, and returns its id.
func (w *WireConn) Send(ctx context.Context, m *aciv1.ClientMessage) (uint64, error) {
	if m.Id == 0 {
		m.Id = w.NextID()
	}
	typ, b, err := encodeClientMessage(w.wbuf[:0], m, w.json)
	if err != nil {
		return 0, fmt.Errorf("aci: %w: encode request: %v", ErrInvalidArgument, err)
	}
	w.wbuf = b
	return m.Id, w.Conn.Write(ctx, typ, b)
}

// Recv reads the next server message, a reply or an event, with the checks
// a Session applies (frame type, element budget).
func (w *WireConn) Recv(ctx context.Context) (*aciv1.ServerMessage, error) {
	stop := context.AfterFunc(ctx, func() { w.Conn.CloseNow() })
	defer stop()
	m, err := w.rd.next(w.Conn, w.json)
	if err != nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return m, err
}

// Call sends m and returns its reply; events that arrive first go to Events.
func (w *WireConn) Call(ctx context.Context, m *aciv1.ClientMessage) (*aciv1.ServerMessage, error) {
	id, err := w.Send(ctx, m)
	if err != nil {
		return nil, err
	}
	for {
		r, err := w.Recv(ctx)
		if err != nil {
			return nil, err
		}
		if r.GetEvent() != nil {
			w.Events = append(w.Events, r.GetEvent())
			continue
		}
		if r.GetId() != id {
			return nil, fmt.Errorf("aci: %w: reply id %d, want %d", ErrProtocol, r.GetId(), id)
		}
		return r, nil
	}
}

// Hello performs the handshake offering caps and returns the server's
// answer; an error reply is returned as an error.
func (w *WireConn) Hello(ctx context.Context, caps ...string) (*aciv1.HelloResponse, error) {
	r, err := w.Call(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Hello{Hello: &aciv1.HelloRequest{
		ProtocolVersion: ProtocolVersion, ClientName: "forkfleet-wire", Capabilities: caps}}})
	if err != nil {
		return nil, err
	}
	if e := r.GetError(); e != nil {
		return nil, fmt.Errorf("aci: hello: %w", FromProto(e))
	}
	return r.GetHello(), nil
}

// WaitReady returns once a ReadyEvent arrived (or was already read into
// Events).
func (w *WireConn) WaitReady(ctx context.Context) (*aciv1.ReadyResponse, error) {
	for _, e := range w.Events {
		if r := e.GetReady(); r != nil {
			return r.GetState(), nil
		}
	}
	for {
		m, err := w.Recv(ctx)
		if err != nil {
			return nil, err
		}
		if m.GetEvent() == nil {
			return nil, errors.New("aci: a reply came while waiting for the ReadyEvent")
		}
		w.Events = append(w.Events, m.GetEvent())
		if r := m.GetEvent().GetReady(); r != nil {
			return r.GetState(), nil
		}
	}
}
