//go:build linux

package x11

import (
	"context"
	"errors"
	"io"
	"log"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"

	"github.com/forkfleet/forkfleet/api/desktoptest"
)

const (
	openboxPath = "/usr/bin/openbox"
	screenW     = 1280
	screenH     = 800
)

// testX is a private Xvfb (and optionally openbox) for one test.
type testX struct {
	display string
	xvfb    *desktoptest.Xvfb
	wm      *exec.Cmd
}

func init() {
	// xgb logs recoverable conditions (no ~/.Xauthority, server killed by
	// a test) to stderr.
	xgb.Logger = log.New(io.Discard, "", 0)
	// Tests read key events and keymaps, and check WM effects, on a host
	// that may be heavily loaded: give the asynchronous parts more slack
	// than production needs.
	remapFallbackDelay = time.Second
	wmSettle = 2 * time.Second
}

// needXvfb skips when Xvfb is missing, unless FORKFLEET_INTEGRATION=1
// demands the real-X tests, in which case it fails.
func needXvfb(tb testing.TB) { tb.Helper(); desktoptest.NeedXvfb(tb, false) }

// startX starts Xvfb on a free display and stops it when the test ends.
func startX(tb testing.TB) *testX {
	tb.Helper()
	s := desktoptest.NewXvfb(tb, desktoptest.XvfbOptions{Width: screenW, Height: screenH})
	x := &testX{display: s.Name(), xvfb: s}
	tb.Cleanup(x.stop)
	return x
}

func (x *testX) stop() {
	if x.wm != nil {
		x.wm.Process.Kill()
		x.wm.Wait()
		x.wm = nil
	}
	x.xvfb.Stop()
}

// startWM starts openbox, skipping the test when it is not installed, and
// waits until it announces itself through EWMH.
func (x *testX) startWM(t *testing.T, d *Desktop) {
	t.Helper()
	if _, err := os.Stat(openboxPath); err != nil {
		if os.Getenv("FORKFLEET_INTEGRATION") == "1" {
			t.Fatalf("FORKFLEET_INTEGRATION=1 but %s is missing", openboxPath)
		}
		t.Skipf("%s not installed: EWMH window-manager tests skipped", openboxPath)
	}
	cmd := exec.Command(openboxPath, "--sm-disable")
	cmd.Env = append(os.Environ(), "DISPLAY="+x.display)
	cmd.Dir = t.TempDir()
	cmd.Env = append(cmd.Env, "HOME="+cmd.Dir, "XDG_CONFIG_HOME="+cmd.Dir)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start openbox: %v", err)
	}
	x.wm = cmd
	waitFor(t, 10*time.Second, "openbox to announce itself", func() bool {
		st, err := d.Ready(context.Background())
		return err == nil && st.WMUp
	})
	// openbox announces itself before it manages new windows (a window
	// mapped in between is never managed): wait for it the way guestd does
	// before it starts the session's apps.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.WaitWMAnswers(ctx); err != nil {
		t.Fatalf("openbox answering: %v", err)
	}
}

func waitFor(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func openDesktop(tb testing.TB, x *testX) *Desktop {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := Open(ctx, x.display)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { d.Close() })
	return d
}

// client is a second X connection playing an application.
type client struct {
	tb     testing.TB
	conn   *xgb.Conn
	root   xproto.Window
	visual xproto.Visualid
	events chan xgb.Event
}

func newClient(tb testing.TB, x *testX) *client {
	tb.Helper()
	conn, err := xgb.NewConnDisplay(x.display)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(conn.Close)
	scr := xproto.Setup(conn).DefaultScreen(conn)
	c := &client{tb: tb, conn: conn, root: scr.Root, visual: scr.RootVisual, events: make(chan xgb.Event, 4096)}
	go func() {
		for {
			ev, err := conn.WaitForEvent()
			if ev == nil && err == nil {
				close(c.events)
				return
			}
			if ev != nil {
				c.events <- ev
			}
		}
	}()
	return c
}

func (c *client) sync() {
	c.tb.Helper()
	if _, err := xproto.GetInputFocus(c.conn).Reply(); err != nil {
		c.tb.Fatal(err)
	}
}

