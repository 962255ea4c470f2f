//go:build linux

package x11

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jezek/xgb/xproto"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// WaitWMAnswers waits until the window manager answers clients from its
// event loop. A window manager announces itself (the EWMH check window) in
// the middle of its startup, and openbox drops what clients ask of it until
// its event loop runs: a window mapped then is never managed, and a
// configure request then is never answered, which an Xt application such as
// xterm waits out for its wmTimeout (5 s) before it maps its window. So the
// session's apps start only after the window manager answered a request of
// guestd's own, asked again until it does: the frame extents of an unmapped
// window (_NET_REQUEST_FRAME_EXTENTS, which EWMH asks a window manager to
// answer by setting _NET_FRAME_EXTENTS on the window).
//
// A window manager that does not list _NET_REQUEST_FRAME_EXTENTS in
// _NET_SUPPORTED cannot be asked: the error wraps errdefs.ErrInvalidArgument at
// once. ctx bounds the wait (errdefs.ErrDeadlineExceeded).
func (d *Desktop) WaitWMAnswers(ctx context.Context) error {
	ok, err := d.wmSupports(d.atoms.netRequestFrameExtents)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("x11: the window manager does not support _NET_REQUEST_FRAME_EXTENTS: %w", errdefs.ErrInvalidArgument)
	}
	wid, err := xproto.NewWindowId(d.conn)
	if err != nil {
		return xerr("allocate window id", err)
	}
	// A plain top-level window (not override-redirect, which window
	// managers ignore), never mapped.
	err = xproto.CreateWindowChecked(d.conn, 0, wid, d.root, -10, -10, 1, 1, 0,
		xproto.WindowClassInputOutput, 0, 0, nil).Check()
	if err != nil {
		return xerr("create frame extents window", err)
	}
	defer xproto.DestroyWindow(d.conn, wid)
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	for i := 0; ; i++ {
		// openbox also drops a request that comes during its startup:
		// ask again every few probes until it answers.
		if i%wmAskEvery == 0 {
			if err := d.clientMessage(wid, d.atoms.netRequestFrameExtents); err != nil {
				return err
			}
		}
		r, err := xproto.GetProperty(d.conn, false, wid, d.atoms.netFrameExtents, xproto.AtomCardinal, 0, 4).Reply()
		if err != nil {
			return xerr("read _NET_FRAME_EXTENTS", err)
		}
		if ext, ok := propUint32s(r); ok && len(ext) == 4 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("x11: waiting for the window manager to answer _NET_REQUEST_FRAME_EXTENTS: %w", ctxErr(ctx))
		case <-t.C:
		}
	}
}

// wmAskEvery is how many 1 ms probes WaitWMAnswers makes between requests.
const wmAskEvery = 5

// wmSupports reports whether the window manager lists atom in the root
// window's _NET_SUPPORTED.
func (d *Desktop) wmSupports(atom xproto.Atom) (bool, error) {
	r, err := xproto.GetProperty(d.conn, false, d.root, d.atoms.netSupported, xproto.AtomAtom, 0, 1024).Reply()
	if err != nil {
		return false, xerr("read _NET_SUPPORTED", err)
	}
	v, ok := propUint32s(r)
	return ok && slices.Contains(v, uint32(atom)), nil
}
