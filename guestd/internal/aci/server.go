// Package aci serves the Agent-Computer Interface over WebSocket: auth on
// the upgrade, the hello handshake, one in-order executor per session with
// pipelining, and the request handlers. The wire format is
// forkfleet.aci.v1 (api/gen/forkfleet/aci/v1); docs/aci-spec.md is the
// specification.
package aci

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"image"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/forkfleet/forkfleet/api/connlimit"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/a11y"
	"github.com/forkfleet/forkfleet/guestd/internal/fscred"
	"github.com/forkfleet/forkfleet/guestd/internal/ready"
	"github.com/forkfleet/forkfleet/guestd/internal/screencast"
	"github.com/forkfleet/forkfleet/guestd/internal/sysops"
)

// closeHandshakeGrace is how long Shutdown lets clients answer the close
// frame before dropping their connections.
const closeHandshakeGrace = 500 * time.Millisecond

// Session bounds (Options).
const (
	DefaultMaxSessions     = 64
	DefaultMaxSessionBytes = 64 << 20
	DefaultHelloTimeout    = 10 * time.Second
	// DefaultScratchIdle is how long the capture buffers stay unused before
	// guestd gives their pages back (ScratchReleaser): an idle sandbox, or a
	// replica nobody has looked at since its fork was verified, should hold
	// state, not 4 MB of SysV scratch per 1280x800 screen that KSM cannot
	// merge. An agent that captures more often than this keeps them.
	DefaultScratchIdle = 10 * time.Second
	// adminSessions is the admin token's own reserve: controld opens one or
	// two per sandbox (readiness, checkpoints).
	adminSessions = 16
)

// Wire constants.
const (
	ProtocolVersion   = 1
	SubprotocolBinary = "forkfleet.aci.v1"
	SubprotocolJSON   = "forkfleet.aci.v1+json"
)

// Options configure a Server.
type Options struct {
	// ACIToken and AdminToken authenticate the upgrade. Both empty requires
	// InsecureNoAuth (every session is then admin).
	ACIToken       string
	AdminToken     string
	InsecureNoAuth bool

	SandboxID     string
	ServerVersion string
	// MaxMessageBytes is the read limit per ClientMessage (advertised).
	MaxMessageBytes int64
	// MaxSessions caps concurrent sessions of the agent token (and of
	// InsecureNoAuth); admin sessions have adminSessions of their own, so
	// agents can never lock controld out. DefaultMaxSessions when 0.
	MaxSessions int
	// MaxSessionBytes bounds what one session holds in each direction
	// (requests read and not yet executed, replies not yet written); past
	// it the session stops reading, or its executor waits for the writer.
	// DefaultMaxSessionBytes when 0.
	MaxSessionBytes int64
	// Conn bounds connections before their upgrade (connlimit defaults
	// when zero).
	Conn connlimit.Limits
	// HelloTimeout closes a session that has not said hello this long
	// after its upgrade; DefaultHelloTimeout when 0.
	HelloTimeout time.Duration

	// Runner and Files serve exec/launch and the file requests; nil
	// disables them (not advertised, UNIMPLEMENTED).
	Runner *sysops.Runner
	Files  *sysops.Files
	// AgentFiles is who agent sessions' file requests act as (the image's
	// unprivileged user, so the kernel checks them as it and what they
	// create is its); admin sessions act as guestd. Zero: guestd for both.
	AgentFiles fscred.Cred

	// EntropySink receives RestoredRequest.entropy; /dev/urandom when empty.
	EntropySink string

	// Ready is the image's definition of usable beyond X, the window
	// manager and the painted root (nil: nothing more).
	Ready *ready.Conditions

	// SandboxCPU returns the CPU time the sandbox's other processes have
	// used so far. Checkpoint settling then also waits until nothing in the
	// sandbox runs (a shell about to print its prompt draws no damage yet).
	// nil: damage and drawing requests only (guestd not the sandbox's init).
	SandboxCPU func() (time.Duration, error)

	// ScratchIdle: the desktop's capture buffers go back to the kernel once
	// no capture used them for this long (see ScratchReleaser);
	// DefaultScratchIdle when 0, never when negative.
	ScratchIdle time.Duration

	// StopApps stops the session's apps (every process of the sandbox but
	// guestd and the X server) for restored.hold_apps and returns what
	// continues them (supervise.StopOthers). nil: apps are never held.
	StopApps func() (cont func() int)

	// A11y reads and acts on the accessibility tree (a11y_tree,
	// a11y_action, step.observe_tree); nil: not advertised, UNIMPLEMENTED.
	A11y *a11y.Client

	Log *slog.Logger
}

