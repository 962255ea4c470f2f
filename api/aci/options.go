package aci

import (
	"context"
	"crypto/tls"
	"math/rand/v2"
	"net"
	"net/http"
	"time"
)

// Subprotocols of the ACI WebSocket.
const (
	SubprotocolProto = "forkfleet.aci.v1"
	SubprotocolJSON  = "forkfleet.aci.v1+json"
)

// ProtocolVersion is the highest ACI protocol version this client speaks.
const ProtocolVersion = 1

// DefaultReadLimit is the largest server message a session accepts unless
// WithReadLimit says otherwise: a full-screen PNG of a large display fits.
const DefaultReadLimit = 64 << 20

// DefaultUnixPath is the HTTP path DialUnix requests on guestd's socket.
const DefaultUnixPath = "/aci"

// Capabilities this client understands and offers in its HelloRequest by
// default.
var DefaultCapabilities = []string{
	"codec.png", "codec.jpeg", "codec.none", "dedup", "settle", "region", "downscale", "cursor",
	"input", "windows", "clipboard", "events.ready", "cancel", "memory", "exec", "launch",
	"files", "files.chunked", "screencast", "screencast.delta", "screencast.zlib", "checkpoint",
	"restored.admin_token", "apps.hold", "netprobe", "a11y",
}

// DialOption configures Dial and DialUnix.
type DialOption func(*dialConfig)

type dialConfig struct {
	httpClient   *http.Client
	dialer       func(ctx context.Context, network, addr string) (net.Conn, error)
	header       http.Header
	clientName   string
	capabilities []string
	readLimit    int64
	frameCache   *FrameCache
	json         bool
	reconnect    *Backoff
	onReconnect  func(*Session)
	tokenSource  func(ctx context.Context) (string, error)
	eventBuffer  int
	unixPath     string
	tlsConfig    *tls.Config
	// insecure allows a bearer token in plaintext to a remote host; local
	// marks a transport that never leaves the machine (DialUnix).
	insecure bool
	local    bool
	// ping, when set, is the payload of the ping Dial pipelines behind
	// the Hello and waits for (WithPing).
	ping []byte
}

func defaultDialConfig() dialConfig {
	return dialConfig{
		clientName:   "forkfleet-go",
		capabilities: DefaultCapabilities,
		readLimit:    DefaultReadLimit,
		eventBuffer:  256,
		unixPath:     DefaultUnixPath,
	}
}

// WithHTTPClient makes the WebSocket upgrade go through c (its Transport
// must return writable bodies for 101 responses, as http.Transport does).
func WithHTTPClient(c *http.Client) DialOption {
	return func(o *dialConfig) { o.httpClient = c }
}

// WithDialer sets how the underlying connection is made (ignored with
// WithHTTPClient).
func WithDialer(d func(ctx context.Context, network, addr string) (net.Conn, error)) DialOption {
	return func(o *dialConfig) { o.dialer = d }
}

// WithHeader adds HTTP headers to the upgrade request.
func WithHeader(h http.Header) DialOption {
	return func(o *dialConfig) { o.header = h.Clone() }
}

// WithPing makes Dial prove one request round trip before it returns: a
// ping with payload (nil counts as empty) is sent right behind the Hello,
// pipelined (docs/aci-spec.md, section 4; on a local dial both ride behind
// the upgrade request), and Dial returns once its reply came back echoing
// payload. The session is then known to execute requests, at the cost of
// the Hello's round trip alone: one round trip from dial to a first
// answered request instead of two (the claim-to-usable path of a pooled
// sandbox). A reconnect does the same.
func WithPing(payload []byte) DialOption {
	return func(o *dialConfig) {
		o.ping = append([]byte{}, payload...)
	}
}

// WithClientName names the client in the HelloRequest (guestd logs it).
func WithClientName(name string) DialOption {
	return func(o *dialConfig) { o.clientName = name }
}

// WithCapabilities replaces the capabilities offered in the HelloRequest.
// The server only uses capabilities both sides list; leaving one out turns
// the feature off for the session (e.g. without "dedup" the session never
// sends if_none_match).
func WithCapabilities(caps ...string) DialOption {
	return func(o *dialConfig) { o.capabilities = append([]string(nil), caps...) }
}

