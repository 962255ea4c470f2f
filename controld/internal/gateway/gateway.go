// Package gateway is controld's ACI gateway: one authenticated WebSocket
// endpoint on the host, GET /v1/sandboxes/{id}/aci, routed to the sandbox's
// guestd unix socket.
//
// It does not terminate the WebSocket. It checks the bearer token against
// the sandbox's current ACI token, dials guestd (package guestsock: inside the
// sandbox's root, following no link it planted), forwards the upgrade request
// and then splices bytes both ways (io.Copy between a TCP and a unix socket
// uses splice(2) on Linux), so the hop costs a few syscalls per message and
// nothing per byte. guestd checks the token again and answers the upgrade
// itself.
package gateway

import (
	"context"
	"crypto/subtle"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/guestsock"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
)

// Router resolves a sandbox id to its guestd (fleet.Manager implements it).
type Router interface {
	Route(id string) (fleet.Route, error)
}

// Gateway is an http.Handler serving the ACI route. Shutdown closes every
// spliced connection.
type Gateway struct {
	router      Router
	log         *slog.Logger
	dialTimeout time.Duration
	mux         *http.ServeMux

	mu     sync.Mutex
	conns  map[io.Closer]string // -> sandbox id
	closed bool
	wg     sync.WaitGroup
}

// New returns a gateway over router.
func New(router Router, log *slog.Logger) *Gateway {
	if log == nil {
		log = slog.Default()
	}
	g := &Gateway{router: router, log: log, dialTimeout: 5 * time.Second, conns: map[io.Closer]string{}}
	g.mux = http.NewServeMux()
	g.mux.HandleFunc("GET /v1/sandboxes/{id}/aci", g.serveACI)
	return g
}

func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) { g.mux.ServeHTTP(w, r) }

func bearer(r *http.Request) string {
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return ""
	}
	return strings.TrimSpace(tok)
}

func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, part := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(part), token) {
				return true
			}
		}
	}
	return false
}

func (g *Gateway) serveACI(w http.ResponseWriter, r *http.Request) {
	if !headerHasToken(r.Header, "Connection", "upgrade") || !headerHasToken(r.Header, "Upgrade", "websocket") {
		w.Header().Set("Upgrade", "websocket")
		http.Error(w, "a WebSocket upgrade is required", http.StatusUpgradeRequired)
		return
	}
	id := r.PathValue("id")
	route, err := g.router.Route(id)
	if err != nil {
		switch {
		case errors.Is(err, errdefs.ErrNotFound):
			http.Error(w, err.Error(), http.StatusNotFound)
		case errors.Is(err, errdefs.ErrUnavailable):
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		default:
			http.Error(w, err.Error(), http.StatusConflict)
		}
		return
	}
	tok := bearer(r)
	if tok == "" || subtle.ConstantTimeCompare([]byte(tok), []byte(route.Token)) != 1 {
		w.Header().Set("WWW-Authenticate", `Bearer realm="forkfleet-aci"`)
		http.Error(w, "missing or invalid bearer token", http.StatusUnauthorized)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, "connection cannot be taken over", http.StatusInternalServerError)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), g.dialTimeout)
	up, err := guestsock.Dial(ctx, route.ACISocket) // never a plain path into the sandbox
	cancel()
	if err != nil {
		http.Error(w, "guestd unreachable: "+err.Error(), http.StatusBadGateway)
		return
	}
	// guestd serves the ACI at its own path; everything else goes as is.
	out := r.Clone(context.Background())
	out.URL.Path = aci.DefaultUnixPath
	out.URL.RawPath = ""
	out.RequestURI = ""
	if err := out.Write(up); err != nil {
		up.Close()
		http.Error(w, "forward upgrade: "+err.Error(), http.StatusBadGateway)
		return
	}
	down, buf, err := hj.Hijack()
	if err != nil {
		up.Close()
		g.log.Error("gateway hijack", "sandbox", id, "err", err)
		return
	}
	// The server may have armed read/write deadlines for the request.
	down.SetDeadline(time.Time{})
	if tc, ok := down.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	var first []byte
	if n := buf.Reader.Buffered(); n > 0 {
		first, _ = buf.Reader.Peek(n)
	}
	if !g.track(id, down, up) {
		down.Close()
		up.Close()
		return
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		defer g.untrack(down, up)
		splice(down, up, first)
	}()
}

// splice copies both ways until either side ends, then closes both.
func splice(down, up net.Conn, first []byte) {
	done := make(chan struct{}, 2)
	go func() {
		if len(first) > 0 {
			if _, err := up.Write(first); err != nil {
				done <- struct{}{}
				return
			}
		}
		io.Copy(up, down) // TCPConn.WriteTo: splice(2) into the unix socket
		done <- struct{}{}
	}()
	go func() {
		io.Copy(down, up) // TCPConn.ReadFrom: splice(2) from the unix socket
		done <- struct{}{}
	}()
	<-done
	down.Close()
	up.Close()
	<-done
}

func (g *Gateway) track(id string, cs ...io.Closer) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	for _, c := range cs {
		g.conns[c] = id
	}
	return true
}

// DropSandbox closes every gateway connection to one sandbox and returns
// how many agent connections it closed. controld calls it before freezing a
// sandbox for a checkpoint: CRIU cannot dump a unix socket whose peer (this
// gateway) is outside the sandbox. Agents reconnect.
func (g *Gateway) DropSandbox(id string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for c, cid := range g.conns {
		if cid == id {
			c.Close()
			n++
		}
	}
	return n / 2 // each connection is tracked as its two ends
}

func (g *Gateway) untrack(cs ...io.Closer) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range cs {
		delete(g.conns, c)
	}
}

// Shutdown closes every spliced connection and waits for the copiers, or
// until ctx ends. Stop the HTTP server first so no new ones start.
func (g *Gateway) Shutdown(ctx context.Context) error {
	g.mu.Lock()
	g.closed = true
	for c := range g.conns {
		c.Close()
	}
	g.mu.Unlock()
	done := make(chan struct{})
	go func() { g.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Serve runs an HTTP server for the gateway on ln until Shutdown.
type Server struct {
	g   *Gateway
	srv *http.Server
}

// NewServer wraps g in an http.Server with sane header timeouts.
func NewServer(g *Gateway) *Server {
	return &Server{g: g, srv: &http.Server{
		Handler:           g,
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(g.log.Handler(), slog.LevelWarn),
	}}
}

// Serve accepts connections on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	err := s.srv.Serve(tcpNoDelay{ln})
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown stops accepting, then closes spliced connections.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	return errors.Join(err, s.g.Shutdown(ctx))
}

// tcpNoDelay sets TCP_NODELAY on accepted connections (Go does by default;
// explicit because the hop's latency depends on it).
type tcpNoDelay struct{ net.Listener }

func (l tcpNoDelay) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetNoDelay(true)
		}
	}
	return c, err
}
