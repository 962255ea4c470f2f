package aci

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/api/guestsock"
)

// Session is one ACI session to a sandbox's guestd: one WebSocket, any number
// of concurrent (pipelined) requests from any number of goroutines, pushed
// events, and optional automatic reconnection.
//
// Replies are matched to requests by id by a single reader goroutine; writes
// are serialized. A Session is safe for concurrent use.
type Session struct {
	cfg   dialConfig
	url   string
	token string
	hc    *http.Client

	nextID atomic.Uint64

	dialMu sync.Mutex // one (re)dial at a time

	mu          sync.Mutex
	cur         *conn
	installed   chan struct{} // closed and replaced whenever cur changes
	closed      bool
	failed      error // set when automatic reconnection gave up
	reconnectOn bool  // an automatic reconnect loop is running

	closeCh chan struct{}
	bg      sync.WaitGroup // readers, reconnect loop, cancel senders

	subsMu  sync.RWMutex
	subs    map[*subscriber]struct{}
	dropped atomic.Uint64

	lastMu    sync.Mutex
	lastFrame map[shapeKey]ownFrame // this session's last frame per request shape
}

// conn is one WebSocket connection of a Session; a reconnect replaces it.
type conn struct {
	s     *Session
	ws    *websocket.Conn
	hello *aciv1.HelloResponse
	caps  map[string]bool

	wsem chan struct{} // write lock; a channel so waiting is cancelable
	wbuf []byte

	pmu     sync.Mutex
	pending map[uint64]chan *aciv1.ServerMessage
	dead    bool
	err     error

	done chan struct{} // closed when the reader exits
}

// defaultHTTPClient serves every Dial without its own client or dialer: the
// upgrade hijacks the connection, so sharing one transport costs nothing.
var defaultHTTPClient = &http.Client{Transport: &http.Transport{
	Proxy:               http.ProxyFromEnvironment,
	DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
	MaxIdleConnsPerHost: -1,
}}

// Dial opens an ACI session at a ws:// or wss:// URL with a bearer token
// (empty for a server without auth) and performs the Hello handshake.
func Dial(ctx context.Context, rawURL, token string, opts ...DialOption) (*Session, error) {
	cfg, hc, err := prepareDial(rawURL, token, opts)
	if err != nil {
		return nil, err
	}
	s := &Session{
		cfg:       cfg,
		url:       rawURL,
		token:     token,
		hc:        hc,
		installed: make(chan struct{}),
		closeCh:   make(chan struct{}),
		subs:      make(map[*subscriber]struct{}),
		lastFrame: make(map[shapeKey]ownFrame),
	}
	c, err := s.dial(ctx)
	if err != nil {
		return nil, err
	}
	s.install(c)
	return s, nil
}

// prepareDial checks a URL and the options of a dial (Dial and DialWire)
// and returns the configuration and the HTTP client of the upgrade.
func prepareDial(rawURL, token string, opts []DialOption) (dialConfig, *http.Client, error) {
	cfg := defaultDialConfig()
	u, err := url.Parse(rawURL)
	if err != nil {
		return cfg, nil, fmt.Errorf("aci: dial: %w", err)
	}
	switch u.Scheme {
	case "ws", "wss", "http", "https":
	default:
		return cfg, nil, fmt.Errorf("aci: dial %q: scheme must be ws or wss", rawURL)
	}
	for _, o := range opts {
		o(&cfg)
	}
	if err := checkPlaintext(u, token != "" || cfg.tokenSource != nil, &cfg); err != nil {
		return cfg, nil, err
	}
	hc := cfg.httpClient
	if hc == nil {
		hc = defaultHTTPClient
		if cfg.dialer != nil || cfg.tlsConfig != nil {
			tr := defaultHTTPClient.Transport.(*http.Transport).Clone()
			if cfg.dialer != nil {
				tr.DialContext, tr.Proxy = cfg.dialer, nil
			}
			if cfg.tlsConfig != nil {
				tr.TLSClientConfig = cfg.tlsConfig.Clone()
			}
			hc = &http.Client{Transport: tr}
		}
	}
	return cfg, hc, nil
}