// Server is the ACI server. Create with New, hand the Desktop over with
// SetDesktop once X is up, serve listeners with Serve.
type Server struct {
	opts  Options
	log   *slog.Logger
	start time.Time

	bootID string
	caps   []string

	tokens     atomic.Pointer[tokens]
	generation atomic.Uint64
	sandboxID  atomic.Pointer[string]
	rng        rng

	desk atomic.Pointer[deskBox]
	// provedShot is the last frame proven current by a damage sequence,
	// answered from only under the shotEpoch it was stored in, and only
	// while that is even: checkpoint_prepare makes it odd (the dumped memory
	// must prove nothing to a replica), checkpoint_done and restored make it
	// even again. preparedShot carries the source's frame across.
	provedShot   atomic.Pointer[provedShot]
	preparedShot atomic.Pointer[provedShot]
	shotEpoch    atomic.Uint64
	damage       damageTracker

	mark struct {
		sync.Mutex
		value []byte
	}
	netProbe netProbe // the network verifier's listener (netprobe.go)

	// holdUntil (unix ns, 0: none) refuses agent sessions during a checkpoint.
	holdUntil atomic.Int64
	// grab is the X server grab a checkpoint holds across its dump (see
	// grabForDump).
	grab struct {
		sync.Mutex
		held  ServerGrabber // nil: not grabbed
		timer *time.Timer
		start string // processStart() when grabbed
	}
	// apps continues the apps held since the restore (nil: none held).
	apps struct {
		sync.Mutex
		cont func() int
	}

	mu       sync.Mutex
	sessions map[*session]struct{}
	// admitted counts sessions by role from their upgrade to their end
	// (reserveSession); agent also counts InsecureNoAuth sessions.
	admitted map[Role]int
	ready    *aciv1.ReadyResponse // non-nil once the desktop became ready
	milest   milestones
	closed   bool
	bg       sync.WaitGroup // sessions and watchers
	servers  []*http.Server
	// handshakes track each listener's connections before their upgrade.
	handshakes []*connlimit.Tracker
	nextSess   atomic.Uint64
}

type deskBox struct {
	d      Desktop
	caster *screencast.Caster
	cancel context.CancelFunc
}

// close stops the box's watchers and screencast streams.
func (b *deskBox) close() {
	b.cancel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	b.caster.Close(ctx)
}

// New validates opts and returns a Server.
func New(opts Options) (*Server, error) {
	if opts.ACIToken == "" && !opts.InsecureNoAuth {
		return nil, errors.New("aci: no ACI token (set FORKFLEET_ACI_TOKEN or run with --insecure-no-auth)")
	}
	if opts.MaxMessageBytes <= 0 {
		opts.MaxMessageBytes = 64 << 20
	}
	if opts.MaxSessions <= 0 {
		opts.MaxSessions = DefaultMaxSessions
	}
	if opts.MaxSessionBytes <= 0 {
		opts.MaxSessionBytes = DefaultMaxSessionBytes
	}
	if opts.HelloTimeout <= 0 {
		opts.HelloTimeout = DefaultHelloTimeout
	}
	if opts.ScratchIdle == 0 {
		opts.ScratchIdle = DefaultScratchIdle
	}
	if opts.EntropySink == "" {
		opts.EntropySink = "/dev/urandom"
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	// Aside: the desktop takes longer to come up, and a type a request
	// needs first is built by that request as before.
	go warmCodecs()
	s := &Server{
		opts:     opts,
		log:      opts.Log,
		start:    time.Now(),
		sessions: make(map[*session]struct{}),
		admitted: make(map[Role]int),
	}
	s.damage.base = s.start
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	s.bootID = hex.EncodeToString(b[:])
	if err := s.rng.seed(nil); err != nil {
		return nil, err
	}
	s.tokens.Store(newTokens(opts.ACIToken, opts.AdminToken))
	sid := opts.SandboxID
	s.sandboxID.Store(&sid)
	s.caps = []string{"codec.png", "codec.jpeg", "codec.none", "dedup", "settle", "region", "downscale", "cursor",
		"input", "windows", "clipboard", "events.ready", "cancel", "memory", "checkpoint", "restored.admin_token",
		"apps.hold", "netprobe", "screencast", "screencast.delta", screencast.CapabilityZlib}
	if opts.Runner != nil {
		s.caps = append(s.caps, "exec", "launch")
	}
	if opts.Files != nil {
		s.caps = append(s.caps, "files", "files.chunked")
	}
	if opts.A11y != nil {
		s.caps = append(s.caps, "a11y")
	}
	return s, nil
}

// Capabilities lists what this server advertises in HelloResponse.
func (s *Server) Capabilities() []string { return append([]string(nil), s.caps...) }

// SetDesktop installs (or replaces, after an X restart) the display the
// server acts on, and starts watching it for readiness and damage. nil
// removes it: desktop requests then fail with UNAVAILABLE.
func (s *Server) SetDesktop(d Desktop) {
	var box *deskBox
	if d != nil {
		ctx, cancel := context.WithCancel(context.Background())
		box = &deskBox{d: d, cancel: cancel, caster: screencast.New(d, screencast.Options{Logger: s.log})}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			cancel()
			return
		}
		s.bg.Add(3)
		s.mu.Unlock()
		go func() { defer s.bg.Done(); s.damage.run(ctx, d, s.log) }()
		go func() { defer s.bg.Done(); s.watchReady(ctx, d) }()
		go func() { defer s.bg.Done(); s.releaseIdleScratch(ctx, d) }()
	}
	if old := s.desk.Swap(box); old != nil {
		old.close()
	}
}

