//go:build linux

package x11

import (
	"context"
	"io"
	"sync"

	"github.com/jezek/xgb/xproto"
)

// InputFocus is the top-level client window holding the keyboard focus: the
// focus window, or under PointerRoot focus the window under the pointer,
// walked up to the nearest window carrying WM_STATE (ICCCM: a window manager
// puts it on every client window it manages), or without one to the child
// of the root that contains it. 0: the keys go nowhere (focus None, the root).
func (d *Desktop) InputFocus() (uint32, error) {
	w, err := d.keyWindow()
	if err != nil {
		return 0, err
	}
	for range 32 { // client windows nest a few levels deep at most
		if w == d.root || w == 0 {
			return 0, nil
		}
		st := xproto.GetProperty(d.conn, false, w, d.atoms.wmState, d.atoms.wmState, 0, 0)
		tree := xproto.QueryTree(d.conn, w)
		r, err := st.Reply()
		t, terr := tree.Reply()
		if err != nil || terr != nil || t == nil {
			return 0, nil // the window went away: nobody holds the focus now
		}
		if r != nil && r.Type == d.atoms.wmState {
			return uint32(w), nil
		}
		if t.Parent == d.root {
			return uint32(w), nil
		}
		w = t.Parent
	}
	return 0, nil
}

// keyWindow returns the window key events go to now: the focus window, or
// under PointerRoot focus the window under the pointer; 0 under focus None.
func (d *Desktop) keyWindow() (xproto.Window, error) {
	f, err := xproto.GetInputFocus(d.conn).Reply()
	if err != nil {
		return 0, xerr("GetInputFocus", err)
	}
	if f == nil {
		return 0, errNilReply("GetInputFocus")
	}
	switch f.Focus {
	case xproto.InputFocusNone:
		return 0, nil
	case xproto.InputFocusPointerRoot:
		return d.windowUnderPointer()
	}
	return f.Focus, nil
}

// windowWatchMask is selected on client windows while someone watches:
// title changes, focus in and out, map and unmap.
const windowWatchMask = xproto.EventMaskPropertyChange | xproto.EventMaskFocusChange | xproto.EventMaskStructureNotify

// winWatch fans the window events of the event loop out to the watchers:
// each has its caller's kick channel and a channel of its own saying the
// set of top-level windows may have changed.
type winWatch struct {
	mu    sync.Mutex
	kicks map[chan<- struct{}]chan struct{}
}

// kick wakes every watcher without blocking (the event loop calls it).
func (w *winWatch) kick(topLevel bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, top := range w.kicks {
		nudge(k)
		if topLevel {
			nudge(top)
		}
	}
}

func nudge(c chan<- struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (w *winWatch) watching() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.kicks) > 0
}

// windowEvent hands the event loop's window events to the watchers.
func (d *Desktop) windowEvent(ev any) {
	if !d.winw.watching() {
		return
	}
	switch e := ev.(type) {
	case xproto.PropertyNotifyEvent:
		d.winw.kick(e.Window == d.root && e.Atom == d.atoms.netClientList)
	case xproto.MapNotifyEvent:
		d.winw.kick(e.Event == d.root)
	case xproto.ReparentNotifyEvent:
		d.winw.kick(e.Event == d.root)
	case xproto.CreateNotifyEvent, xproto.UnmapNotifyEvent, xproto.DestroyNotifyEvent,
		xproto.FocusInEvent, xproto.FocusOutEvent:
		d.winw.kick(false)
	}
}

// WatchWindows sends on kick (never blocking; give it a buffer of one)
// whenever the top-level windows, their mapping, their titles or the input
// focus may have changed, until ctx ends. It selects the events it needs on
// the root and on every top-level window, and deselects them when it ends.
// It returns ctx's error, or an error when the display is gone.
func (d *Desktop) WatchWindows(ctx context.Context, kick chan<- struct{}) error {
	top := make(chan struct{}, 1)
	d.winw.mu.Lock()
	if d.winw.kicks == nil {
		d.winw.kicks = map[chan<- struct{}]chan struct{}{}
	}
	first := len(d.winw.kicks) == 0
	d.winw.kicks[kick] = top
	d.winw.mu.Unlock()
	selected := map[xproto.Window]bool{}
	defer func() {
		d.winw.mu.Lock()
		delete(d.winw.kicks, kick)
		last := len(d.winw.kicks) == 0
		d.winw.mu.Unlock()
		if last && d.alive() {
			xproto.ChangeWindowAttributes(d.conn, d.root, xproto.CwEventMask, []uint32{0})
			for w := range selected {
				xproto.ChangeWindowAttributes(d.conn, w, xproto.CwEventMask, []uint32{0})
			}
		}
	}()
	if first {
		err := xproto.ChangeWindowAttributesChecked(d.conn, d.root, xproto.CwEventMask,
			[]uint32{xproto.EventMaskPropertyChange | xproto.EventMaskSubstructureNotify}).Check()
		if err != nil {
			return xerr("select root events", err)
		}
	}
	// Every top-level window, managed (_NET_CLIENT_LIST) or not (root
	// children), gets the mask; a window gone meanwhile only makes an
	// unchecked request fail.
	follow := func() {
		wm, _ := d.wmPresent()
		ids, err := d.topLevels(wm)
		if err != nil {
			return
		}
		for _, w := range ids {
			if !selected[w] {
				selected[w] = true
				xproto.ChangeWindowAttributes(d.conn, w, xproto.CwEventMask, []uint32{windowWatchMask})
			}
		}
	}
	follow()
	// Anything that happened before the masks took effect: look once more.
	nudge(kick)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-d.dead:
			return xerr("watch windows", io.EOF)
		case <-top:
			follow()
			nudge(kick)
		}
	}
}
