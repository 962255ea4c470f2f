//go:build linux

package x11

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jezek/xgb/xproto"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// TestWaitWMAnswers: without a window manager, or with one that cannot be
// asked, WaitWMAnswers says so at once; with one that lists the request but
// never answers, it ends with ctx; with openbox it returns once openbox
// answers, and a window mapped right after is managed (a window mapped
// between openbox's announcement and its event loop never is: the race
// that made an xterm wait 5 s for openbox at one boot in ten).
func TestWaitWMAnswers(t *testing.T) {
	x := startX(t)
	d := openDesktop(t, x)
	if err := d.WaitWMAnswers(t.Context()); !isErr(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("no window manager: %v, want ErrInvalid", err)
	}

	// A "window manager" that lists _NET_REQUEST_FRAME_EXTENTS and never
	// answers.
	c := newClient(t, x)
	supported := c.atom("_NET_SUPPORTED")
	xproto.ChangeProperty(c.conn, xproto.PropModeReplace, c.root, supported, xproto.AtomAtom, 32, 1,
		le32(uint32(c.atom("_NET_REQUEST_FRAME_EXTENTS"))))
	c.sync()
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	err := d.WaitWMAnswers(ctx)
	cancel()
	if !isErr(err, errdefs.ErrDeadlineExceeded) {
		t.Fatalf("silent window manager: %v, want ErrTimeout", err)
	}
	xproto.DeleteProperty(c.conn, c.root, supported)
	c.sync()

	x.startWM(t, d) // returns once WaitWMAnswers did
	w := c.window(winOpts{x: 40, y: 40, w: 200, h: 100, title: "right after"})
	waitFor(t, 10*time.Second, "openbox to manage a window mapped right after it answered", func() bool {
		ids, err := d.topLevels(true)
		return err == nil && slices.Contains(ids, w)
	})
	if ok, err := d.wmSupports(d.atoms.netRequestFrameExtents); err != nil || !ok {
		t.Fatalf("openbox lists _NET_REQUEST_FRAME_EXTENTS: %v %v", ok, err)
	}
}