// dialWS performs the WebSocket upgrade with the bearer token and the
// subprotocol cfg asks for, and checks the server chose it.
func dialWS(ctx context.Context, rawURL, token string, hc *http.Client, cfg *dialConfig) (*websocket.Conn, *http.Response, error) {
	hdr := http.Header{}
	for k, v := range cfg.header {
		hdr[k] = v
	}
	if token != "" {
		hdr.Set("Authorization", "Bearer "+token)
	}
	sub := SubprotocolProto
	if cfg.json {
		sub = SubprotocolJSON
	}
	ws, resp, err := websocket.Dial(ctx, rawURL, &websocket.DialOptions{
		HTTPClient:   hc,
		HTTPHeader:   hdr,
		Subprotocols: []string{sub},
	})
	if err != nil {
		return nil, resp, err
	}
	if ws.Subprotocol() != sub {
		ws.CloseNow()
		return nil, resp, fmt.Errorf("aci: dial %s: %w: server chose subprotocol %q, want %q", rawURL, ErrProtocol, ws.Subprotocol(), sub)
	}
	ws.SetReadLimit(cfg.readLimit)
	return ws, resp, nil
}

// DialUnix opens an ACI session over a unix socket at a path the caller
// trusts (a guestd it started, a test server). A sandbox's guestd socket is
// not such a path: the sandbox can plant symlinks on it; dial it with
// DialSandbox.
func DialUnix(ctx context.Context, socketPath, token string, opts ...DialOption) (*Session, error) {
	if socketPath == "" {
		return nil, errors.New("aci: dial unix: empty socket path")
	}
	d := &net.Dialer{Timeout: 10 * time.Second}
	return dialUnixWith(ctx, func(ctx context.Context, _, _ string) (net.Conn, error) {
		return d.DialContext(ctx, "unix", socketPath)
	}, token, opts)
}

// DialSandbox opens an ACI session to guestd's socket inside a running
// sandbox, from the same host (Endpoint.unix_path and unix_pid_start, see
// guestsock.Parse). It resolves the socket inside the sandbox's root without
// following any link the sandbox may have planted, and refuses a pid that no
// longer names the sandbox's init (package guestsock). It fails with
// errdefs.ErrPermissionDenied when this process may not look into the
// sandbox (not root): use controld's gateway then.
func DialSandbox(ctx context.Context, addr guestsock.Addr, token string, opts ...DialOption) (*Session, error) {
	if err := addr.Validate(); err != nil {
		return nil, fmt.Errorf("aci: dial sandbox: %w", err)
	}
	return dialUnixWith(ctx, func(ctx context.Context, _, _ string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return guestsock.Dial(ctx, addr)
	}, token, opts)
}

func dialUnixWith(ctx context.Context, dialer func(ctx context.Context, network, addr string) (net.Conn, error), token string, opts []DialOption) (*Session, error) {
	cfg := defaultDialConfig()
	for _, o := range opts {
		o(&cfg)
	}
	path := cfg.unixPath
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	opts = append(opts[:len(opts):len(opts)], WithDialer(dialer), func(o *dialConfig) { o.local = true })
	return Dial(ctx, "ws://guestd"+path, token, opts...)
}

func (s *Session) currentToken(ctx context.Context) (string, error) {
	if s.cfg.tokenSource != nil {
		t, err := s.cfg.tokenSource(ctx)
		if err != nil {
			return "", fmt.Errorf("aci: token source: %w", err)
		}
		return t, nil
	}
	return s.token, nil
}

