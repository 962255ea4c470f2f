//go:build linux

package x11

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jezek/xgb/xproto"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
)

// wmSettle bounds how long window operations wait for the window manager
// to carry out a request, so the caller's next observation shows the
// result. The WM may legitimately refuse (a fixed-size dialog cannot be
// maximized); the call still returns nil then, as the request was made.
var wmSettle = 300 * time.Millisecond

// EWMH source indication: the request comes from a pager/tool acting for
// the user, which WMs honour without focus-stealing prevention.
const sourcePager = 2

const (
	iconicState   = 3 // ICCCM WM_STATE / WM_CHANGE_STATE
	wmStateRemove = 0 // _NET_WM_STATE actions
	wmStateAdd    = 1
)

// topLevels lists the managed client windows: _NET_CLIENT_LIST when an
// EWMH WM runs, otherwise the viewable, non-override-redirect children of
// the root.
func (d *Desktop) topLevels(wm bool) ([]xproto.Window, error) {
	if wm {
		r, err := xproto.GetProperty(d.conn, false, d.root, d.atoms.netClientList, xproto.AtomWindow, 0, 1<<16).Reply()
		if err != nil {
			return nil, xerr("read _NET_CLIENT_LIST", err)
		}
		v, _ := propUint32s(r)
		out := make([]xproto.Window, len(v))
		for i, w := range v {
			out[i] = xproto.Window(w)
		}
		return out, nil
	}
	tree, err := xproto.QueryTree(d.conn, d.root).Reply()
	if err != nil {
		return nil, xerr("QueryTree", err)
	}
	if tree == nil {
		return nil, errNilReply("QueryTree")
	}
	cookies := make([]xproto.GetWindowAttributesCookie, len(tree.Children))
	for i, c := range tree.Children {
		cookies[i] = xproto.GetWindowAttributes(d.conn, c)
	}
	var out []xproto.Window
	for i, c := range cookies {
		a, err := c.Reply()
		if err != nil || a == nil {
			continue // vanished meanwhile
		}
		if a.MapState == xproto.MapStateViewable && !a.OverrideRedirect &&
			a.Class == xproto.WindowClassInputOutput && tree.Children[i] != d.win {
			out = append(out, tree.Children[i])
		}
	}
	return out, nil
}

type winCookies struct {
	netName, name, class, pid, state, desk, wmState xproto.GetPropertyCookie
	geom                                            xproto.GetGeometryCookie
	pos                                             xproto.TranslateCoordinatesCookie
	attrs                                           xproto.GetWindowAttributesCookie
}

// ListWindows returns the top-level client windows with their title,
// class, PID, client-area geometry in root coordinates and state. All
// property reads are pipelined.
func (d *Desktop) ListWindows() ([]desktop.Window, error) {
	wm, err := d.wmPresent()
	if err != nil {
		return nil, err
	}
	ids, err := d.topLevels(wm)
	if err != nil {
		return nil, err
	}
	active, err := d.activeWindow(wm)
	if err != nil {
		return nil, err
	}
	cks := make([]winCookies, len(ids))
	for i, id := range ids {
		cks[i] = d.requestWindow(id, 1024) // 4 KiB of title is plenty
	}
	out := make([]desktop.Window, 0, len(ids))
	for i, id := range ids {
		w, err := d.collectWindow(id, &cks[i], active)
		if err != nil {
			if errors.Is(err, errdefs.ErrNotFound) {
				continue // destroyed while we were reading it
			}
			return nil, err
		}
		out = append(out, w)
	}
	return out, nil
}

// requestWindow sends (without waiting) every request ListWindows needs
// about one window; strLen bounds the title and class reads in 32-bit
// units.
func (d *Desktop) requestWindow(id xproto.Window, strLen uint32) winCookies {
	c := d.conn
	return winCookies{
		netName: xproto.GetProperty(c, false, id, d.atoms.netWMName, d.atoms.utf8String, 0, strLen),
		name:    xproto.GetProperty(c, false, id, xproto.AtomWmName, xproto.GetPropertyTypeAny, 0, strLen),
		class:   xproto.GetProperty(c, false, id, xproto.AtomWmClass, xproto.AtomString, 0, strLen),
		pid:     xproto.GetProperty(c, false, id, d.atoms.netWMPID, xproto.AtomCardinal, 0, 1),
		state:   xproto.GetProperty(c, false, id, d.atoms.netWMState, xproto.AtomAtom, 0, 64),
		desk:    xproto.GetProperty(c, false, id, d.atoms.netWMDesktop, xproto.AtomCardinal, 0, 1),
		wmState: xproto.GetProperty(c, false, id, d.atoms.wmState, d.atoms.wmState, 0, 2),
		geom:    xproto.GetGeometry(c, xproto.Drawable(id)),
		pos:     xproto.TranslateCoordinates(c, id, d.root, 0, 0),
		attrs:   xproto.GetWindowAttributes(c, id),
	}
}