// WithReadLimit sets the largest server message accepted, in bytes
// (DefaultReadLimit when unset).
func WithReadLimit(n int64) DialOption {
	return func(o *dialConfig) {
		if n > 0 {
			o.readLimit = n
		}
	}
}

// WithFrameCache shares c between sessions for observation dedup.
func WithFrameCache(c *FrameCache) DialOption {
	return func(o *dialConfig) { o.frameCache = c }
}

// WithJSON selects the protojson text subprotocol (debugging; slower).
func WithJSON() DialOption {
	return func(o *dialConfig) { o.json = true }
}

// Backoff bounds automatic reconnection. Every attempt waits a random time
// ("full jitter"): attempt n (from 0) waits uniformly between 0 and
// min(Max, Initial * 2^n), so sessions dropped together (a gateway or
// controld restart, a checkpoint of many replicas) spread their redials
// instead of arriving in lockstep.
type Backoff struct {
	// Initial bounds the wait before the first attempt (and doubles per
	// attempt); 50 ms when 0.
	Initial time.Duration
	// Max bounds every wait; 2 s when 0.
	Max time.Duration
	// MaxElapsed gives up after this long without a connection, closing the
	// session with ErrConnectionLost; 0 retries until Close.
	MaxElapsed time.Duration
}

func (b Backoff) withDefaults() Backoff {
	if b.Initial <= 0 {
		b.Initial = 50 * time.Millisecond
	}
	if b.Max <= 0 {
		b.Max = 2 * time.Second
	}
	if b.Max < b.Initial {
		b.Max = b.Initial
	}
	return b
}

// wait returns how long attempt n (from 0) waits: uniform in [0, ceiling],
// ceiling = min(Max, Initial * 2^n).
func (b Backoff) wait(n int) time.Duration {
	ceiling := b.Max
	if n < 62 && b.Initial<<n > 0 && b.Initial<<n < b.Max {
		ceiling = b.Initial << n
	}
	return time.Duration(rand.Int64N(int64(ceiling) + 1))
}

// WithReconnect makes the session redial automatically, with backoff, when
// the connection drops. Calls in flight at the drop fail with
// ErrConnectionLost; calls made while reconnecting wait for the new
// connection (bounded by their context).
func WithReconnect(b Backoff) DialOption {
	return func(o *dialConfig) {
		b = b.withDefaults()
		o.reconnect = &b
	}
}

// WithOnReconnect calls fn (on its own goroutine) after every successful
// reconnect; s.Welcome() then describes the new connection, and a changed
// Generation means the sandbox was restored from a checkpoint.
func WithOnReconnect(fn func(s *Session)) DialOption {
	return func(o *dialConfig) { o.onReconnect = fn }
}

// WithTokenSource fetches the bearer token on every dial and redial instead
// of reusing the one given to Dial (a restored replica gets its own token).
func WithTokenSource(fn func(ctx context.Context) (string, error)) DialOption {
	return func(o *dialConfig) { o.tokenSource = fn }
}

// WithEventBuffer sets how many events each subscriber may queue before the
// oldest is dropped (256 when unset).
func WithEventBuffer(n int) DialOption {
	return func(o *dialConfig) {
		if n > 0 {
			o.eventBuffer = n
		}
	}
}

// WithUnixPath sets the HTTP path DialUnix requests (DefaultUnixPath).
func WithUnixPath(p string) DialOption {
	return func(o *dialConfig) { o.unixPath = p }
}

// WithTLSConfig sets the TLS configuration of wss:// dials (roots, client
// certificates for mutual TLS, server name); ignored with WithHTTPClient.
func WithTLSConfig(cfg *tls.Config) DialOption {
	return func(o *dialConfig) { o.tlsConfig = cfg }
}

// WithInsecure allows a bearer token over plaintext ws:// to a host that is
// not the loopback, which Dial otherwise refuses (anyone on the path could
// read the token). Only for a network you trust.
func WithInsecure() DialOption {
	return func(o *dialConfig) { o.insecure = true }
}
