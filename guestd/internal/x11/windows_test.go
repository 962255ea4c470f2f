//go:build linux

package x11

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
)

func findWindow(t *testing.T, d *Desktop, id xproto.Window) (desktop.Window, bool) {
	t.Helper()
	ws, err := d.ListWindows()
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if w.ID == uint32(id) {
			return w, true
		}
	}
	return desktop.Window{}, false
}

func mustFind(t *testing.T, d *Desktop, id xproto.Window) desktop.Window {
	t.Helper()
	w, ok := findWindow(t, d, id)
	if !ok {
		t.Fatalf("window 0x%x not listed", id)
	}
	return w
}

func expectDeleteRequest(t *testing.T, c *client, win xproto.Window) {
	t.Helper()
	protos, del := c.atom("WM_PROTOCOLS"), c.atom("WM_DELETE_WINDOW")
	c.next(3*time.Second, "WM_DELETE_WINDOW", func(e xgb.Event) bool {
		m, ok := e.(xproto.ClientMessageEvent)
		return ok && m.Window == win && m.Type == protos && m.Data.Data32[0] == uint32(del)
	})
}

func TestWindowsNoWM(t *testing.T) {
	x := startX(t)
	d := openDesktop(t, x)
	c := newClient(t, x)
	a := c.window(winOpts{x: 50, y: 60, w: 300, h: 200, title: "Éditeur — notes", class: "Gedit", instance: "gedit", pid: 4242, deleteWindowProt: true})
	b := c.window(winOpts{x: 400, y: 100, w: 200, h: 100, title: "plain", class: "XTerm", instance: "xterm"})
	c.window(winOpts{x: 0, y: 0, w: 10, h: 10, override: true}) // menus/tooltips are not listed

	ws, err := d.ListWindows()
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 2 {
		t.Fatalf("listed %d windows: %+v", len(ws), ws)
	}
	wa := mustFind(t, d, a)
	if wa.Title != "Éditeur — notes" || wa.Class != "Gedit" || wa.Instance != "gedit" || wa.PID != 4242 ||
		wa.X != 50 || wa.Y != 60 || wa.Width != 300 || wa.Height != 200 || wa.Minimized || wa.Maximized {
		t.Fatalf("window a: %+v", wa)
	}

	if err := d.ActivateWindow(uint32(b)); err != nil {
		t.Fatal(err)
	}
	if w := mustFind(t, d, b); !w.Focused {
		t.Fatalf("b not focused after activate: %+v", w)
	}
	if w := mustFind(t, d, a); w.Focused {
		t.Fatal("a still focused")
	}

	if err := d.MoveResizeWindow(uint32(a), 10, 20, 640, 480); err != nil {
		t.Fatal(err)
	}
	if w := mustFind(t, d, a); w.X != 10 || w.Y != 20 || w.Width != 640 || w.Height != 480 {
		t.Fatalf("after move/resize: %+v", w)
	}
	if err := d.MoveResizeWindow(uint32(a), 0, 0, 0, 10); !isErr(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("zero width: %v", err)
	}

	if err := d.SetWindowState(uint32(a), desktop.WindowMaximize); !isErr(err, errdefs.ErrUnavailable) {
		t.Fatalf("maximize without WM: %v", err)
	}

	if err := d.CloseWindow(uint32(a)); err != nil {
		t.Fatal(err)
	}
	expectDeleteRequest(t, c, a)
	// b has no WM_DELETE_WINDOW: it is destroyed.
	if err := d.CloseWindow(uint32(b)); err != nil {
		t.Fatal(err)
	}
	if _, ok := findWindow(t, d, b); ok {
		t.Fatal("b still listed after close")
	}

	for name, err := range map[string]error{
		"activate": d.ActivateWindow(0xdead),
		"close":    d.CloseWindow(0xdead),
		"move":     d.MoveResizeWindow(0xdead, 0, 0, 10, 10),
		"state":    d.SetWindowState(0xdead, desktop.WindowMinimize),
	} {
		if !isErr(err, errdefs.ErrNotFound) {
			t.Errorf("%s unknown window: %v", name, err)
		}
	}
}

