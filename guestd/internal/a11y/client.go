package a11y

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrNoBus: the sandbox has no accessibility bus (its image configures
// none), or it is not up.
var ErrNoBus = errors.New("a11y: no accessibility bus")

// connectTimeout bounds dialing and authenticating to the bus.
const connectTimeout = 2 * time.Second

// Client is guestd's connection to the accessibility bus: one D-Bus
// connection (wire.go), opened at first use and again after it broke (a
// dump and restore keeps it: the bus lives in the same sandbox).
type Client struct {
	addr string

	mu   sync.Mutex
	conn *wireConn
	// peers are direct connections to applications' own D-Bus servers
	// (Application.GetApplicationBusAddress), by bus name: a tree's calls
	// skip the bus daemon, which otherwise relays each of them twice.
	peers map[string]*wireConn
	// names are the action names of elements read before (names.go).
	names nameCache
	// cache is the tree cache of the connection (cache.go).
	cache treeCache
}

// New returns a Client of the bus at addr ("unix:path=..."); "" makes a
// Client with no bus, whose trees are the bare desktop.
func New(addr string) *Client { return &Client{addr: addr} }

// HasBus reports whether the sandbox is configured with a bus.
func (c *Client) HasBus() bool { return c != nil && c.addr != "" }

// Close drops the connection.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropLocked()
}

func (c *Client) dropLocked() {
	c.names.forget()
	c.cache.reset(nil)
	if c.conn != nil {
		_ = c.conn.Close()
	}
	c.conn = nil
	for name, p := range c.peers {
		_ = p.Close()
		delete(c.peers, name)
	}
}

// peerTimeout bounds asking an application for its address and connecting.
const peerTimeout = 500 * time.Millisecond

// peer returns a direct connection to application bus (pid: its process),
// or conn (the bus) when the application has no server of its own or it
// does not answer. The address comes from the application: only a unix
// socket path is dialed, as the application's own user, and what answers
// must speak D-Bus within peerTimeout.
func (c *Client) peer(ctx context.Context, conn *wireConn, bus string, pid int32) *wireConn {
	c.mu.Lock()
	p := c.peers[bus]
	c.mu.Unlock()
	if p != nil && p.Connected() {
		return p
	}
	if pid <= 0 {
		return conn
	}
	uid, gid, ok := procIDs(int(pid))
	if !ok {
		return conn
	}
	ctx, cancel := context.WithTimeout(ctx, peerTimeout)
	defer cancel()
	var addr string
	if call(ctx, conn, ref{bus, rootPath}, ifApplication+".GetApplicationBusAddress", nil, &addr) != nil {
		return conn
	}
	path, ok := strings.CutPrefix(addr, "unix:path=")
	if !ok || !strings.HasPrefix(path, "/") || strings.ContainsAny(path, ",;=\x00") || len(path) > 107 {
		return conn
	}
	p, err := dialPeer(ctx, path, uid, gid)
	if err != nil {
		return conn
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.peers == nil {
		c.peers = map[string]*wireConn{}
	}
	if old := c.peers[bus]; old != nil {
		_ = old.Close()
	}
	c.peers[bus] = p
	return p
}

// procIDs reads a process's real uid and gid.
func procIDs(pid int) (uid, gid int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, 0, false
	}
	uid, gid = -1, -1
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		switch k {
		case "Uid":
			uid, _ = strconv.Atoi(f[0])
		case "Gid":
			gid, _ = strconv.Atoi(f[0])
		}
	}
	return uid, gid, uid >= 0 && gid >= 0
}

// drop forgets conn if it is still the current one: a call on it hung past
// its deadline (a stopped bus), so the next request starts afresh.
func (c *Client) drop(conn *wireConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == conn {
		c.dropLocked()
	}
}

