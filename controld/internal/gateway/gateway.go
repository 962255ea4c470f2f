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
//
// The token is checked before anything about the sandbox is revealed: an
// unknown id and a known one with a wrong token get the same 401 after the
// same work. Connections that have not upgraded yet are bounded in time and
// number (api/connlimit), spliced sessions in number (Options.MaxSessions).
package gateway

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/connlimit"
	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/guestsock"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
	"github.com/forkfleet/forkfleet/controld/internal/recording"
)

// Router resolves a sandbox id to its guestd (fleet.Manager implements it).
type Router interface {
	Route(id string) (fleet.Route, error)
}

// Options configure a Gateway and its Server; zero values take defaults.
type Options struct {
	Log *slog.Logger
	// Limits bound connections before their upgrade (header and idle
	// timeouts, a cap on connections still in HTTP).
	Limits connlimit.Limits
	// MaxSessions caps spliced connections; an upgrade past it gets 429.
	// DefaultMaxSessions when 0.
	MaxSessions int
	// TLS, when set, makes the Server serve TLS (wss://). Set ClientAuth
	// and ClientCAs in it to require client certificates.
	TLS *tls.Config
	// Registerer, when set, gets the gateway's metrics (metrics.go).
	Registerer prometheus.Registerer
	// ViewSessions, when set, is the file that keeps the live view's
	// cookies across restarts (their SHA-256, grant and expiry only;
	// view.go). In memory only when empty.
	ViewSessions string
	// Downloads, when set, serves recordings' files to their tickets
	// (download.go).
	Downloads Downloads
}

// DefaultMaxSessions bounds spliced connections (each holds two sockets
// and two goroutines).
const DefaultMaxSessions = 8192

// Gateway is an http.Handler serving the ACI route. Shutdown closes every
// spliced connection.
type Gateway struct {
	router      Router
	log         *slog.Logger
	opts        Options
	dialTimeout time.Duration
	mux         *http.ServeMux
	// unknownToken stands in for the token of a sandbox that is not there,
	// so rejecting its callers costs the same as rejecting a wrong token.
	unknownToken string

	mu       sync.Mutex
	conns    map[io.Closer]string // -> sandbox id
	ports    portConns            // upstream connections of exposed ports (ports.go)
	sessions int                  // spliced connections (each is two conns)
	closed   bool
	wg       sync.WaitGroup
	hubs     map[string]*hub // the live view's shared screencasts (hub.go)
	// taps are the recorded sandboxes: their new ACI connections are read
	// as they pass (Record, package recording).
	taps map[string]recording.Sink

	views viewSessions // redeemed view tickets (view.go)

	metrics metrics
}

