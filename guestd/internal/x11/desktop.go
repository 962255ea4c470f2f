//go:build linux

// Package x11 implements aci.Desktop on an X server in pure Go over
// github.com/jezek/xgb: XTEST input, MIT-SHM capture (with a plain GetImage
// fallback), DAMAGE change notification, XFIXES cursor sprites, EWMH window
// management and the CLIPBOARD selection.
//
// One goroutine reads every X event and fans it out without blocking, so a
// slow consumer can never stall the replies other calls wait for.
package x11

import (
	"context"
	"errors"
	"fmt"
	"image"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/damage"
	"github.com/jezek/xgb/res"
	"github.com/jezek/xgb/xfixes"
	"github.com/jezek/xgb/xproto"
	"github.com/jezek/xgb/xtest"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
)

// Desktop is a connection to one X display. All methods are safe for
// concurrent use. When the connection dies every method fails with an
// error wrapping errdefs.ErrUnavailable; reconnecting means calling Open
// again.
type Desktop struct {
	conn   *xgb.Conn
	root   xproto.Window
	width  int
	height int
	atoms  atoms

	dead      chan struct{} // closed when the event loop has exited
	closeOnce sync.Once
	closeErr  error

	// win is an unmapped helper window: clipboard owner and requestor,
	// source of server timestamps.
	win xproto.Window

	hasRes bool // X-Resource 1.2: QueryClientIds
	winw   winWatch

	in    input
	cap   capturer
	clip  clipboard
	dmg   damager
	seq   damageSeq
	sel   chan xproto.SelectionNotifyEvent
	props chan xproto.PropertyNotifyEvent

	// keySync is a round trip through a channel other than X that an
	// application may wait on, asleep, before it translates a key (see
	// SetKeySync); nil: none.
	keySync atomic.Pointer[func() error]
}

// SetKeySync makes typing through spare keycodes also flush f: with
// accessibility on, toolkits hand every key event to the AT-SPI registry
// and wait for its answer asleep in a nested loop (atk-bridge's
// NotifyListenersSync), which looks like an idle event loop; a round trip to
// the registry after the application's makes its answer arrive first, so
// an application still busy with a key wakes before keysTaken looks again.
func (d *Desktop) SetKeySync(f func() error) {
	if f == nil {
		d.keySync.Store(nil)
		return
	}
	d.keySync.Store(&f)
}

// Open connects to display (":0", or "" for $DISPLAY), checks the XTEST,
// DAMAGE and XFIXES extensions and sets up MIT-SHM capture when the server
// offers it. ctx bounds the connection handshake.
func Open(ctx context.Context, display string) (*Desktop, error) {
	type result struct {
		d   *Desktop
		err error
	}
	// xgb takes no context: connect and set up in a goroutine, and close
	// whatever it produces if ctx ends first.
	ch := make(chan result, 1)
	go func() {
		conn, err := xgb.NewConnDisplay(display)
		if err != nil {
			ch <- result{nil, fmt.Errorf("x11: connect to display %q: %v: %w", display, err, errdefs.ErrUnavailable)}
			return
		}
		d, err := newDesktop(conn)
		if err != nil {
			conn.Close()
		}
		ch <- result{d, err}
	}()
	select {
	case r := <-ch:
		return r.d, r.err
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.d != nil {
				r.d.Close()
			}
		}()
		return nil, fmt.Errorf("x11: open display %q: %w", display, ctxErr(ctx))
	}
}