func TestWindowsOpenbox(t *testing.T) {
	x := startX(t)
	d := openDesktop(t, x)
	x.startWM(t, d)
	c := newClient(t, x)
	a := c.window(winOpts{x: 50, y: 60, w: 300, h: 200, title: "alpha ✓", class: "Alpha", instance: "alpha", pid: 11, deleteWindowProt: true})
	b := c.window(winOpts{x: 400, y: 100, w: 320, h: 240, title: "beta", class: "Beta", instance: "beta", pid: 12})
	waitFor(t, 5*time.Second, "openbox to manage both windows", func() bool {
		_, okA := findWindow(t, d, a)
		_, okB := findWindow(t, d, b)
		return okA && okB
	})
	// openbox focuses new windows shortly after managing them; let it
	// finish with b so it does not undo the activations below.
	waitFor(t, 5*time.Second, "openbox to focus the newest window", func() bool {
		w, ok := findWindow(t, d, b)
		return ok && w.Focused
	})
	wa := mustFind(t, d, a)
	if wa.Title != "alpha ✓" || wa.Class != "Alpha" || wa.PID != 11 || wa.Width != 300 || wa.Height != 200 {
		t.Fatalf("window a: %+v", wa)
	}
	if st, err := d.Ready(t.Context()); err != nil || !st.WMUp || !st.XUp {
		t.Fatalf("ready with openbox: %+v %v", st, err)
	}

	for _, id := range []xproto.Window{a, b, a} {
		if err := d.ActivateWindow(uint32(id)); err != nil {
			t.Fatal(err)
		}
		if w := mustFind(t, d, id); !w.Focused {
			t.Fatalf("0x%x not focused after activate", id)
		}
	}

	// The client area lands where asked, decorations notwithstanding.
	if err := d.MoveResizeWindow(uint32(b), 200, 150, 500, 300); err != nil {
		t.Fatal(err)
	}
	if w := mustFind(t, d, b); w.X != 200 || w.Y != 150 || w.Width != 500 || w.Height != 300 {
		t.Fatalf("after move/resize: %+v", w)
	}

	if err := d.SetWindowState(uint32(b), desktop.WindowMaximize); err != nil {
		t.Fatal(err)
	}
	if w := mustFind(t, d, b); !w.Maximized || w.Width < 1000 {
		t.Fatalf("after maximize: %+v", w)
	}
	if err := d.SetWindowState(uint32(b), desktop.WindowRestore); err != nil {
		t.Fatal(err)
	}
	if w := mustFind(t, d, b); w.Maximized || w.Width != 500 {
		t.Fatalf("after restore: %+v", w)
	}
	if err := d.SetWindowState(uint32(b), desktop.WindowMinimize); err != nil {
		t.Fatal(err)
	}
	if w := mustFind(t, d, b); !w.Minimized {
		t.Fatalf("after minimize: %+v", w)
	}
	if err := d.SetWindowState(uint32(b), desktop.WindowRestore); err != nil {
		t.Fatal(err)
	}
	if w := mustFind(t, d, b); w.Minimized {
		t.Fatalf("after restore from minimized: %+v", w)
	}
	if err := d.SetWindowState(uint32(b), desktop.WindowFullscreen); err != nil {
		t.Fatal(err)
	}
	if w := mustFind(t, d, b); w.X != 0 || w.Y != 0 || w.Width != screenW || w.Height != screenH {
		t.Fatalf("after fullscreen: %+v", w)
	}
	if err := d.SetWindowState(uint32(b), desktop.WindowRestore); err != nil {
		t.Fatal(err)
	}

	c.drain()
	if err := d.CloseWindow(uint32(a)); err != nil {
		t.Fatal(err)
	}
	expectDeleteRequest(t, c, a)
	if err := d.SetWindowState(uint32(a), desktop.WindowState(99)); !isErr(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("bad state: %v", err)
	}
	if err := d.ActivateWindow(0xdead); !isErr(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown window: %v", err)
	}
}

// TestWatchWindowsAndFocus: the window watcher wakes on a window being
// mapped, retitled and focused under openbox, and InputFocus names the
// client window (not openbox's frame).
func TestWatchWindowsAndFocus(t *testing.T) {
	x := startX(t)
	d := openDesktop(t, x)
	x.startWM(t, d)
	c := newClient(t, x)
	ctx, cancel := context.WithCancel(context.Background())
	kick := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() { done <- d.WatchWindows(ctx, kick) }()
	defer func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("WatchWindows: %v", err)
		}
	}()
	// waitUntil waits for kicks until cond holds: only events wake it (no
	// polling), so a missed event fails the test.
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for !cond() {
			select {
			case <-kick:
			case <-deadline:
				t.Fatalf("no window event brought %s", what)
			}
		}
	}
	<-kick // the first look after the masks took effect
	w := c.window(winOpts{x: 10, y: 10, w: 200, h: 100, title: "loading", class: "Browser", instance: "browser"})
	waitUntil("the window mapped and focused", func() bool {
		got, ok := findWindow(t, d, w)
		f, err := d.InputFocus()
		return ok && got.Mapped && err == nil && f == uint32(w)
	})
	xproto.ChangeProperty(c.conn, xproto.PropModeReplace, w, c.atom("_NET_WM_NAME"), c.atom("UTF8_STRING"), 8, 5, []byte("ready"))
	c.sync()
	waitUntil("the new title", func() bool {
		got, ok := findWindow(t, d, w)
		return ok && got.Title == "ready"
	})
	xproto.UnmapWindow(c.conn, w)
	c.sync()
	waitUntil("the window unmapped", func() bool {
		got, ok := findWindow(t, d, w)
		return !ok || !got.Mapped
	})
}