func (d *Desktop) collectWindow(id xproto.Window, ck *winCookies, active xproto.Window) (desktop.Window, error) {
	w := desktop.Window{ID: uint32(id), Focused: id == active}
	// Drain every cookie even after an error so replies don't pile up.
	netName, err1 := ck.netName.Reply()
	name, err2 := ck.name.Reply()
	class, err3 := ck.class.Reply()
	pid, err4 := ck.pid.Reply()
	state, err5 := ck.state.Reply()
	desk, err6 := ck.desk.Reply()
	wmState, err7 := ck.wmState.Reply()
	geom, err8 := ck.geom.Reply()
	pos, err9 := ck.pos.Reply()
	attrs, err10 := ck.attrs.Reply()
	for _, e := range []error{err1, err2, err3, err4, err5, err6, err7, err8, err9, err10} {
		if e != nil {
			return w, xerr(fmt.Sprintf("read window 0x%x", id), e)
		}
	}
	if geom == nil || pos == nil || attrs == nil {
		return w, errNilReply("read window geometry")
	}
	w.Mapped = attrs.MapState == xproto.MapStateViewable
	switch {
	case netName != nil && len(netName.Value) > 0:
		w.Title = strings.ToValidUTF8(string(netName.Value), "\uFFFD")
	case name != nil && name.Type == xproto.AtomString:
		w.Title = fromLatin1(name.Value)
	case name != nil:
		w.Title = strings.ToValidUTF8(string(name.Value), "\uFFFD")
	}
	if class != nil {
		// WM_CLASS is "instance\0class\0".
		parts := strings.Split(strings.TrimRight(string(class.Value), "\x00"), "\x00")
		w.Instance = parts[0]
		if len(parts) > 1 {
			w.Class = parts[1]
		}
	}
	if v, ok := propUint32s(pid); ok && len(v) > 0 {
		w.PID = int(v[0])
	}
	if v, ok := propUint32s(desk); ok && len(v) > 0 {
		w.Desktop = int(int32(v[0])) // 0xFFFFFFFF (all desktops) becomes -1
	}
	st, _ := propUint32s(state)
	has := func(a xproto.Atom) bool { return slices.Contains(st, uint32(a)) }
	w.Maximized = has(d.atoms.netWMStateMaxVert) && has(d.atoms.netWMStateMaxHorz)
	w.Minimized = has(d.atoms.netWMStateHidden)
	if v, ok := propUint32s(wmState); ok && len(v) > 0 && v[0] == iconicState {
		w.Minimized = true
	}
	w.X, w.Y = int(pos.DstX), int(pos.DstY)
	w.Width, w.Height = int(geom.Width), int(geom.Height)
	return w, nil
}

// activeWindow is _NET_ACTIVE_WINDOW, or the input focus without a WM.
func (d *Desktop) activeWindow(wm bool) (xproto.Window, error) {
	if wm {
		r, err := xproto.GetProperty(d.conn, false, d.root, d.atoms.netActiveWindow, xproto.AtomWindow, 0, 1).Reply()
		if err != nil {
			return 0, xerr("read _NET_ACTIVE_WINDOW", err)
		}
		w, _ := propWindow(r)
		return w, nil
	}
	r, err := xproto.GetInputFocus(d.conn).Reply()
	if err != nil {
		return 0, xerr("GetInputFocus", err)
	}
	if r == nil {
		return 0, errNilReply("GetInputFocus")
	}
	return r.Focus, nil
}

// lookupWindow checks that id is a current top-level client window.
func (d *Desktop) lookupWindow(id uint32) (wm bool, err error) {
	if wm, err = d.wmPresent(); err != nil {
		return false, err
	}
	ids, err := d.topLevels(wm)
	if err != nil {
		return false, err
	}
	if !slices.Contains(ids, xproto.Window(id)) {
		return false, fmt.Errorf("x11: window 0x%x: %w", id, errdefs.ErrNotFound)
	}
	return wm, nil
}

// clientMessage sends an EWMH request to the root window.
func (d *Desktop) clientMessage(win xproto.Window, typ xproto.Atom, data ...uint32) error {
	var d32 [5]uint32
	copy(d32[:], data)
	ev := xproto.ClientMessageEvent{
		Format: 32, Window: win, Type: typ,
		Data: xproto.ClientMessageDataUnionData32New(d32[:]),
	}
	err := xproto.SendEventChecked(d.conn, false, d.root,
		xproto.EventMaskSubstructureNotify|xproto.EventMaskSubstructureRedirect, string(ev.Bytes())).Check()
	return xerr("SendEvent", err)
}