func newDesktop(conn *xgb.Conn) (*Desktop, error) {
	setup := xproto.Setup(conn)
	scr := setup.DefaultScreen(conn)
	d := &Desktop{
		conn:   conn,
		root:   scr.Root,
		width:  int(scr.WidthInPixels),
		height: int(scr.HeightInPixels),
		dead:   make(chan struct{}),
		sel:    make(chan xproto.SelectionNotifyEvent, 4),
		props:  make(chan xproto.PropertyNotifyEvent, 256),
	}
	for _, name := range []string{"XTEST", "XFIXES", "DAMAGE"} {
		if err := initExtension(conn, name); err != nil {
			return nil, fmt.Errorf("x11: %s extension: %v: %w", name, err, errdefs.ErrUnavailable)
		}
	}
	// XFIXES and DAMAGE refuse requests until the client announced its
	// version; XTEST is queried to fail early on a server without it.
	xfv := xfixes.QueryVersion(conn, 5, 0)
	dmv := damage.QueryVersion(conn, 1, 1)
	xtv := xtest.GetVersion(conn, 2, 2)
	if _, err := xfv.Reply(); err != nil {
		return nil, xerr("XFIXES QueryVersion", err)
	}
	if _, err := dmv.Reply(); err != nil {
		return nil, xerr("DAMAGE QueryVersion", err)
	}
	if _, err := xtv.Reply(); err != nil {
		return nil, xerr("XTEST GetVersion", err)
	}
	if err := d.atoms.intern(conn); err != nil {
		return nil, err
	}
	// X-Resource (optional) names the process behind a window, which
	// TypeText watches before it reuses a spare keycode.
	if initExtension(conn, "X-Resource") == nil {
		if v, err := res.QueryVersion(conn, 1, 2).Reply(); err == nil && v != nil &&
			(v.ServerMajor > 1 || v.ServerMajor == 1 && v.ServerMinor >= 2) {
			d.hasRes = true
		}
	}

	wid, err := xproto.NewWindowId(conn)
	if err != nil {
		return nil, xerr("allocate window id", err)
	}
	err = xproto.CreateWindowChecked(conn, 0, wid, d.root, -10, -10, 1, 1, 0,
		xproto.WindowClassInputOnly, 0, xproto.CwOverrideRedirect|xproto.CwEventMask,
		[]uint32{1, xproto.EventMaskPropertyChange}).Check()
	if err != nil {
		return nil, xerr("create helper window", err)
	}
	d.win = wid

	d.cap.init(d, setup, scr)
	if err := d.dmg.init(d); err != nil {
		return nil, err
	}
	d.seq.init(d)
	go d.eventLoop()
	go d.dmg.loop(d)
	return d, nil
}

// closeTimeout bounds each step of Close that needs the server to answer.
const closeTimeout = 2 * time.Second

// Close puts back remapped keycodes, closes the connection and releases
// the shared-memory segment. Calls in flight fail with
// errdefs.ErrUnavailable. Close is idempotent; it returns an error only
// when the server did not let go of the connection in time (a frozen
// server), in which case the rest is released when the process exits.
func (d *Desktop) Close() error {
	d.closeOnce.Do(func() {
		restored := make(chan struct{})
		go func() {
			d.in.restoreScratch(d)
			close(restored)
		}()
		select {
		case <-restored:
		case <-time.After(closeTimeout):
		}
		go d.conn.Close() // xgb's Close makes a round trip
		select {
		case <-d.dead:
			// The server detached the segment along with the client.
			d.cap.release()
		case <-time.After(closeTimeout):
			d.closeErr = fmt.Errorf("x11: close: X server did not release the connection within %s: %w",
				closeTimeout, errdefs.ErrUnavailable)
		}
	})
	return d.closeErr
}

// Done is closed when the connection to the X server is gone.
func (d *Desktop) Done() <-chan struct{} { return d.dead }

// ScreenSize is the root window size in pixels.
func (d *Desktop) ScreenSize() (w, h int) { return d.width, d.height }

