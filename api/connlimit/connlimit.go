// Package connlimit bounds what an HTTP server holds for connections that
// have not authenticated yet. guestd's ACI listeners and controld's ACI
// gateway both install it (server side; trainers do not need it).
//
// A connection counts as a handshake from accept until it is hijacked (a
// WebSocket upgrade: the session then has its own bounds) or closed. Its
// request headers must arrive within HeaderTimeout, and a keep-alive
// connection between requests is closed after IdleTimeout. Past
// MaxHandshakes the oldest handshake is closed: connections that send
// nothing, or a header a byte at a time, cannot hold the server, and an
// honest client, whose upgrade takes a millisecond, is only at risk from a
// flood of new connections, not from idle ones.
package connlimit

import (
	"container/list"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Limits are the pre-authentication bounds of one HTTP server.
type Limits struct {
	// HeaderTimeout bounds reading a request's headers (and a TLS
	// handshake) from the first byte; DefaultHeaderTimeout when 0.
	HeaderTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that sends no next
	// request; DefaultIdleTimeout when 0.
	IdleTimeout time.Duration
	// MaxHandshakes caps connections not yet hijacked; past it the oldest
	// is closed. DefaultMaxHandshakes when 0.
	MaxHandshakes int
}

// Defaults.
const (
	DefaultHeaderTimeout = 5 * time.Second
	DefaultIdleTimeout   = 5 * time.Second
	DefaultMaxHandshakes = 128
	// MaxHeaderBytes bounds a request's header block: an upgrade request
	// carries a few hundred bytes.
	MaxHeaderBytes = 16 << 10
)

func (l Limits) withDefaults() Limits {
	if l.HeaderTimeout <= 0 {
		l.HeaderTimeout = DefaultHeaderTimeout
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = DefaultIdleTimeout
	}
	if l.MaxHandshakes <= 0 {
		l.MaxHandshakes = DefaultMaxHandshakes
	}
	return l
}

// Tracker counts one server's handshakes.
type Tracker struct {
	max     int
	mu      sync.Mutex
	order   list.List // of net.Conn, oldest first
	byConn  map[net.Conn]*list.Element
	evicted atomic.Uint64
}

// Apply sets s's header and idle timeouts and header size limit, and
// installs a Tracker on s.ConnState (replacing any hook there).
func Apply(s *http.Server, l Limits) *Tracker {
	l = l.withDefaults()
	s.ReadHeaderTimeout = l.HeaderTimeout
	s.IdleTimeout = l.IdleTimeout
	s.MaxHeaderBytes = MaxHeaderBytes
	t := &Tracker{max: l.MaxHandshakes, byConn: make(map[net.Conn]*list.Element)}
	s.ConnState = t.connState
	return t
}

func (t *Tracker) connState(c net.Conn, st http.ConnState) {
	switch st {
	case http.StateNew:
		t.mu.Lock()
		t.byConn[c] = t.order.PushBack(c)
		var oldest net.Conn
		if t.order.Len() > t.max {
			oldest = t.order.Remove(t.order.Front()).(net.Conn)
			delete(t.byConn, oldest)
		}
		t.mu.Unlock()
		if oldest != nil {
			// Its serving goroutine sees the error and ends; StateClosed
			// then finds nothing to remove.
			oldest.Close()
			t.evicted.Add(1)
		}
	case http.StateHijacked, http.StateClosed:
		t.mu.Lock()
		if e, ok := t.byConn[c]; ok {
			t.order.Remove(e)
			delete(t.byConn, c)
		}
		t.mu.Unlock()
	}
}

// Handshakes is how many connections are open and not yet hijacked.
func (t *Tracker) Handshakes() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.order.Len()
}

// Evicted is how many handshakes were closed to make room for newer ones.
func (t *Tracker) Evicted() uint64 { return t.evicted.Load() }
