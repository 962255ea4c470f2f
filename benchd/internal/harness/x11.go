//go:build linux

package harness

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"
)

// waitWM waits until a window manager owns the screen's WM_S0 selection
// (openbox takes it on start).
func waitWM(ctx context.Context, display string) error {
	c, err := xgb.NewConnDisplay(display)
	if err != nil {
		return err
	}
	defer c.Close()
	atom, err := xproto.InternAtom(c, false, uint16(len("WM_S0")), "WM_S0").Reply()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		o, err := xproto.GetSelectionOwner(c, atom.Atom).Reply()
		if err == nil && o.Owner != 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("window manager did not take WM_S0 within 10s")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// rootSample fetches a downsampled view of the root window (every 16th pixel
// of every 16th row) to tell whether a scene has painted.
func rootSample(display string) ([]byte, error) {
	c, err := xgb.NewConnDisplay(display)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	root := xproto.Setup(c).DefaultScreen(c).Root
	var out []byte
	for y := 0; y < Height; y += 16 {
		img, err := xproto.GetImage(c, xproto.ImageFormatZPixmap, xproto.Drawable(root), 0, int16(y), Width, 1, 0xffffffff).Reply()
		if err != nil {
			return nil, err
		}
		for x := 0; x < Width; x += 16 {
			out = append(out, img.Data[4*x:4*x+3]...)
		}
	}
	return out, nil
}

// waitPainted waits until the screen stops changing and shows at least
// minColors distinct sampled colors: the scene is on screen and settled.
func waitPainted(ctx context.Context, display string, minColors int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var prev []byte
	stable := 0
	for {
		s, err := rootSample(display)
		if err != nil {
			return err
		}
		colors := map[[3]byte]bool{}
		for i := 0; i+2 < len(s); i += 3 {
			colors[[3]byte{s[i], s[i+1], s[i+2]}] = true
		}
		if len(colors) >= minColors && prev != nil && string(prev) == string(s) {
			stable++
			if stable >= 3 {
				return nil
			}
		} else {
			stable = 0
		}
		prev = s
		if time.Now().After(deadline) {
			return fmt.Errorf("scene did not settle with >= %d colors within %s (saw %d)", minColors, timeout, len(colors))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Toucher repaints one pixel in the screen's bottom-right corner with a new
// colour on every Touch: a change guestd must capture and encode, so a
// screenshot after it measures the capture and encode path. (A static screen
// is answered from guestd's cache of the last frame.)
type Toucher struct {
	conn *xgb.Conn
	win  xproto.Window
	n    uint32
}

// NewToucher maps a 1x1 override-redirect window over the screen's
// bottom-right pixel.
func (dt *Desktop) NewToucher() (*Toucher, error) {
	conn, err := xgb.NewConnDisplay(dt.Name())
	if err != nil {
		return nil, fmt.Errorf("toucher: connect %s: %w", dt.Name(), err)
	}
	scr := xproto.Setup(conn).DefaultScreen(conn)
	win, err := xproto.NewWindowId(conn)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("toucher: %w", err)
	}
	err = xproto.CreateWindowChecked(conn, 0, win, scr.Root, int16(scr.WidthInPixels-1), int16(scr.HeightInPixels-1), 1, 1, 0,
		xproto.WindowClassInputOutput, scr.RootVisual, xproto.CwBackPixel|xproto.CwOverrideRedirect, []uint32{0, 1}).Check()
	if err == nil {
		err = xproto.MapWindowChecked(conn, win).Check()
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("toucher: window: %w", err)
	}
	return &Toucher{conn: conn, win: win}, nil
}

// Touch gives the pixel its next colour and returns once the server drew it.
func (t *Toucher) Touch() error {
	t.n++
	rgb := (t.n * 0x9e3779b1) & 0xffffff
	if err := xproto.ChangeWindowAttributesChecked(t.conn, t.win, xproto.CwBackPixel, []uint32{rgb}).Check(); err != nil {
		return fmt.Errorf("toucher: %w", err)
	}
	if err := xproto.ClearAreaChecked(t.conn, false, t.win, 0, 0, 1, 1).Check(); err != nil {
		return fmt.Errorf("toucher: %w", err)
	}
	return nil
}

// Close unmaps the window and disconnects.
func (t *Toucher) Close() {
	xproto.DestroyWindow(t.conn, t.win)
	t.conn.Close()
}