// eventLoop is the only reader of X events.
func (d *Desktop) eventLoop() {
	defer close(d.dead)
	for {
		ev, err := d.conn.WaitForEvent()
		if ev == nil && err == nil {
			return // connection closed
		}
		if err != nil {
			// Errors of unchecked requests: every request whose failure
			// matters is sent checked or validated beforehand.
			continue
		}
		switch e := ev.(type) {
		case damage.NotifyEvent:
			if !d.seq.damaged(e) {
				d.dmg.kick()
			}
		case xproto.ClientMessageEvent:
			if e.Window == d.win {
				d.seq.marker(e)
			}
		case xproto.MappingNotifyEvent:
			if e.Request == xproto.MappingKeyboard {
				d.in.stale.Store(true)
			}
		case xproto.SelectionRequestEvent:
			// Answering sends requests, which can block behind a full
			// request queue; the event goroutine must never block.
			go d.serveSelection(e)
		case xproto.SelectionClearEvent:
			d.clip.lost(e)
		case xproto.SelectionNotifyEvent:
			if e.Requestor == d.win {
				select {
				case d.sel <- e:
				default:
				}
			}
		case xproto.PropertyNotifyEvent:
			if e.Window == d.win {
				select {
				case d.props <- e:
				default: // nobody is reading; waiters drain stale events first
				}
			} else {
				d.windowEvent(e)
			}
		case xproto.MapNotifyEvent, xproto.UnmapNotifyEvent, xproto.CreateNotifyEvent, xproto.DestroyNotifyEvent,
			xproto.ReparentNotifyEvent, xproto.FocusInEvent, xproto.FocusOutEvent:
			d.windowEvent(e)
		}
	}
}

// sync waits until the server has processed every request sent so far.
func (d *Desktop) sync() error {
	_, err := xproto.GetInputFocus(d.conn).Reply()
	return xerr("sync", err)
}

// alive reports whether the connection is still up.
func (d *Desktop) alive() bool {
	select {
	case <-d.dead:
		return false
	default:
		return true
	}
}

// xerr wraps an xgb error: a closed connection becomes ErrUnavailable,
// BadWindow/BadDrawable become ErrNotFound.
func xerr(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("x11: %s: connection to X server lost: %w", op, errdefs.ErrUnavailable)
	}
	switch err.(type) {
	case xproto.WindowError, xproto.DrawableError:
		return fmt.Errorf("x11: %s: %v: %w", op, err, errdefs.ErrNotFound)
	}
	return fmt.Errorf("x11: %s: %w", op, err)
}

// errNilReply covers xgb returning neither reply nor error, which happens
// only when the connection closes under an unchecked cookie.
func errNilReply(op string) error {
	return fmt.Errorf("x11: %s: no reply: %w", op, errdefs.ErrUnavailable)
}

// await runs f and waits for it or ctx, whichever ends first. X requests
// cannot be cancelled, so f keeps running in the background after ctx ends;
// it only ever blocks on the connection, which Close unblocks.
func await[T any](ctx context.Context, f func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		v, err := f()
		ch <- result{v, err}
	}()
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		var zero T
		return zero, ctxErr(ctx)
	}
}

func ctxErr(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("x11: %w: %w", errdefs.ErrDeadlineExceeded, ctx.Err())
	}
	return ctx.Err()
}

// Ready is the cheap readiness probe: the connection answers, an EWMH
// window manager announced itself on a live window, and a few single
// pixels of the screen are not all black. All requests are pipelined.
func (d *Desktop) Ready(ctx context.Context) (desktop.ReadyState, error) {
	if err := ctx.Err(); err != nil {
		return desktop.ReadyState{}, err
	}
	return await(ctx, func() (desktop.ReadyState, error) {
		st := desktop.ReadyState{At: time.Now()}
		if !d.alive() {
			return st, nil
		}
		wmc := xproto.GetProperty(d.conn, false, d.root, d.atoms.netSupportingWMCheck, xproto.AtomWindow, 0, 1)
		pts := []image.Point{
			{d.width / 2, d.height / 2}, {d.width / 4, d.height / 4}, {3 * d.width / 4, d.height / 4},
			{d.width / 4, 3 * d.height / 4}, {3 * d.width / 4, 3 * d.height / 4}, {d.width / 2, d.height - 1},
		}
		samples := make([]xproto.GetImageCookie, len(pts))
		for i, p := range pts {
			samples[i] = xproto.GetImage(d.conn, xproto.ImageFormatZPixmap, xproto.Drawable(d.root),
				int16(p.X), int16(p.Y), 1, 1, 0xffffffff)
		}
		wm, err := wmc.Reply()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return st, nil
			}
			return st, xerr("ready: read _NET_SUPPORTING_WM_CHECK", err)
		}
		st.XUp = true
		for _, c := range samples {
			r, err := c.Reply()
			if err != nil {
				return st, xerr("ready: sample root", err)
			}
			if r != nil && len(r.Data) >= 3 && (r.Data[0]|r.Data[1]|r.Data[2]) != 0 {
				st.RootPainted = true
			}
		}
		if w, ok := propWindow(wm); ok {
			st.WMUp = d.wmWindowAlive(w)
		}
		return st, nil
	})
}