// New returns a gateway over router.
func New(router Router, opts Options) *Gateway {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.MaxSessions <= 0 {
		opts.MaxSessions = DefaultMaxSessions
	}
	g := &Gateway{router: router, log: opts.Log, opts: opts, dialTimeout: 5 * time.Second, conns: map[io.Closer]string{},
		hubs: map[string]*hub{}, taps: map[string]recording.Sink{}, unknownToken: rand.Text()}
	g.register(opts.Registerer)
	g.views.path, g.views.log = opts.ViewSessions, opts.Log
	if opts.ViewSessions != "" {
		if err := g.views.load(); err != nil {
			// A file controld wrote that it cannot read: its cookies are
			// lost (viewers need a new ticket), nothing else.
			opts.Log.Warn("view: view sessions not restored", "path", opts.ViewSessions, "err", err)
		}
	}
	g.mux = http.NewServeMux()
	g.mux.HandleFunc("GET /v1/sandboxes/{id}/aci", g.counted("aci", g.serveACI))
	if vr, ok := router.(ViewRouter); ok {
		g.mux.HandleFunc("GET /v1/sandboxes/{id}/view", g.counted("view", g.serveView(vr)))
		g.mux.HandleFunc("GET /v1/sandboxes/{id}/view/stream", g.counted("view", g.serveViewStream))
		g.mux.HandleFunc("GET /v1/view.js", serveViewJS)
	}
	if opts.Downloads != nil {
		g.mux.HandleFunc("GET /v1/recordings/{id}/files/{name}", g.counted("recording", g.serveDownload))
	}
	if pr, ok := router.(PortRouter); ok {
		g.mux.HandleFunc("/v1/sandboxes/{id}/ports/{port}/", g.counted("port", g.servePort(pr)))
	}
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
	// The token first: whether the id exists and what state it is in is
	// for the token's holder only.
	route, err := g.router.Route(id)
	if !g.authorized(bearer(r), route.Token) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="forkfleet-aci"`)
		http.Error(w, "missing or invalid bearer token", http.StatusUnauthorized)
		return
	}
	if err != nil {
		switch {
		case errors.Is(err, errdefs.ErrNotFound):
			http.Error(w, err.Error(), http.StatusNotFound)
		case errors.Is(err, errdefs.ErrUnavailable):
			w.Header().Set("Retry-After", "1")
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		default:
			http.Error(w, err.Error(), http.StatusConflict)
		}
		return
	}
	if !g.reserveSession() {
		w.Header().Set("Retry-After", "1")
		http.Error(w, fmt.Sprintf("the gateway holds %d sessions, its limit", g.opts.MaxSessions), http.StatusTooManyRequests)
		return
	}
	spliced := false
	defer func() {
		if !spliced {
			g.releaseSession()
		}
	}()
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
	// A checkpoint that began after the Route above dropped the sandbox's
	// connections before this one was tracked: the route says so now.
	if _, err := g.router.Route(id); err != nil {
		g.untrack(down, up)
		down.Close()
		up.Close()
		return
	}
	// A recorded sandbox's connection is read as it passes (the trajectory);
	// the bytes go through unchanged.
	var tap recording.Sink
	g.mu.Lock()
	tap = g.taps[id]
	g.mu.Unlock()
	spliced = true
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		defer g.releaseSession()
		defer g.untrack(down, up)
		if tap == nil {
			splice(down, up, first, nil, nil)
			return
		}
		client, server, done := tap.TapACI()
		defer done()
		splice(down, up, first, client, server)
	}()
}

// authorized compares the presented token with want (the sandbox's token,
// empty for an unknown sandbox) in constant time: SHA-256 digests of both
// sides, so neither the length nor the existence of want shows in the time
// taken.
func (g *Gateway) authorized(presented, want string) bool {
	ok := presented != "" && want != ""
	if want == "" {
		want = g.unknownToken
	}
	p, w := sha256.Sum256([]byte(presented)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(p[:], w[:]) == 1 && ok
}

// reserveSession takes one of MaxSessions; releaseSession gives it back.
func (g *Gateway) reserveSession() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.sessions >= g.opts.MaxSessions {
		return false
	}
	g.sessions++
	return true
}

func (g *Gateway) releaseSession() {
	g.mu.Lock()
	g.sessions--
	g.mu.Unlock()
}

// Sessions is how many connections are spliced now.
func (g *Gateway) Sessions() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.sessions
}

// splice copies both ways until either side ends, then closes both. When
// tapped (a recording), tapDown sees the client's bytes and tapUp guestd's,
// at the cost of a copy through user space.
func splice(down, up net.Conn, first []byte, tapDown, tapUp io.Writer) {
	done := make(chan struct{}, 2)
	var from, back io.Reader = down, up
	if tapDown != nil {
		from, back = io.TeeReader(down, tapDown), io.TeeReader(up, tapUp)
	}
	go func() {
		if len(first) > 0 {
			if _, err := up.Write(first); err != nil {
				done <- struct{}{}
				return
			}
			if tapDown != nil {
				tapDown.Write(first)
			}
		}
		io.Copy(up, from) // TCPConn.WriteTo: splice(2) into the unix socket
		done <- struct{}{}
	}()
	go func() {
		io.Copy(down, back) // TCPConn.ReadFrom: splice(2) from the unix socket
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
// gateway) is outside the sandbox. Agents reconnect. The caller makes the
// router refuse the sandbox first: a connection being made as DropSandbox
// runs asks the router again once it is tracked, and closes.
func (g *Gateway) DropSandbox(id string) int {
	g.ports.drop(id)
	g.mu.Lock()
	h := g.hubs[id]
	g.mu.Unlock()
	if h != nil {
		h.drop() // its viewers stay; it redials after the checkpoint
	}
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
	g.ports.drop("")
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

// Server runs an HTTP server for the gateway until Shutdown.
type Server struct {
	g          *Gateway
	srv        *http.Server
	handshakes *connlimit.Tracker
}

// NewServer wraps g in an http.Server with g's connection limits.
func NewServer(g *Gateway) *Server {
	srv := &http.Server{
		Handler:  g,
		ErrorLog: slog.NewLogLogger(g.log.Handler(), slog.LevelWarn),
	}
	s := &Server{g: g, srv: srv, handshakes: connlimit.Apply(srv, g.opts.Limits)}
	s.register(g.opts.Registerer)
	return s
}

// Handshakes counts connections that have not upgraded yet.
func (s *Server) Handshakes() *connlimit.Tracker { return s.handshakes }

// Serve accepts connections on ln until Shutdown, over TLS when the
// gateway has a TLS config.
func (s *Server) Serve(ln net.Listener) error {
	ln = tcpNoDelay{ln}
	if cfg := s.g.opts.TLS; cfg != nil {
		// HTTP/1.1 only: a WebSocket upgrade hijacks the connection, which
		// HTTP/2 cannot.
		cfg = cfg.Clone()
		cfg.NextProtos = []string{"http/1.1"}
		ln = tls.NewListener(ln, cfg)
	}
	err := s.srv.Serve(ln)
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