// dial connects and runs the handshake; the returned conn's reader is not
// started yet.
func (s *Session) dial(ctx context.Context) (*conn, error) {
	token, err := s.currentToken(ctx)
	if err != nil {
		return nil, err
	}
	hello := s.helloMessage()
	ping := s.pingMessage()
	hc, sent, err := s.upgradeClient(hello, ping)
	if err != nil {
		return nil, err
	}
	ws, resp, err := dialWS(ctx, s.url, token, hc, &s.cfg)
	if errors.Is(err, ErrProtocol) {
		return nil, err
	}
	if err != nil {
		if resp != nil {
			switch resp.StatusCode {
			case http.StatusUnauthorized:
				return nil, fmt.Errorf("aci: dial %s: %w: %v", s.url, ErrPermissionDenied, err)
			case http.StatusForbidden:
				return nil, fmt.Errorf("aci: dial %s: %w: %v", s.url, ErrPermissionDenied, err)
			case http.StatusNotFound:
				return nil, fmt.Errorf("aci: dial %s: %w: %v", s.url, ErrNotFound, err)
			case http.StatusTooManyRequests:
				return nil, fmt.Errorf("aci: dial %s: %w: %v", s.url, ErrResourceExhausted, err)
			}
		}
		if resp == nil && (errors.Is(err, guestsock.ErrUnsafePath) || errors.Is(err, guestsock.ErrProcessGone) || errors.Is(err, ErrPermissionDenied)) {
			// A sandbox socket that retrying cannot reach: keep the class.
			return nil, fmt.Errorf("aci: dial %s: %w", s.url, err)
		}
		return nil, fmt.Errorf("aci: dial %s: %w: %v", s.url, ErrUnavailable, err)
	}
	c := &conn{
		s:       s,
		ws:      ws,
		wsem:    make(chan struct{}, 1),
		pending: make(map[uint64]chan *aciv1.ServerMessage, 64),
		done:    make(chan struct{}),
	}
	if err := c.handshake(ctx, hello, ping, sent); err != nil {
		ws.CloseNow()
		return nil, err
	}
	return c, nil
}

// helloMessage is the HelloRequest of a new connection, with its id.
func (s *Session) helloMessage() *aciv1.ClientMessage {
	return &aciv1.ClientMessage{Id: s.newID(), Request: &aciv1.ClientMessage_Hello{Hello: &aciv1.HelloRequest{
		ProtocolVersion: ProtocolVersion,
		ClientName:      s.cfg.clientName,
		Capabilities:    s.cfg.capabilities,
	}}}
}

// pingMessage is the ping a dial pipelines behind its hello (WithPing), or
// nil.
func (s *Session) pingMessage() *aciv1.ClientMessage {
	if s.cfg.ping == nil {
		return nil
	}
	return &aciv1.ClientMessage{Id: s.newID(), Request: &aciv1.ClientMessage_Ping{Ping: &aciv1.PingRequest{Payload: s.cfg.ping}}}
}