// wmWindowAlive checks the EWMH supporting window: it must exist and, as
// EWMH requires, point at itself.
func (d *Desktop) wmWindowAlive(w xproto.Window) bool {
	r, err := xproto.GetProperty(d.conn, false, w, d.atoms.netSupportingWMCheck, xproto.AtomWindow, 0, 1).Reply()
	if err != nil {
		return false
	}
	self, ok := propWindow(r)
	return ok && self == w
}

// wmPresent reports whether an EWMH window manager is running.
func (d *Desktop) wmPresent() (bool, error) {
	r, err := xproto.GetProperty(d.conn, false, d.root, d.atoms.netSupportingWMCheck, xproto.AtomWindow, 0, 1).Reply()
	if err != nil {
		return false, xerr("read _NET_SUPPORTING_WM_CHECK", err)
	}
	w, ok := propWindow(r)
	return ok && d.wmWindowAlive(w), nil
}

func propWindow(r *xproto.GetPropertyReply) (xproto.Window, bool) {
	v, ok := propUint32s(r)
	if !ok || len(v) == 0 || v[0] == 0 {
		return 0, false
	}
	return xproto.Window(v[0]), true
}

func propUint32s(r *xproto.GetPropertyReply) ([]uint32, bool) {
	if r == nil || r.Format != 32 {
		return nil, false
	}
	n := int(r.ValueLen)
	if len(r.Value) < 4*n {
		n = len(r.Value) / 4
	}
	out := make([]uint32, n)
	for i := range out {
		out[i] = xgb.Get32(r.Value[4*i:])
	}
	return out, true
}

// CursorPosition is the pointer position in root coordinates.
func (d *Desktop) CursorPosition() (x, y int, err error) {
	r, err := xproto.QueryPointer(d.conn, d.root).Reply()
	if err != nil {
		return 0, 0, xerr("QueryPointer", err)
	}
	if r == nil {
		return 0, 0, errNilReply("QueryPointer")
	}
	return int(r.RootX), int(r.RootY), nil
}

// CursorImage returns the current cursor sprite through XFIXES.
func (d *Desktop) CursorImage() (desktop.Cursor, error) {
	r, err := xfixes.GetCursorImage(d.conn).Reply()
	if err != nil {
		return desktop.Cursor{}, xerr("XFIXES GetCursorImage", err)
	}
	if r == nil {
		return desktop.Cursor{}, errNilReply("XFIXES GetCursorImage")
	}
	n := int(r.Width) * int(r.Height)
	if len(r.CursorImage) < n {
		return desktop.Cursor{}, fmt.Errorf("x11: XFIXES GetCursorImage: %d pixels for %dx%d", len(r.CursorImage), r.Width, r.Height)
	}
	return desktop.Cursor{
		X: int(r.X), Y: int(r.Y),
		XHot: int(r.Xhot), YHot: int(r.Yhot),
		Width: int(r.Width), Height: int(r.Height),
		ARGB: r.CursorImage[:n:n],
	}, nil
}

// GrabServer makes this connection the only one the X server serves until
// UngrabServer (or the connection closes): other clients' requests wait in
// their sockets, so nothing but guestd can draw. Checkpoints hold it across
// the dump, so the frame guestd proves is the frame the dump holds, and a
// replica (whose X server restores the grab) can capture that very frame
// before any app draws the next one.
func (d *Desktop) GrabServer() error {
	return xerr("GrabServer", xproto.GrabServerChecked(d.conn).Check())
}

// UngrabServer lets the X server serve every client again.
func (d *Desktop) UngrabServer() error {
	return xerr("UngrabServer", xproto.UngrabServerChecked(d.conn).Check())
}
