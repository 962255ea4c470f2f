package aci

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"time"

	"github.com/coder/websocket"
)

// directUpgrade is the HTTP round tripper of a local dial (DialUnix,
// DialSandbox): it dials the connection itself and performs the WebSocket
// upgrade on it in the caller's goroutine, and it sends the session's
// Hello frame right behind the upgrade request, without waiting for the
// 101. A session to a sandbox on this host then costs one round trip
// before its first request instead of two, and none of http.Transport's
// goroutine hand-offs (on a host whose idle vCPUs halt, each one can cost
// a wake-up: this is the claim-to-usable path of a pooled sandbox).
//
// The server reads the Hello as the first WebSocket message once it
// accepted the upgrade (an HTTP server keeps what followed a request in the
// hijacked connection's buffer); a server that refuses the upgrade closes
// the connection with the frame unread. The Hello's reply is still awaited
// and checked by the handshake, so Dial reports what it always did.
type directUpgrade struct {
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// early is the frame written right after the request.
	early []byte
}

func (t *directUpgrade) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	conn, err := t.dial(ctx, "unix", req.URL.Host)
	if err != nil {
		return nil, err
	}
	// The hooks of net/http's client trace that apply (benchd places a
	// claim's milliseconds with them).
	trace := httptrace.ContextClientTrace(ctx)
	if trace != nil && trace.GotConn != nil {
		trace.GotConn(httptrace.GotConnInfo{Conn: conn})
	}
	// The read of the response must end with ctx, like http.Transport's.
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	resp, err := t.exchange(req, conn, trace)
	if !stop() {
		err = errors.Join(err, ctx.Err())
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	return resp, nil
}

func (t *directUpgrade) exchange(req *http.Request, conn net.Conn, trace *httptrace.ClientTrace) (*http.Response, error) {
	var out bytes.Buffer
	if err := req.Write(&out); err != nil {
		return nil, err
	}
	out.Write(t.early)
	if _, err := conn.Write(out.Bytes()); err != nil {
		return nil, err
	}
	br := bufio.NewReader(conn)
	if trace != nil && trace.GotFirstResponseByte != nil {
		if _, err := br.Peek(1); err != nil {
			return nil, err
		}
		trace.GotFirstResponseByte()
	}
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		// The refusal's body (read for its message), then the connection.
		resp.Body = &closeBoth{ReadCloser: resp.Body, conn: conn}
		return resp, nil
	}
	// What the server sent behind the 101 (its Hello reply) is in br.
	resp.Body = &upgraded{r: br, Conn: conn}
	return resp, nil
}

// upgraded is the connection after the 101, its reads drained from the
// buffer the response was read through.
type upgraded struct {
	r io.Reader
	net.Conn
}

func (u *upgraded) Read(p []byte) (int, error) { return u.r.Read(p) }

type closeBoth struct {
	io.ReadCloser
	conn net.Conn
}

func (c *closeBoth) Close() error {
	err := c.ReadCloser.Close()
	c.conn.Close()
	return err
}

// clientFrame encodes payload as one masked, final WebSocket frame of typ
// from a client (RFC 6455 5.2 and 5.3).
func clientFrame(typ websocket.MessageType, payload []byte) ([]byte, error) {
	opcode := byte(0x2)
	if typ == websocket.MessageText {
		opcode = 0x1
	}
	f := make([]byte, 0, 14+len(payload))
	f = append(f, 0x80|opcode)
	switch n := len(payload); {
	case n < 126:
		f = append(f, 0x80|byte(n))
	case n <= 0xffff:
		f = append(f, 0x80|126)
		f = binary.BigEndian.AppendUint16(f, uint16(n))
	default:
		f = append(f, 0x80|127)
		f = binary.BigEndian.AppendUint64(f, uint64(n))
	}
	var key [4]byte
	if _, err := rand.Read(key[:]); err != nil {
		return nil, fmt.Errorf("aci: mask key: %w", err)
	}
	f = append(f, key[:]...)
	start := len(f)
	f = append(f, payload...)
	for i := range payload {
		f[start+i] ^= key[i&3]
	}
	return f, nil
}
