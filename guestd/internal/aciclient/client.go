// Package aciclient is a minimal ACI client: dial, hello, and in-order
// request/reply over one WebSocket. guestd's tests and benchmarks use it;
// it is deliberately small (no reconnects, no pipelining helpers beyond
// Send/Recv).
package aciclient

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/coder/websocket"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// Client is one ACI session.
type Client struct {
	Conn   *websocket.Conn
	JSON   bool
	nextID uint64
	buf    []byte
	// Events received while waiting for replies, oldest first.
	Events []*aciv1.Event
}

// Options for Dial.
type Options struct {
	Token string
	JSON  bool
	// HTTPClient dials the upgrade (a unix-socket transport, say).
	HTTPClient *http.Client
}

// Dial connects to url ("ws://host:port/") and returns the client without
// sending hello.
func Dial(ctx context.Context, url string, o Options) (*Client, *http.Response, error) {
	sub := "forkfleet.aci.v1"
	if o.JSON {
		sub = "forkfleet.aci.v1+json"
	}
	h := http.Header{}
	if o.Token != "" {
		h.Set("Authorization", "Bearer "+o.Token)
	}
	c, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{
		Subprotocols: []string{sub}, HTTPHeader: h, HTTPClient: o.HTTPClient,
		CompressionMode: websocket.CompressionDisabled,
	})
	if err != nil {
		return nil, resp, err
	}
	c.SetReadLimit(256 << 20)
	return &Client{Conn: c, JSON: o.JSON}, resp, nil
}

// Close closes the connection normally.
func (c *Client) Close() error { return c.Conn.Close(websocket.StatusNormalClosure, "") }

// NextID allocates a request id.
func (c *Client) NextID() uint64 { c.nextID++; return c.nextID }

// Send writes m (assigning an id when it has none) and returns the id.
func (c *Client) Send(ctx context.Context, m *aciv1.ClientMessage) (uint64, error) {
	if m.Id == 0 {
		m.Id = c.NextID()
	}
	var err error
	typ := websocket.MessageBinary
	if c.JSON {
		typ = websocket.MessageText
		c.buf, err = protojson.Marshal(m)
	} else {
		c.buf, err = proto.MarshalOptions{}.MarshalAppend(c.buf[:0], m)
	}
	if err != nil {
		return 0, err
	}
	return m.Id, c.Conn.Write(ctx, typ, c.buf)
}

// Recv reads one ServerMessage (a reply or an event).
func (c *Client) Recv(ctx context.Context) (*aciv1.ServerMessage, error) {
	_, b, err := c.Conn.Read(ctx)
	if err != nil {
		return nil, err
	}
	m := &aciv1.ServerMessage{}
	if c.JSON {
		err = protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, m)
	} else {
		err = proto.Unmarshal(b, m)
	}
	return m, err
}

// Call sends m and returns its reply; events that arrive first are kept in
// Events.
func (c *Client) Call(ctx context.Context, m *aciv1.ClientMessage) (*aciv1.ServerMessage, error) {
	id, err := c.Send(ctx, m)
	if err != nil {
		return nil, err
	}
	for {
		r, err := c.Recv(ctx)
		if err != nil {
			return nil, err
		}
		if r.GetEvent() != nil {
			c.Events = append(c.Events, r.GetEvent())
			continue
		}
		if r.GetId() != id {
			return nil, fmt.Errorf("reply id %d, want %d", r.GetId(), id)
		}
		return r, nil
	}
}

// Hello performs the handshake.
func (c *Client) Hello(ctx context.Context, caps ...string) (*aciv1.HelloResponse, error) {
	r, err := c.Call(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Hello{Hello: &aciv1.HelloRequest{
		ProtocolVersion: 1, ClientName: "aciclient", Capabilities: caps}}})
	if err != nil {
		return nil, err
	}
	if e := r.GetError(); e != nil {
		return nil, fmt.Errorf("hello: %s: %s", e.GetCode(), e.GetMessage())
	}
	return r.GetHello(), nil
}

// WaitReady returns once a ReadyEvent arrived (or was already received).
func (c *Client) WaitReady(ctx context.Context) (*aciv1.ReadyResponse, error) {
	for _, e := range c.Events {
		if r := e.GetReady(); r != nil {
			return r.GetState(), nil
		}
	}
	for {
		m, err := c.Recv(ctx)
		if err != nil {
			return nil, err
		}
		if r := m.GetEvent().GetReady(); r != nil {
			return r.GetState(), nil
		}
		if m.GetEvent() == nil {
			return nil, errors.New("unexpected reply while waiting for the ReadyEvent")
		}
	}
}