// settle polls cond until it holds or wmSettle passes.
func (d *Desktop) settle(cond func() (bool, error)) error {
	deadline := time.Now().Add(wmSettle)
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return nil
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// windowInfo re-reads one window's geometry and state (not its title).
func (d *Desktop) windowInfo(id xproto.Window, wm bool) (desktop.Window, error) {
	active, err := d.activeWindow(wm)
	if err != nil {
		return desktop.Window{}, err
	}
	ck := d.requestWindow(id, 0)
	return d.collectWindow(id, &ck, active)
}

// ActivateWindow raises and focuses a window (de-iconifying it): through
// _NET_ACTIVE_WINDOW when a WM runs, directly otherwise.
func (d *Desktop) ActivateWindow(id uint32) error {
	wm, err := d.lookupWindow(id)
	if err != nil {
		return err
	}
	win := xproto.Window(id)
	if !wm {
		xproto.MapWindow(d.conn, win)
		xproto.ConfigureWindow(d.conn, win, xproto.ConfigWindowStackMode, []uint32{xproto.StackModeAbove})
		err := xproto.SetInputFocusChecked(d.conn, xproto.InputFocusParent, win, xproto.TimeCurrentTime).Check()
		return xerr("SetInputFocus", err)
	}
	cur, err := d.activeWindow(true)
	if err != nil {
		return err
	}
	if err := d.clientMessage(win, d.atoms.netActiveWindow, sourcePager, xproto.TimeCurrentTime, uint32(cur)); err != nil {
		return err
	}
	return d.settle(func() (bool, error) {
		a, err := d.activeWindow(true)
		return a == win, err
	})
}

// CloseWindow asks a window to close (_NET_CLOSE_WINDOW, or
// WM_DELETE_WINDOW without a WM; a client that does not support
// WM_DELETE_WINDOW is destroyed). The application may still refuse or ask
// the user, so the window can outlive the call.
func (d *Desktop) CloseWindow(id uint32) error {
	wm, err := d.lookupWindow(id)
	if err != nil {
		return err
	}
	win := xproto.Window(id)
	if wm {
		if err := d.clientMessage(win, d.atoms.netCloseWindow, xproto.TimeCurrentTime, sourcePager); err != nil {
			return err
		}
		return d.sync()
	}
	r, err := xproto.GetProperty(d.conn, false, win, d.atoms.wmProtocols, xproto.AtomAtom, 0, 64).Reply()
	if err != nil {
		return xerr("read WM_PROTOCOLS", err)
	}
	if protos, _ := propUint32s(r); slices.Contains(protos, uint32(d.atoms.wmDeleteWindow)) {
		ev := xproto.ClientMessageEvent{
			Format: 32, Window: win, Type: d.atoms.wmProtocols,
			Data: xproto.ClientMessageDataUnionData32New([]uint32{uint32(d.atoms.wmDeleteWindow), xproto.TimeCurrentTime, 0, 0, 0}),
		}
		err := xproto.SendEventChecked(d.conn, false, win, xproto.EventMaskNoEvent, string(ev.Bytes())).Check()
		return xerr("send WM_DELETE_WINDOW", err)
	}
	return xerr("DestroyWindow", xproto.DestroyWindowChecked(d.conn, win).Check())
}

// MoveResizeWindow places the client area of a window at (x, y) in root
// coordinates with size w x h. With a WM the request goes through
// _NET_MOVERESIZE_WINDOW with the position corrected by _NET_FRAME_EXTENTS
// (NorthWest gravity places the frame, which every WM implements the same
// way); without one, ConfigureWindow.
func (d *Desktop) MoveResizeWindow(id uint32, x, y, w, h int) error {
	if w < 1 || h < 1 || w > 32767 || h > 32767 || x < -32768 || x > 32767 || y < -32768 || y > 32767 {
		return fmt.Errorf("x11: move/resize to %dx%d+%d+%d: out of range: %w", w, h, x, y, errdefs.ErrInvalidArgument)
	}
	wm, err := d.lookupWindow(id)
	if err != nil {
		return err
	}
	win := xproto.Window(id)
	if !wm {
		err := xproto.ConfigureWindowChecked(d.conn, win,
			xproto.ConfigWindowX|xproto.ConfigWindowY|xproto.ConfigWindowWidth|xproto.ConfigWindowHeight,
			[]uint32{uint32(int32(x)), uint32(int32(y)), uint32(w), uint32(h)}).Check()
		return xerr("ConfigureWindow", err)
	}
	r, err := xproto.GetProperty(d.conn, false, win, d.atoms.netFrameExtents, xproto.AtomCardinal, 0, 4).Reply()
	if err != nil {
		return xerr("read _NET_FRAME_EXTENTS", err)
	}
	fx, fy := x, y
	if ext, ok := propUint32s(r); ok && len(ext) == 4 {
		fx, fy = x-int(ext[0]), y-int(ext[2]) // left, top
	}
	const gravityNorthWest = 1
	flags := uint32(gravityNorthWest) | 0xf<<8 | sourcePager<<12
	if err := d.clientMessage(win, d.atoms.netMoveResizeWindow, flags,
		uint32(int32(fx)), uint32(int32(fy)), uint32(w), uint32(h)); err != nil {
		return err
	}
	return d.settle(func() (bool, error) {
		cur, err := d.windowInfo(win, true)
		return cur.X == x && cur.Y == y && cur.Width == w && cur.Height == h, err
	})
}

// SetWindowState maximizes, minimizes (iconifies), restores or
// fullscreens a window. It needs an EWMH window manager.
func (d *Desktop) SetWindowState(id uint32, state desktop.WindowState) error {
	if state < desktop.WindowMaximize || state > desktop.WindowFullscreen {
		return fmt.Errorf("x11: window state %d: %w", state, errdefs.ErrInvalidArgument)
	}
	wm, err := d.lookupWindow(id)
	if err != nil {
		return err
	}
	if !wm {
		return fmt.Errorf("x11: changing window state needs an EWMH window manager, none is running: %w", errdefs.ErrUnavailable)
	}
	win := xproto.Window(id)
	a := &d.atoms
	var done func(desktop.Window, []uint32) bool
	switch state {
	case desktop.WindowMaximize:
		err = d.clientMessage(win, a.netWMState, wmStateAdd, uint32(a.netWMStateMaxVert), uint32(a.netWMStateMaxHorz), sourcePager)
		done = func(w desktop.Window, _ []uint32) bool { return w.Maximized }
	case desktop.WindowMinimize:
		err = d.clientMessage(win, a.wmChangeState, iconicState)
		done = func(w desktop.Window, _ []uint32) bool { return w.Minimized }
	case desktop.WindowFullscreen:
		err = d.clientMessage(win, a.netWMState, wmStateAdd, uint32(a.netWMStateFullscreen), 0, sourcePager)
		// The WM sets the state before it moves the frame; wait for both.
		done = func(w desktop.Window, st []uint32) bool {
			return slices.Contains(st, uint32(a.netWMStateFullscreen)) &&
				w.X == 0 && w.Y == 0 && w.Width == d.width && w.Height == d.height
		}
	case desktop.WindowRestore:
		cur, werr := d.windowInfo(win, true)
		if werr != nil {
			return werr
		}
		if cur.Minimized {
			// Activation de-iconifies (EWMH _NET_ACTIVE_WINDOW).
			if err := d.clientMessage(win, a.netActiveWindow, sourcePager, xproto.TimeCurrentTime, 0); err != nil {
				return err
			}
		}
		err = d.clientMessage(win, a.netWMState, wmStateRemove, uint32(a.netWMStateMaxVert), uint32(a.netWMStateMaxHorz), sourcePager)
		if err == nil {
			err = d.clientMessage(win, a.netWMState, wmStateRemove, uint32(a.netWMStateFullscreen), 0, sourcePager)
		}
		done = func(w desktop.Window, st []uint32) bool {
			return !w.Minimized && !w.Maximized && !slices.Contains(st, uint32(a.netWMStateFullscreen))
		}
	}
	if err != nil {
		return err
	}
	// WMs publish the new state before they move the frame, so the result
	// counts only once it holds on two polls in a row with the same
	// geometry.
	var last *desktop.Window
	return d.settle(func() (bool, error) {
		r, err := xproto.GetProperty(d.conn, false, win, a.netWMState, xproto.AtomAtom, 0, 64).Reply()
		if err != nil {
			return false, xerr("read _NET_WM_STATE", err)
		}
		st, _ := propUint32s(r)
		w, err := d.windowInfo(win, true)
		if err != nil {
			return false, err
		}
		if !done(w, st) {
			last = nil
			return false, nil
		}
		stable := last != nil && last.X == w.X && last.Y == w.Y && last.Width == w.Width && last.Height == w.Height
		last = &w
		return stable, nil
	})
}
