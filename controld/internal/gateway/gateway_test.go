package gateway_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/aci/acitest"
	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/guestsock"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
	"github.com/forkfleet/forkfleet/controld/internal/gateway"
)

type router map[string]routed

// routed is a sandbox the router knows. One with err set cannot be routed
// now (checkpointing, stopped): like fleet.Manager, the router then answers
// with its token and the error.
type routed struct {
	fleet.Route
	err error
}

func (r router) Route(id string) (fleet.Route, error) {
	rt, ok := r[id]
	if !ok {
		return fleet.Route{}, errdefs.WithReason(errdefs.ErrNotFound, "SANDBOX_NOT_FOUND", "sandbox %s not found", id)
	}
	if rt.err != nil {
		return fleet.Route{Token: rt.Token}, rt.err
	}
	return rt.Route, nil
}

type fixture struct {
	gw     *gateway.Gateway
	guest  *acitest.Server
	sock   string
	gwURL  string
	srv    *gateway.Server
	ln     net.Listener
	direct string
}

const token = "agent-token"

func setup(tb testing.TB) *fixture { return setupWith(tb, nil, gateway.Options{}) }

// setupWith serves a gateway with opts routing sb-aaaaaaaaaaaaaaaa to an
// acitest guestd, and the sandboxes of extra.
func setupWith(tb testing.TB, extra router, opts gateway.Options) *fixture {
	tb.Helper()
	dir, err := os.MkdirTemp("", "gw")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "aci.sock")
	guest, err := acitest.NewUnixServer(sock)
	if err != nil {
		tb.Fatal(err)
	}
	guest.Token = token
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr, err := guestsock.Self(sock)
	if err != nil {
		tb.Fatal(err)
	}
	rt := router{"sb-aaaaaaaaaaaaaaaa": {Route: fleet.Route{Token: token, ACISocket: addr}}}
	for id, r := range extra {
		rt[id] = r
	}
	g := gateway.New(rt, opts)
	srv := gateway.NewServer(g)
	go srv.Serve(ln)
	f := &fixture{gw: g, guest: guest, sock: sock, srv: srv, ln: ln,
		gwURL: fmt.Sprintf("ws://%s/v1/sandboxes/sb-aaaaaaaaaaaaaaaa/aci", ln.Addr())}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		guest.Close()
		// Let the acitest handlers see their sockets close.
		time.Sleep(10 * time.Millisecond)
	})
	return f
}

func TestGatewayForwardsAndAuthenticates(t *testing.T) {
	// Registered first, so it runs after the fixture's cleanups.
	t.Cleanup(func() { goleak.VerifyNone(t) })
	f := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	s, err := aci.Dial(ctx, f.gwURL, token)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Ping(ctx, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if err := s.PutFile(ctx, "/tmp/x", make([]byte, 3<<20)); err != nil {
		t.Fatalf("large transfer through the gateway: %v", err)
	}
	got, err := s.GetFile(ctx, "/tmp/x")
	if err != nil || len(got) != 3<<20 {
		t.Fatalf("get through gateway: %d %v", len(got), err)
	}
	// Events pushed by guestd arrive through the splice.
	evs := s.Events(ctx)
	f.guest.SetReady(true)
	select {
	case ev := <-evs:
		if ev.GetReady() == nil {
			t.Fatalf("event %v", ev)
		}
	case <-ctx.Done():
		t.Fatal("no pushed event through the gateway")
	}
	s.Close()

	if _, err := aci.Dial(ctx, f.gwURL, "wrong"); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Fatalf("wrong token: %v", err)
	}
	// An unknown sandbox looks like a wrong token (TestGatewayTokenBeforeLookup).
	bad := fmt.Sprintf("ws://%s/v1/sandboxes/sb-bbbbbbbbbbbbbbbb/aci", f.ln.Addr())
	if _, err := aci.Dial(ctx, bad, token); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Fatalf("unknown sandbox: %v", err)
	}
	resp, err := http.Get(fmt.Sprintf("http://%s/v1/sandboxes/sb-aaaaaaaaaaaaaaaa/aci", f.ln.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUpgradeRequired {
		t.Fatalf("plain GET: %d", resp.StatusCode)
	}
	// guestd going away closes the client side too.
	s2, err := aci.Dial(ctx, f.gwURL, token)
	if err != nil {
		t.Fatal(err)
	}
	f.guest.DropConnections()
	select {
	case <-s2.Done():
	case <-time.After(2 * time.Second):
		if _, err := s2.Ping(ctx, nil); err == nil {
			t.Fatal("session still works after guestd dropped it")
		}
	}
	s2.Close()

	// A checkpoint drops the sandbox's connections.
	s3, err := aci.Dial(ctx, f.gwURL, token)
	if err != nil {
		t.Fatal(err)
	}
	if n := f.gw.DropSandbox("sb-aaaaaaaaaaaaaaaa"); n != 1 {
		t.Fatalf("DropSandbox closed %d connections, want 1", n)
	}
	if _, err := s3.Ping(ctx, nil); err == nil {
		t.Fatal("session survived DropSandbox")
	}
	s3.Close()
	http.DefaultClient.CloseIdleConnections()
}

// benchPing measures ping round trips over one session and reports p50/p99.
func benchPing(b *testing.B, dial func(ctx context.Context) (*aci.Session, error)) {
	ctx := context.Background()
	s, err := dial(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for range 200 { // warm up
		s.Ping(ctx, nil)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if _, err := s.Ping(ctx, nil); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
}

func BenchmarkPingDirectUnix(b *testing.B) {
	f := setup(b)
	benchPing(b, func(ctx context.Context) (*aci.Session, error) { return aci.DialUnix(ctx, f.sock, token) })
}

func BenchmarkPingThroughGateway(b *testing.B) {
	f := setup(b)
	benchPing(b, func(ctx context.Context) (*aci.Session, error) { return aci.Dial(ctx, f.gwURL, token) })
}

// BenchmarkPingThroughGatewayTLS is the hop with TLS (wss://): the splice
// then copies through TLS in user space.
func BenchmarkPingThroughGatewayTLS(b *testing.B) {
	certs := acitest.NewCerts(b)
	f := setupWith(b, nil, gateway.Options{TLS: certs.ServerConfig(false)})
	wss := "wss://" + strings.TrimPrefix(f.gwURL, "ws://")
	benchPing(b, func(ctx context.Context) (*aci.Session, error) {
		return aci.Dial(ctx, wss, token, aci.WithTLSConfig(certs.ClientConfig(false)))
	})
}

// BenchmarkPingDirectTCP is the fair baseline for the gateway: the same
// client over loopback TCP to a guestd listening on TCP (no second hop).
func BenchmarkPingDirectTCP(b *testing.B) {
	guest := acitest.NewServer()
	guest.Token = token
	defer guest.Close()
	benchPing(b, func(ctx context.Context) (*aci.Session, error) { return aci.Dial(ctx, guest.URL(), token) })
}