// get returns the open connection, dialing it when needed.
func (c *Client) get(ctx context.Context) (*wireConn, error) {
	if !c.HasBus() {
		return nil, ErrNoBus
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil && c.conn.Connected() {
		return c.conn, nil
	}
	c.dropLocked()
	// A bus that accepts and never answers cannot hold the caller.
	dctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	conn, err := dialWire(dctx, c.addr)
	if err != nil {
		return nil, fmt.Errorf("%w: connect %s: %v", ErrNoBus, c.addr, err)
	}
	c.conn = conn
	c.cache.reset(conn)
	return conn, nil
}

// D-Bus error names that mean the object or its application is gone.
func goneError(err error) bool {
	var e *dbusError
	if errors.As(err, &e) {
		switch e.Name {
		case "org.freedesktop.DBus.Error.ServiceUnknown", "org.freedesktop.DBus.Error.UnknownObject",
			"org.freedesktop.DBus.Error.NameHasNoOwner", "org.freedesktop.DBus.Error.Disconnected":
			return true
		}
	}
	return false
}

// unsupportedError: the object has no such method (an interface it lacks).
func unsupportedError(err error) bool {
	var e *dbusError
	if errors.As(err, &e) {
		return e.Name == "org.freedesktop.DBus.Error.UnknownMethod" || e.Name == "org.freedesktop.DBus.Error.UnknownInterface" ||
			strings.HasSuffix(e.Name, ".NotSupported")
	}
	return false
}

// busRef is the bus daemon itself.
var busRef = ref{"org.freedesktop.DBus", "/org/freedesktop/DBus"}

// call is one method call, bounded by ctx.
func call(ctx context.Context, conn *wireConn, r ref, method string, args []any, out ...any) error {
	return conn.call(ctx, r, method, args, out...)
}

// pending is one call in flight; wait stores its reply.
type pending struct {
	wc *wireCall
}

// window bounds the calls in flight to one application. An application
// answers in order and cannot be told to drop calls: a request that gives
// up on one leaves its queue behind, and the next request would wait for
// all of it. With at most maxInFlight queued, that costs the next request
// a few milliseconds, and the application is kept busy all the same.
type window struct {
	fifo []pending
}

const maxInFlight = 64

type windowKey struct{}

// withWindow gives ctx (one application's deadline) a window: every call
// started with it counts against the bound.
func withWindow(ctx context.Context) context.Context {
	return context.WithValue(ctx, windowKey{}, &window{})
}

// start sends a call without waiting for it: an application answers calls
// in order, so sending a whole level at once costs one round trip, not one
// per call. Under a window (withWindow) it first waits for the oldest
// call when maxInFlight are out.
func start(ctx context.Context, conn *wireConn, r ref, method string, args ...any) pending {
	w, _ := ctx.Value(windowKey{}).(*window)
	if w != nil && len(w.fifo) >= maxInFlight {
		old := w.fifo[0]
		w.fifo = w.fifo[1:]
		conn.flush(ctx)
		select {
		case <-old.wc.done:
		case <-ctx.Done():
		}
	}
	p := pending{wc: conn.send(ctx, r, method, args)}
	if w != nil {
		w.fifo = append(w.fifo, p)
	}
	return p
}

func (p pending) wait(ctx context.Context, out ...any) error { return p.wc.wait(ctx, out...) }

// WaitBus waits until the bus accepts a connection.
func (c *Client) WaitBus(ctx context.Context) error {
	delay := time.Millisecond
	for {
		_, err := c.get(ctx)
		if err == nil {
			return nil
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		delay = min(2*delay, 20*time.Millisecond)
	}
}

// WaitRegistry waits until the AT-SPI registry owns its name on the bus:
// apps started before that would register with nobody and stay out of
// the tree. guestd calls it between starting the registry and the apps.
func (c *Client) WaitRegistry(ctx context.Context) error {
	delay := time.Millisecond
	for {
		conn, err := c.get(ctx)
		if err == nil {
			var owned bool
			if err = call(ctx, conn, busRef, "org.freedesktop.DBus.NameHasOwner", []any{registryName}, &owned); err == nil && owned {
				return nil
			}
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			if err == nil {
				err = errors.New("the registry has not taken its name")
			}
			return fmt.Errorf("%w: %v", ctx.Err(), err)
		case <-t.C:
		}
		delay = min(2*delay, 20*time.Millisecond)
	}
}

// registrySyncTimeout bounds SyncRegistry: atk-bridge gives up on the
// registry's answer to a key event after 500 ms too.
const registrySyncTimeout = 500 * time.Millisecond

// SyncRegistry is two round trips to the AT-SPI registry (Peer.Ping, which
// it answers in order with everything it received before): an application
// that handed it a key event before has its answer on the way once this
// returns. Two, because the bus may forward the first ping ahead of an
// application's message that reached it at the same moment; by the second,
// it has read everything sent before the first. guestd's typing waits on it
// (x11.Desktop.SetKeySync).
func (c *Client) SyncRegistry() error {
	ctx, cancel := context.WithTimeout(context.Background(), registrySyncTimeout)
	defer cancel()
	conn, err := c.get(ctx)
	if err != nil {
		return err
	}
	for range 2 {
		if err := call(ctx, conn, ref{registryName, rootPath}, "org.freedesktop.DBus.Peer.Ping", nil); err != nil {
			return err
		}
	}
	return nil
}