func (s *Server) desktop() (Desktop, error) {
	if b := s.desk.Load(); b != nil {
		return b.d, nil
	}
	return nil, errNoDesktop
}

// since is the monotonic time since guestd started.
func (s *Server) since() time.Duration { return time.Since(s.start) }

// broadcast queues an event to every session past its hello.
func (s *Server) broadcast(m *aciv1.ServerMessage) {
	s.mu.Lock()
	targets := make([]*session, 0, len(s.sessions))
	for ss := range s.sessions {
		if ss.welcomed && ss.wantsReadyEvents {
			targets = append(targets, ss)
		}
	}
	s.mu.Unlock()
	for _, ss := range targets {
		ss.send(m)
	}
}

// Serve accepts ACI connections on l until Shutdown.
func (s *Server) Serve(l net.Listener) error {
	hs := &http.Server{
		Handler:     s,
		ConnContext: WithRawConn,
		ErrorLog:    slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	// Anything in the sandbox can connect: what a connection may hold
	// before it authenticates is bounded in time and number.
	tr := connlimit.Apply(hs, s.opts.Conn)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return http.ErrServerClosed
	}
	s.servers = append(s.servers, hs)
	s.handshakes = append(s.handshakes, tr)
	s.mu.Unlock()
	return hs.Serve(l)
}

// Handshakes is how many connections to the served listeners have not
// upgraded to a session (yet).
func (s *Server) Handshakes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, t := range s.handshakes {
		n += t.Handshakes()
	}
	return n
}

type rawConnKey struct{}

// WithRawConn is an http.Server ConnContext that lets sessions reach their
// net.Conn, so a checkpoint can cut connections at once instead of waiting
// out a close handshake.
func WithRawConn(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, rawConnKey{}, c)
}

// Listen opens a listener suitable for checkpointing: multipath TCP off
// (CRIU cannot dump MPTCP sockets). Go enables TCP_NODELAY on accepted
// connections by default, which the small-message round trips rely on.
func Listen(ctx context.Context, network, addr string) (net.Listener, error) {
	var lc net.ListenConfig
	lc.SetMultipathTCP(false)
	return lc.Listen(ctx, network, addr)
}

