package aci

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	aciclient "github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/connlimit"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// serveTCP serves h's server on a loopback listener of its own (the
// harness's httptest server has no connection limits) and returns its
// address.
func serveTCP(t *testing.T, h *harness) string {
	t.Helper()
	ln, err := Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go h.srv.Serve(ln)
	return ln.Addr().String()
}

// TestIdleConnectionsBounded is issue #12 item 9 on guestd: anything in the
// sandbox may connect to its socket. 200 keep-alive connections without a
// token, and silent ones, are closed by the handshake cap and the idle and
// header timeouts; sessions keep working.
func TestIdleConnectionsBounded(t *testing.T) {
	const maxHandshakes, timeout = 32, time.Second
	h := newHarness(t, func(o *Options) {
		o.Conn = connlimit.Limits{HeaderTimeout: timeout, IdleTimeout: timeout, MaxHandshakes: maxHandshakes}
	})
	addr := serveTCP(t, h)
	c, _, err := aciclient.DialWire(tctx(t), "ws://"+addr+"/aci", aciToken)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Conn.CloseNow()
	if _, err := c.Hello(tctx(t)); err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range 200 {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, nc)
		if i%10 == 0 {
			continue // silent
		}
		fmt.Fprintf(nc, "GET /aci HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
		if n := h.srv.Handshakes(); n > maxHandshakes {
			t.Fatalf("%d connections before upgrade, cap %d", n, maxHandshakes)
		}
	}
	deadline := time.Now().Add(timeout + 3*time.Second)
	for i, nc := range conns {
		nc.SetReadDeadline(deadline)
		if _, err := io.Copy(io.Discard, nc); err != nil && !strings.Contains(err.Error(), "connection reset") {
			t.Fatalf("connection %d still open after %v: %v", i, timeout+3*time.Second, err)
		}
	}
	// The server's state hook runs just after the close the client saw.
	for wait := time.Now().Add(time.Second); h.srv.Handshakes() != 0 && time.Now().Before(wait); {
		time.Sleep(5 * time.Millisecond)
	}
	if n := h.srv.Handshakes(); n != 0 {
		t.Fatalf("%d handshakes left", n)
	}
	if r := call(t, c, ping([]byte("x"))); r.GetPing() == nil {
		t.Fatalf("session after the flood: %v", r)
	}
}

// TestSessionCaps: agent sessions are capped (429), controld's admin
// sessions keep a reserve of their own, and a closed session frees its
// place.
func TestSessionCaps(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.MaxSessions = 2 })
	a1 := h.session(aciToken)
	h.session(aciToken)
	_, resp, err := aciclient.DialWire(tctx(t), h.url, aciToken)
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("third agent session: %v %v", err, resp)
	}
	for range adminSessions {
		h.session(adminToken)
	}
	if _, resp, err := aciclient.DialWire(tctx(t), h.url, adminToken); err == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("admin session past its reserve: %v", err)
	}
	a1.Close()
	deadline := time.Now().Add(3 * time.Second)
	for {
		c, _, err := aciclient.DialWire(tctx(t), h.url, aciToken)
		if err == nil {
			c.Conn.CloseNow()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no agent session after one closed: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHelloTimeout: an upgraded connection that never says hello is closed.
func TestHelloTimeout(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.HelloTimeout = 200 * time.Millisecond })
	c := h.dial(aciToken)
	err := readUntilClosed(tctx(t), c)
	if websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Fatalf("silent session: %v", err)
	}
	// One that says hello stays.
	s := h.session(aciToken)
	time.Sleep(400 * time.Millisecond)
	if r := call(t, s, ping(nil)); r.GetPing() == nil {
		t.Fatalf("after hello: %v", r)
	}
}

// TestSessionByteBudget is issue #12 item 9's memory attack: one session
// used to queue 128 requests of up to max_message_bytes behind a slow one
// (128 x 64 MiB by default). With a byte budget the session stops reading
// once the queued requests hold it (TCP pushes back on the client), and no
// request is lost.
func TestSessionByteBudget(t *testing.T) {
	const budget, payload, n = 1 << 20, 256 << 10, 40
	h := newHarness(t, func(o *Options) { o.MaxSessionBytes = budget })
	c := h.session(aciToken)
	ctx := tctx(t)
	// A slow request first, then pings the executor cannot get to yet.
	slow := &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Step{Step: &aciv1.StepRequest{Actions: []*aciv1.Action{
		{Action: &aciv1.Action_Wait{Wait: &aciv1.WaitAction{Milliseconds: 700}}}}}}}
	if _, err := c.Send(ctx, slow); err != nil {
		t.Fatal(err)
	}
	sent := make(chan error, 1)
	go func() {
		for range n {
			if _, err := c.Send(ctx, ping(bytes.Repeat([]byte{'p'}, payload))); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	var ss *session
	for ss == nil {
		h.srv.mu.Lock()
		for s := range h.srv.sessions {
			ss = s
		}
		h.srv.mu.Unlock()
	}
	most := 0
	for end := time.Now().Add(600 * time.Millisecond); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
		most = max(most, len(ss.queue))
	}
	// Queued requests hold at most the budget; one more is decoded and
	// waiting for room.
	if most*payload > budget {
		t.Errorf("%d requests of %d bytes queued, budget %d bytes", most, payload, budget)
	}
	// Everything is answered, in order, once the slow request is done.
	for i := 0; i < n+1; {
		r, err := c.Recv(ctx)
		if err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
		if r.GetId() == 0 {
			continue // the ReadyEvent
		}
		if i > 0 && len(r.GetPing().GetPayload()) != payload || i == 0 && r.GetStep() == nil {
			t.Fatalf("reply %d: %v", i, r.GetReply())
		}
		i++
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
}

// TestFileGetFIFO is issue #12 item 9's FIFO: file_get on a named pipe
// used to block the session's executor until a writer came (forever). It is
// refused at once (FAILED_PRECONDITION) and the session goes on.
func TestFileGetFIFO(t *testing.T) {
	h := newHarness(t)
	c := h.session(aciToken)
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	r, err := c.Call(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_FileGet{FileGet: &aciv1.FileGetRequest{Path: fifo}}})
	if err != nil {
		t.Fatalf("file_get on a FIFO did not answer: %v", err)
	}
	wantCode(t, r, aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION)
	if !strings.Contains(r.GetError().GetMessage(), "FIFO") || r.GetError().GetField() != "file_get.path" {
		t.Errorf("error %v", r.GetError())
	}
	if r := call(t, c, ping(nil)); r.GetPing() == nil {
		t.Fatalf("session after the FIFO: %v", r)
	}
}

// A local client sends its Hello right behind the upgrade request
// (api/aci's local dials; aci-spec section 3): guestd reads it as the
// session's first message, and a refused upgrade leaves it unread.
func TestHelloWithUpgrade(t *testing.T) {
	h := newHarness(t)
	sock := filepath.Join(t.TempDir(), "aci.sock")
	ln, err := Listen(context.Background(), "unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go h.srv.Serve(ln)
	s, err := aciclient.DialUnix(tctx(t), sock, aciToken)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Welcome().GetSandboxId() != "sb-1" {
		t.Errorf("welcome = %v", s.Welcome())
	}
	if _, err := s.Ping(tctx(t), []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := aciclient.DialUnix(tctx(t), sock, "wrong"); !errors.Is(err, aciclient.ErrPermissionDenied) {
		t.Errorf("wrong token: %v", err)
	}
}