// upgradeClient is the HTTP client of a connection's upgrade. A local dial
// (DialUnix, DialSandbox) upgrades on its own connection and sends hello
// (and ping, when not nil) with the upgrade request (directUpgrade): sent
// reports that.
func (s *Session) upgradeClient(hello, ping *aciv1.ClientMessage) (hc *http.Client, sent bool, err error) {
	if !s.cfg.local || s.cfg.httpClient != nil || s.cfg.dialer == nil {
		return s.hc, false, nil
	}
	var early []byte
	for _, m := range []*aciv1.ClientMessage{hello, ping} {
		if m == nil {
			continue
		}
		typ, b, err := encodeClientMessage(nil, m, s.cfg.json)
		if err != nil {
			return nil, false, fmt.Errorf("aci: %w: encode %T: %v", ErrInvalidArgument, m.GetRequest(), err)
		}
		frame, err := clientFrame(typ, b)
		if err != nil {
			return nil, false, err
		}
		early = append(early, frame...)
	}
	return &http.Client{
		Transport: &directUpgrade{dial: s.cfg.dialer, early: early},
		// A redirect would carry the hello to wherever it points.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}, true, nil
}

// handshake completes the Hello exchange: it sends hello (and ping, when
// not nil) unless the upgrade carried them already (sent), then reads and
// checks the replies.
func (c *conn) handshake(ctx context.Context, hello, ping *aciv1.ClientMessage, sent bool) error {
	s := c.s
	id := hello.GetId()
	// The handshake runs before the reader goroutine exists, so a canceled
	// ctx must unblock the raw read: closing the socket does.
	stop := context.AfterFunc(ctx, func() { c.ws.CloseNow() })
	defer stop()
	if !sent {
		for _, m := range []*aciv1.ClientMessage{hello, ping} {
			if m == nil {
				continue
			}
			if err := c.write(ctx, m); err != nil {
				return handshakeErr(ctx, s.url, err)
			}
		}
	}
	var rd msgReader
	msg, err := c.handshakeReply(&rd)
	if err != nil {
		return handshakeErr(ctx, s.url, err)
	}
	if err := c.checkHello(msg, id); err != nil {
		return err
	}
	if ping == nil {
		return nil
	}
	// The pipelined ping's reply follows the hello's (replies come in
	// request order), read here too: no hand-off to the reader goroutine.
	msg, err = c.handshakeReply(&rd)
	if err != nil {
		return handshakeErr(ctx, s.url, err)
	}
	if e := msg.GetError(); e != nil {
		return fmt.Errorf("aci: first ping %s: %w", s.url, FromProto(e))
	}
	if msg.GetId() != ping.GetId() || msg.GetPing() == nil || !bytes.Equal(msg.GetPing().GetPayload(), ping.GetPing().GetPayload()) {
		return fmt.Errorf("aci: first ping %s: %w: the reply after the hello's is not the ping's echo", s.url, ErrProtocol)
	}
	return nil
}

// handshakeReply reads the next reply of the handshake; events pushed
// ahead of it are dispatched.
func (c *conn) handshakeReply(rd *msgReader) (*aciv1.ServerMessage, error) {
	for {
		m, err := rd.next(c.ws, c.s.cfg.json)
		if err != nil {
			return nil, err
		}
		if m.GetId() == 0 && m.GetEvent() != nil {
			c.s.dispatch(m.GetEvent())
			continue
		}
		return m, nil
	}
}

// checkHello checks the hello's reply and takes the session's terms from
// it.
func (c *conn) checkHello(msg *aciv1.ServerMessage, id uint64) error {
	s := c.s
	if e := msg.GetError(); e != nil {
		return fmt.Errorf("aci: hello %s: %w", s.url, FromProto(e))
	}
	h := msg.GetHello()
	if h == nil || msg.GetId() != id {
		return fmt.Errorf("aci: hello %s: %w: first reply is not the hello response", s.url, ErrProtocol)
	}
	if h.GetProtocolVersion() == 0 || h.GetProtocolVersion() > ProtocolVersion {
		return fmt.Errorf("aci: hello %s: %w: server speaks protocol version %d, client %d", s.url, ErrProtocol, h.GetProtocolVersion(), ProtocolVersion)
	}
	c.hello = h
	c.caps = make(map[string]bool, len(h.GetCapabilities()))
	offered := make(map[string]bool, len(s.cfg.capabilities))
	for _, cp := range s.cfg.capabilities {
		offered[cp] = true
	}
	// A capability is in use only when both sides list it.
	for _, cp := range h.GetCapabilities() {
		if offered[cp] {
			c.caps[cp] = true
		}
	}
	return nil
}

func handshakeErr(ctx context.Context, u string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("aci: hello %s: %w: %v", u, ErrUnavailable, err)
}

// install makes c the session's connection and starts its reader.
func (s *Session) install(c *conn) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		c.ws.CloseNow()
		return
	}
	old := s.cur
	s.cur = c
	s.failed = nil
	close(s.installed)
	s.installed = make(chan struct{})
	s.bg.Add(1)
	s.mu.Unlock()
	go c.readLoop()
	if old != nil {
		old.ws.CloseNow()
	}
}

func (s *Session) newID() uint64 { return s.nextID.Add(1) }

// current returns the live connection, waiting for a reconnect in progress.
func (s *Session) current(ctx context.Context) (*conn, error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, ErrClosed
		}
		if s.failed != nil {
			err := s.failed
			s.mu.Unlock()
			return nil, err
		}
		c := s.cur
		if !c.isDead() {
			s.mu.Unlock()
			return c, nil
		}
		if s.cfg.reconnect == nil {
			s.mu.Unlock()
			return nil, c.lostErr()
		}
		wait := s.installed
		s.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.closeCh:
			return nil, ErrClosed
		}
	}
}

func (c *conn) isDead() bool {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	return c.dead
}