// ServeHTTP authenticates and upgrades one connection, then runs the
// session on this goroutine (it becomes the session's read loop).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	role := RoleAdmin
	if !s.opts.InsecureNoAuth {
		role = s.tokens.Load().role(bearer(r))
		if role == RoleNone {
			w.Header().Set("WWW-Authenticate", `Bearer realm="forkfleet-aci"`)
			http.Error(w, "missing or invalid bearer token", http.StatusUnauthorized)
			return
		}
	}
	if role != RoleAdmin && s.held() {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "a checkpoint is in progress; reconnect", http.StatusServiceUnavailable)
		return
	}
	quota := s.sessionQuota(role)
	if !s.reserveSession(quota) {
		w.Header().Set("Retry-After", "1")
		http.Error(w, fmt.Sprintf("%d %s sessions are open, the limit", s.limitOf(quota), quota), http.StatusTooManyRequests)
		return
	}
	defer s.releaseSession(quota)
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		Subprotocols:    []string{SubprotocolBinary, SubprotocolJSON},
		CompressionMode: websocket.CompressionDisabled,
		// Origin checks protect browsers' ambient credentials; ACI clients
		// present an explicit bearer token, which a cross-site page cannot.
		InsecureSkipVerify: true,
	})
	if err != nil {
		return
	}
	conn.SetReadLimit(s.opts.MaxMessageBytes)
	ss := s.newSession(conn, role, conn.Subprotocol() == SubprotocolJSON)
	if ss != nil {
		ss.raw, _ = r.Context().Value(rawConnKey{}).(net.Conn)
	}
	if ss == nil {
		conn.Close(websocket.StatusGoingAway, "guestd is shutting down")
		return
	}
	ss.run()
}

// sessionQuota is the pool a session of role counts against: the admin
// token's reserve, or everyone else's (agents, and InsecureNoAuth sessions,
// which are admin in power only).
func (s *Server) sessionQuota(role Role) Role {
	if role == RoleAdmin && !s.opts.InsecureNoAuth {
		return RoleAdmin
	}
	return RoleAgent
}

func (s *Server) limitOf(quota Role) int {
	if quota == RoleAdmin {
		return adminSessions
	}
	return s.opts.MaxSessions
}

// reserveSession takes a place in quota's pool for a session about to be
// upgraded; releaseSession gives it back when the session ends.
func (s *Server) reserveSession(quota Role) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.admitted[quota] >= s.limitOf(quota) {
		return false
	}
	s.admitted[quota]++
	return true
}

func (s *Server) releaseSession(quota Role) {
	s.mu.Lock()
	s.admitted[quota]--
	s.mu.Unlock()
}

// Shutdown stops accepting, closes every session with StatusGoingAway and
// waits for them (bounded by ctx).
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	servers := s.servers
	sessions := make([]*session, 0, len(s.sessions))
	for ss := range s.sessions {
		sessions = append(sessions, ss)
	}
	s.mu.Unlock()
	var firstErr error
	for _, hs := range servers {
		if err := hs.Shutdown(ctx); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	for _, ss := range sessions {
		ss.closeWith(websocket.StatusGoingAway, "guestd is shutting down")
	}
	if b := s.desk.Swap(nil); b != nil {
		b.close()
	}
	s.netProbe.close()
	done := make(chan struct{})
	go func() { s.bg.Wait(); close(done) }()
	// Clients that do not answer the close frame promptly are cut off: a
	// shutdown must not wait on the slowest peer.
	grace := time.NewTimer(closeHandshakeGrace)
	defer grace.Stop()
	select {
	case <-done:
		return firstErr
	case <-grace.C:
	case <-ctx.Done():
	}
	for _, ss := range sessions {
		// Canceling the session context aborts its blocked read, which
		// closes the connection and ends the pending close handshake.
		ss.cancel()
	}
	select {
	case <-done:
	case <-ctx.Done():
		if firstErr == nil {
			firstErr = ctx.Err()
		}
	}
	return firstErr
}

// clipRegion validates a request region against the screen and clips it.
func clipRegion(r *aciv1.Rect, w, h int, field string) (image.Rectangle, error) {
	screen := image.Rect(0, 0, w, h)
	if r == nil {
		return screen, nil
	}
	if r.GetWidth() <= 0 || r.GetHeight() <= 0 {
		return image.Rectangle{}, errInvalid(field, "region %dx%d is empty", r.GetWidth(), r.GetHeight())
	}
	rr := image.Rect(int(r.GetX()), int(r.GetY()), int(r.GetX())+int(r.GetWidth()), int(r.GetY())+int(r.GetHeight())).Intersect(screen)
	if rr.Empty() {
		return image.Rectangle{}, errInvalid(field, "region lies outside the %dx%d screen", w, h)
	}
	return rr, nil
}