func (c *client) atom(name string) xproto.Atom {
	c.tb.Helper()
	r, err := xproto.InternAtom(c.conn, false, uint16(len(name)), name).Reply()
	if err != nil {
		c.tb.Fatal(err)
	}
	return r.Atom
}

// fill paints rectangles of the root in a 0xRRGGBB colour.
func (c *client) fill(d xproto.Drawable, rgb uint32, rects ...xproto.Rectangle) {
	c.tb.Helper()
	gc, err := xproto.NewGcontextId(c.conn)
	if err != nil {
		c.tb.Fatal(err)
	}
	if err := xproto.CreateGCChecked(c.conn, gc, d, xproto.GcForeground, []uint32{rgb}).Check(); err != nil {
		c.tb.Fatal(err)
	}
	xproto.PolyFillRectangle(c.conn, d, gc, rects)
	xproto.FreeGC(c.conn, gc)
	c.sync()
}

type winOpts struct {
	x, y, w, h       int
	override         bool
	eventMask        uint32
	title, class     string
	instance         string
	pid              uint32
	deleteWindowProt bool
}

func (c *client) window(o winOpts) xproto.Window {
	c.tb.Helper()
	wid, err := xproto.NewWindowId(c.conn)
	if err != nil {
		c.tb.Fatal(err)
	}
	ovr := uint32(0)
	if o.override {
		ovr = 1
	}
	err = xproto.CreateWindowChecked(c.conn, 0, wid, c.root, int16(o.x), int16(o.y), uint16(o.w), uint16(o.h), 0,
		xproto.WindowClassInputOutput, c.visual,
		xproto.CwBackPixel|xproto.CwOverrideRedirect|xproto.CwEventMask,
		[]uint32{0xc0c0c0, ovr, o.eventMask}).Check()
	if err != nil {
		c.tb.Fatal(err)
	}
	set := func(prop, typ xproto.Atom, format byte, data []byte) {
		n := uint32(len(data))
		if format == 32 {
			n /= 4
		}
		xproto.ChangeProperty(c.conn, xproto.PropModeReplace, wid, prop, typ, format, n, data)
	}
	if o.title != "" {
		set(xproto.AtomWmName, xproto.AtomString, 8, []byte(o.title))
		set(c.atom("_NET_WM_NAME"), c.atom("UTF8_STRING"), 8, []byte(o.title))
	}
	if o.class != "" {
		set(xproto.AtomWmClass, xproto.AtomString, 8, []byte(o.instance+"\x00"+o.class+"\x00"))
	}
	if o.pid != 0 {
		set(c.atom("_NET_WM_PID"), xproto.AtomCardinal, 32, le32(o.pid))
	}
	if o.deleteWindowProt {
		set(c.atom("WM_PROTOCOLS"), xproto.AtomAtom, 32, le32(uint32(c.atom("WM_DELETE_WINDOW"))))
	}
	xproto.MapWindow(c.conn, wid)
	c.sync()
	return wid
}

func le32(v uint32) []byte { return []byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)} }

// next returns the next event accepted by match, failing after timeout.
func (c *client) next(timeout time.Duration, what string, match func(xgb.Event) bool) xgb.Event {
	c.tb.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-c.events:
			if !ok {
				c.tb.Fatalf("connection closed waiting for %s", what)
			}
			if match(ev) {
				return ev
			}
		case <-deadline:
			c.tb.Fatalf("timed out waiting for %s", what)
		}
	}
}

// poll returns the next event accepted by match, or false when none came
// within quiet.
func (c *client) poll(quiet time.Duration, match func(xgb.Event) bool) (xgb.Event, bool) {
	timer := time.NewTimer(quiet)
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-c.events:
			if !ok {
				return nil, false
			}
			if match(ev) {
				return ev, true
			}
		case <-timer.C:
			return nil, false
		}
	}
}

// drain discards queued events.
func (c *client) drain() {
	for {
		select {
		case <-c.events:
		case <-time.After(20 * time.Millisecond):
			return
		}
	}
}

func isErr(err, target error) bool { return err != nil && errors.Is(err, target) }