func (c *conn) lostErr() error {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	if c.err != nil {
		return fmt.Errorf("%w: %w", ErrConnectionLost, c.err)
	}
	return ErrConnectionLost
}

// Welcome returns the server's HelloResponse of the current connection
// (protocol version, capabilities, restore generation, sandbox id, screen,
// boot id). Screen is absent while guestd has not reached the display yet.
// Treat it as read-only.
func (s *Session) Welcome() *aciv1.HelloResponse {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur.hello
}

// Generation is the restore generation of the current connection's guest:
// it changes when the session reconnected to a restored replica.
func (s *Session) Generation() uint64 { return s.Welcome().GetGeneration() }

// HasCapability reports whether both sides listed capability name in the
// handshake of the current connection.
func (s *Session) HasCapability(name string) bool {
	s.mu.Lock()
	c := s.cur
	s.mu.Unlock()
	return c.caps[name]
}

// Do sends one request and waits for its reply. The id of msg is assigned
// by the session (any value set is overwritten). An ACI Error reply is
// returned as an *Error; a canceled ctx returns ctx.Err() at once and, for
// requests the server can cut short (exec, step, screenshot) on a server
// with the "cancel" capability, sends a CancelRequest; the late reply is
// discarded.
func (s *Session) Do(ctx context.Context, msg *aciv1.ClientMessage) (*aciv1.ServerMessage, error) {
	call, err := s.Start(ctx, msg)
	if err != nil {
		return nil, err
	}
	return call.Wait(ctx)
}

// Call is a request on the wire whose reply has not been collected yet.
type Call struct {
	c          *conn
	id         uint64
	ch         chan *aciv1.ServerMessage
	cancelable bool
}

