package app_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/aci/acitest"
	"github.com/forkfleet/forkfleet/api/client"
	"github.com/forkfleet/forkfleet/api/connlimit"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/guestsock"
	"github.com/forkfleet/forkfleet/api/screencast"
	"github.com/forkfleet/forkfleet/controld/internal/config"
)

// TestRealStackWire attacks the wire of a real sandbox (issue #12 items 7,
// 9, 10, 11): controld on the real stack in its own namespace
// (forkfleet-wire-it, see testenv) with TLS on its gRPC TCP listener and
// gateway (certificates made here, a client CA), short gateway timeouts,
// and one desktop sandbox.
func TestRealStackWire(t *testing.T) {
	s := newStackIn(t, "forkfleet-wire-it")
	certs := acitest.NewCerts(t)
	dir := certs.WriteFiles(t, t.TempDir())
	s.cfg.TLS = config.TLS{CertFile: dir + "/server.pem", KeyFile: dir + "/server-key.pem", ClientCAFile: dir + "/ca.pem"}
	const gwTimeout, gwHandshakes = time.Second, 32
	s.cfg.Gateway.HeaderTimeout, s.cfg.Gateway.IdleTimeout = config.Duration(gwTimeout), config.Duration(gwTimeout)
	s.cfg.Gateway.MaxHandshakes = gwHandshakes
	s.launch(0)
	ctx := s.ctx
	cr, err := s.sbc.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { s.sbc.DeleteSandbox(context.Background(), &controldv1.DeleteSandboxRequest{Id: cr.Sandbox.Id}) })
	ep := cr.Endpoint
	if !strings.HasPrefix(ep.Url, "wss://") {
		t.Fatalf("endpoint %s of a TLS gateway", ep.Url)
	}
	clientTLS := certs.ClientConfig(true)
	sess, err := aci.Dial(ctx, ep.Url, ep.Token, aci.WithTLSConfig(clientTLS))
	if err != nil {
		t.Fatalf("ACI through the TLS gateway: %v", err)
	}
	defer sess.Close()

	t.Run("TLS", func(t *testing.T) {
		c, err := client.Dial(ctx, s.addrs.GRPCTCP, client.WithToken(s.addrs.Token), client.WithTLS(clientTLS))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		sb, err := c.GetSandbox(ctx, cr.Sandbox.Id)
		if err != nil {
			t.Fatalf("gRPC over mutual TLS: %v", err)
		}
		s2, err := sb.ACI(ctx, client.ViaGateway())
		if err != nil {
			t.Fatalf("client's ACI through the gateway: %v", err)
		}
		s2.Close()
		if _, err := aci.Dial(ctx, ep.Url, ep.Token, aci.WithTLSConfig(certs.ClientConfig(false))); err == nil {
			t.Error("gateway session without a client certificate")
		}
		if _, err := aci.Dial(ctx, strings.Replace(ep.Url, "wss://", "ws://", 1), ep.Token); err == nil {
			t.Error("plaintext session to the TLS gateway")
		}
	})

	// Item 7: without the token, an existing id and an unknown one look the
	// same.
	t.Run("TokenBeforeLookup", func(t *testing.T) {
		addr := strings.TrimPrefix(strings.SplitN(ep.Url, "/v1/", 2)[0], "wss://")
		upgrade := func(id, auth string) string {
			c, err := tls.Dial("tcp", addr, clientTLS)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			req, _ := http.NewRequest("GET", "https://"+addr+"/v1/sandboxes/"+id+"/aci", nil)
			req.Header.Set("Connection", "Upgrade")
			req.Header.Set("Upgrade", "websocket")
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			req.Write(c)
			resp, err := http.ReadResponse(bufio.NewReader(c), req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			return fmt.Sprintf("%d %s %q", resp.StatusCode, resp.Header.Get("WWW-Authenticate"), body)
		}
		want := upgrade("sb-zzzzzzzzzzzzzzzz", "")
		if !strings.HasPrefix(want, "401 ") {
			t.Fatalf("unknown id without a token: %s", want)
		}
		for _, id := range []string{cr.Sandbox.Id, "sb-zzzzzzzzzzzzzzzz"} {
			for _, auth := range []string{"", "Bearer wrong", "Bearer " + s.addrs.Token} {
				if got := upgrade(id, auth); got != want {
					t.Errorf("%s with %q: %s, unknown without a token: %s", id, auth, got, want)
				}
			}
		}
	})

	// Item 9: connections that never authenticate do not stay, on the
	// gateway (TLS handshakes, keep-alive requests, silence) nor on guestd
	// inside the sandbox.
	t.Run("IdleConnections", func(t *testing.T) {
		addr := strings.TrimPrefix(strings.SplitN(ep.Url, "/v1/", 2)[0], "wss://")
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for i := range 200 {
			if i%2 == 0 {
				c, err := net.Dial("tcp", addr) // silent: no TLS hello
				if err != nil {
					t.Fatal(err)
				}
				conns = append(conns, c)
				continue
			}
			c, err := tls.Dial("tcp", addr, clientTLS)
			if err != nil {
				continue // closed as the oldest handshake while it shook hands
			}
			fmt.Fprintf(c, "GET /v1/sandboxes/%s/aci HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n", cr.Sandbox.Id)
			conns = append(conns, c)
		}
		waitClosed(t, "gateway", conns, gwTimeout+3*time.Second)

		// guestd: its own defaults (5 s, 128 handshakes), reached the way
		// controld reaches it.
		addrG, err := guestsock.Parse(ep.UnixPath, ep.UnixPidStart)
		if err != nil {
			t.Fatal(err)
		}
		conns = conns[:0]
		start := time.Now()
		for i := range 200 {
			c, err := guestsock.Dial(ctx, addrG)
			if err != nil {
				t.Fatal(err)
			}
			if i%2 == 1 {
				fmt.Fprintf(c, "GET /aci HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
			}
			conns = append(conns, c)
		}
		// The 72 oldest make room for the newest at once.
		early := 0
		for _, c := range conns[:200-connlimit.DefaultMaxHandshakes] {
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			if _, err := io.Copy(io.Discard, c); !isTimeout(err) {
				early++
			}
		}
		if n := early; n < 200-connlimit.DefaultMaxHandshakes {
			t.Errorf("guestd closed %d of the %d oldest handshakes at once", n, 200-connlimit.DefaultMaxHandshakes)
		}
		waitClosed(t, "guestd", conns, connlimit.DefaultIdleTimeout+3*time.Second-time.Since(start))
		if _, err := sess.Ping(ctx, nil); err != nil {
			t.Fatalf("session after the floods: %v", err)
		}
	})

	// Item 9: one session's queued requests hold no more than its budget:
	// behind a slow request, guestd stops reading and TCP pushes back.
	t.Run("SessionByteBudget", func(t *testing.T) {
		addrG, err := guestsock.Parse(ep.UnixPath, ep.UnixPidStart)
		if err != nil {
			t.Fatal(err)
		}
		direct, err := aci.DialSandbox(ctx, addrG, ep.Token)
		if err != nil {
			t.Fatal(err)
		}
		defer direct.Close()
		const n, payload = 48, 8 << 20
		slow, err := direct.Start(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Exec{Exec: &aciv1.ExecRequest{Argv: []string{"sleep", "3"}}}})
		if err != nil {
			t.Fatal(err)
		}
		var written atomic.Int32
		calls := make(chan *aci.Call, n)
		go func() {
			defer close(calls)
			for range n {
				call, err := direct.Start(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_Ping{Ping: &aciv1.PingRequest{Payload: make([]byte, payload)}}})
				if err != nil {
					t.Error(err)
					return
				}
				written.Add(1)
				calls <- call
			}
		}()
		time.Sleep(2 * time.Second)
		// 64 MiB of budget is 8 requests; one more decoded and waiting, and
		// what the socket buffers hold.
		if w := written.Load(); w > 12 {
			t.Errorf("guestd read %d requests of 8 MiB behind a slow one", w)
		}
		t.Logf("requests written while the first ran: %d of %d", written.Load(), n)
		if _, err := slow.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		got := 0
		for call := range calls {
			r, err := call.Wait(ctx)
			if err != nil || len(r.GetPing().GetPayload()) != payload {
				t.Fatalf("reply %d: %v", got, err)
			}
			got++
		}
		if got != n {
			t.Fatalf("%d of %d replies", got, n)
		}
		if r, err := direct.Run(ctx, "grep", "VmHWM", "/proc/1/status"); err == nil {
			t.Logf("guestd peak RSS: %s", strings.TrimSpace(string(r.GetStdout())))
		}
	})

	// Item 9: file_get on a FIFO the sandbox made answers at once.
	t.Run("FIFO", func(t *testing.T) {
		if r, err := sess.Run(ctx, "mkfifo", "/tmp/forkfleet-fifo"); err != nil || r.GetExitCode() != 0 {
			t.Fatalf("mkfifo: %v %s", err, r.GetStderr())
		}
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := sess.GetFile(fctx, "/tmp/forkfleet-fifo")
		if aci.Code(err) != aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION {
			t.Fatalf("file_get on a FIFO: %v", err)
		}
		if _, err := sess.Ping(ctx, nil); err != nil {
			t.Fatalf("session after the FIFO: %v", err)
		}
	})

	// Item 10: the reference client's bounds take the real guestd's frames
	// (keyframe, typing deltas in zlib records) at the sandbox's size.
	t.Run("ScreencastWithinBounds", func(t *testing.T) {
		sc, err := aci.Dial(ctx, ep.Url, ep.Token, aci.WithTLSConfig(clientTLS))
		if err != nil {
			t.Fatal(err)
		}
		defer sc.Close()
		screen := cr.Sandbox.GetScreen()
		comp := screencast.NewCompositor(screencast.RGBA, screencast.WithMaxFrame(int(screen.GetWidth()), int(screen.GetHeight())))
		events := sc.Events(ctx)
		id, err := sc.ScreencastStart(ctx, &aciv1.ScreencastStartRequest{Delta: true, Fps: 30})
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.After(20 * time.Second)
		applyUntil := func(frames uint64) {
			for comp.Stats().Frames < frames {
				select {
				case ev := <-events:
					if f := ev.GetFrame(); f != nil && f.GetStreamId() == id {
						if err := comp.Apply(f); err != nil {
							t.Fatalf("frame %d: %v", f.GetSeq(), err)
						}
					}
				case <-deadline:
					t.Fatalf("frames applied: %+v", comp.Stats())
				}
			}
		}
		applyUntil(1) // the keyframe
		if _, err := sc.Step(ctx, []*aciv1.Action{aci.Type("echo forkfleet")}, nil); err != nil {
			t.Fatal(err)
		}
		applyUntil(2) // the typing
		t.Logf("screencast: %+v", comp.Stats())
	})
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// waitClosed checks that the server closes every connection within d.
func waitClosed(t *testing.T, what string, conns []net.Conn, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for i, c := range conns {
		c.SetReadDeadline(deadline)
		if _, err := io.Copy(io.Discard, c); isTimeout(err) {
			t.Fatalf("%s: connection %d of %d still open after %v", what, i, len(conns), d)
		}
	}
}