// Start sends one request without waiting for the reply: pipelining. The
// server executes a session's requests in the order it receives them. Collect
// the reply with Wait (once).
func (s *Session) Start(ctx context.Context, msg *aciv1.ClientMessage) (*Call, error) {
	if msg == nil || msg.GetRequest() == nil {
		return nil, fmt.Errorf("aci: %w: empty request", ErrInvalidArgument)
	}
	if _, ok := msg.GetRequest().(*aciv1.ClientMessage_Hello); ok {
		return nil, fmt.Errorf("aci: %w: hello is sent by Dial", ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, err := s.current(ctx)
	if err != nil {
		return nil, err
	}
	id := s.newID()
	msg.Id = id
	ch, err := c.register(id)
	if err != nil {
		return nil, err
	}
	if err := c.write(ctx, msg); err != nil {
		c.unregister(id)
		return nil, err
	}
	return &Call{c: c, id: id, ch: ch, cancelable: cancelable(msg)}, nil
}

// ID is the request id on the wire (the target of a CancelRequest).
func (call *Call) ID() uint64 { return call.id }

// Wait returns the reply. When ctx ends first it returns ctx.Err() at once
// and, for cancelable requests, asks the server to abandon the request.
func (call *Call) Wait(ctx context.Context) (*aciv1.ServerMessage, error) {
	c, ch := call.c, call.ch
	select {
	case reply := <-ch:
		chanPool.Put(ch)
		return replyErr(reply)
	case <-ctx.Done():
		if c.unregister(call.id) {
			if call.cancelable && c.caps["cancel"] {
				c.sendCancel(call.id)
			}
			return nil, ctx.Err()
		}
		// The reader took the reply already: it is in ch, or about to be.
		reply := <-ch
		chanPool.Put(ch)
		return replyErr(reply)
	case <-c.done:
		select {
		case reply := <-ch:
			chanPool.Put(ch)
			return replyErr(reply)
		default:
		}
		return nil, c.lostErr()
	}
}

func replyErr(m *aciv1.ServerMessage) (*aciv1.ServerMessage, error) {
	if e := m.GetError(); e != nil {
		return nil, FromProto(e)
	}
	return m, nil
}

func cancelable(m *aciv1.ClientMessage) bool {
	switch m.GetRequest().(type) {
	case *aciv1.ClientMessage_Exec, *aciv1.ClientMessage_Step, *aciv1.ClientMessage_Screenshot:
		return true
	}
	return false
}

func (c *conn) register(id uint64) (chan *aciv1.ServerMessage, error) {
	ch := chanPool.Get().(chan *aciv1.ServerMessage)
	c.pmu.Lock()
	if c.dead {
		c.pmu.Unlock()
		chanPool.Put(ch)
		return nil, c.lostErr()
	}
	c.pending[id] = ch
	c.pmu.Unlock()
	return ch, nil
}

// unregister removes id and reports whether it was still pending (no reply
// will be delivered for it).
func (c *conn) unregister(id uint64) bool {
	c.pmu.Lock()
	ch, ok := c.pending[id]
	delete(c.pending, id)
	c.pmu.Unlock()
	if ok {
		chanPool.Put(ch)
	}
	return ok
}

// Reply channels are recycled: a channel returns to the pool only once it is
// known to be empty and unreachable from the pending map.
var chanPool = sync.Pool{New: func() any { return make(chan *aciv1.ServerMessage, 1) }}

// sendCancel asks the server to abandon request target, without blocking the
// caller; the CancelResponse is not awaited (the reader discards it).
func (c *conn) sendCancel(target uint64) {
	s := c.s
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		// write gives up when the connection dies, so no deadline is needed.
		_ = c.write(context.Background(), &aciv1.ClientMessage{Id: s.newID(), Request: &aciv1.ClientMessage_Cancel{
			Cancel: &aciv1.CancelRequest{TargetId: target},
		}})
	}()
}

// write sends one envelope. ctx bounds only the wait for the write lock:
// the websocket write itself is never abandoned halfway (that would corrupt
// the stream); a dead peer is unblocked by closing the socket.
func (c *conn) write(ctx context.Context, m *aciv1.ClientMessage) error {
	select {
	case c.wsem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-c.done:
		return c.lostErr()
	}
	defer func() { <-c.wsem }()
	typ, b, err := encodeClientMessage(c.wbuf[:0], m, c.s.cfg.json)
	if err != nil {
		return fmt.Errorf("aci: %w: encode request: %v", ErrInvalidArgument, err)
	}
	if max := c.hello.GetMaxMessageBytes(); max > 0 && uint64(len(b)) > max {
		return fmt.Errorf("aci: %w: request is %d bytes, server accepts at most %d", ErrInvalidArgument, len(b), max)
	}
	err = c.ws.Write(context.Background(), typ, b)
	if !c.s.cfg.json && cap(b) <= 1<<20 {
		c.wbuf = b // keep small buffers for reuse; let big uploads go
	}
	if err != nil {
		c.ws.CloseNow() // the reader notices and fails pending calls
		return fmt.Errorf("%w: write: %v", ErrConnectionLost, err)
	}
	return nil
}

// msgReader reads whole messages into one reused buffer. Reuse is safe
// because proto and protojson decoding copy bytes fields out of the input.
type msgReader struct {
	buf []byte
}

const (
	minReadBuf  = 4 << 10
	keepReadBuf = 8 << 20 // a buffer grown past this is dropped after use
)

func (r *msgReader) next(ws *websocket.Conn, json bool) (*aciv1.ServerMessage, error) {
	typ, rd, err := ws.Reader(context.Background())
	if err != nil {
		return nil, err
	}
	if cap(r.buf) < minReadBuf {
		r.buf = make([]byte, 0, minReadBuf)
	}
	b := r.buf[:0]
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := rd.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if cap(b) <= keepReadBuf {
		r.buf = b
	} else {
		r.buf = nil
	}
	want := websocket.MessageBinary
	if json {
		want = websocket.MessageText
	}
	if typ != want {
		return nil, fmt.Errorf("%w: %v frame where the subprotocol carries %v frames", ErrProtocol, typ, want)
	}
	return decodeServerMessage(b, json)
}

// readLoop is the connection's only reader: it routes replies to waiting
// callers by id and events to subscribers, and never blocks on either.
func (c *conn) readLoop() {
	s := c.s
	defer s.bg.Done()
	var rd msgReader
	var err error
	for {
		var m *aciv1.ServerMessage
		m, err = rd.next(c.ws, s.cfg.json)
		if err != nil {
			break
		}
		id := m.GetId()
		if id == 0 {
			if ev := m.GetEvent(); ev != nil {
				s.dispatch(ev)
			}
			continue
		}
		c.pmu.Lock()
		ch, ok := c.pending[id]
		delete(c.pending, id)
		c.pmu.Unlock()
		if ok {
			ch <- m // buffered (1) and only ever sent once: never blocks
		}
		// No waiter: a reply to a canceled call or to a CancelRequest.
	}
	c.ws.CloseNow()
	c.pmu.Lock()
	c.dead = true
	if errors.Is(err, ErrProtocol) {
		c.err = err
	} else if st := websocket.CloseStatus(err); st != -1 {
		c.err = fmt.Errorf("closed by server (%d %s)", st, closeReason(err))
	} else {
		c.err = err
	}
	c.pmu.Unlock()
	close(c.done)

	s.mu.Lock()
	retry := s.cur == c && !s.closed && s.cfg.reconnect != nil && !s.reconnectOn
	if retry {
		s.reconnectOn = true
		s.bg.Add(1)
	}
	s.mu.Unlock()
	if retry {
		go s.reconnectLoop()
	}
}

func closeReason(err error) string {
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		return ce.Reason
	}
	return ""
}

func (s *Session) reconnectLoop() {
	defer s.bg.Done()
	defer func() {
		s.mu.Lock()
		s.reconnectOn = false
		s.mu.Unlock()
	}()
	b := *s.cfg.reconnect
	start := time.Now()
	var lastErr error
	for attempt := 0; ; attempt++ {
		t := time.NewTimer(b.wait(attempt)) // full jitter, the first attempt too
		select {
		case <-t.C:
		case <-s.closeCh:
			t.Stop()
			return
		}
		if s.reconnectOnce(&lastErr) {
			return
		}
		if b.MaxElapsed > 0 && time.Since(start) >= b.MaxElapsed {
			s.mu.Lock()
			s.failed = fmt.Errorf("%w: reconnect gave up after %v: %v", ErrConnectionLost, time.Since(start).Round(time.Millisecond), lastErr)
			close(s.installed)
			s.installed = make(chan struct{})
			s.mu.Unlock()
			return
		}
	}
}

// reconnectOnce makes one attempt; it reports true when the loop is done
// (connected, closed, or someone else connected meanwhile).
func (s *Session) reconnectOnce(lastErr *error) bool {
	s.dialMu.Lock()
	defer s.dialMu.Unlock()
	s.mu.Lock()
	if s.closed || !s.cur.isDead() {
		s.mu.Unlock()
		return true
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() { // Close must not wait out a slow dial
		select {
		case <-s.closeCh:
			cancel()
		case <-ctx.Done():
		}
	}()
	c, err := s.dial(ctx)
	if err != nil {
		*lastErr = err
		return false
	}
	s.install(c)
	if fn := s.cfg.onReconnect; fn != nil {
		go fn(s)
	}
	return true
}

// Reconnect replaces the session's connection with a fresh one (a new
// handshake: Welcome() then describes it). Calls in flight on the old
// connection fail with ErrConnectionLost.
func (s *Session) Reconnect(ctx context.Context) error {
	s.dialMu.Lock()
	defer s.dialMu.Unlock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.mu.Unlock()
	c, err := s.dial(ctx)
	if err != nil {
		return err
	}
	s.install(c)
	return nil
}

// Done is closed when the session is closed.
func (s *Session) Done() <-chan struct{} { return s.closeCh }

// Close ends the session: the connection is closed, calls in flight fail
// with ErrClosed or ErrConnectionLost, event channels are closed, and every
// goroutine of the session has exited when Close returns.
func (s *Session) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closeCh)
	c := s.cur
	s.mu.Unlock()

	// Close waits (bounded) for the server's close frame, which the reader
	// goroutine consumes; CloseNow is the fallback for a peer that is gone.
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.ws.Close(websocket.StatusNormalClosure, "")
	}()
	select {
	case <-done:
	case <-time.After(time.Second):
		c.ws.CloseNow()
		<-done
	}
	s.bg.Wait()
	s.closeSubscribers()
	return nil
}
