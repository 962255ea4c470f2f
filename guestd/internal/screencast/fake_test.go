package screencast

import (
	"context"
	"fmt"
	"image"
	"sync"
	"sync/atomic"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
)

// fakeDisplay is an in-memory screen: tests draw into it and it reports the
// drawn rectangles as damage, like X DAMAGE does.
type fakeDisplay struct {
	w, h int

	mu       sync.Mutex
	pix      []byte
	watchers map[chan<- image.Rectangle]context.Context
	cursor   desktop.Cursor
	captures atomic.Int64
	captured atomic.Int64 // pixels captured
	polls    atomic.Int64
}

func newFakeDisplay(w, h int) *fakeDisplay {
	d := &fakeDisplay{w: w, h: h, pix: make([]byte, w*h*4), watchers: map[chan<- image.Rectangle]context.Context{}}
	for i := 0; i < len(d.pix); i += 4 {
		d.pix[i], d.pix[i+1], d.pix[i+2] = 0xee, 0xee, 0xee
	}
	return d
}

func (d *fakeDisplay) ScreenSize() (int, int) { return d.w, d.h }

func (d *fakeDisplay) Capture(r image.Rectangle, dst *desktop.Frame) error {
	if r.Empty() || !r.In(image.Rect(0, 0, d.w, d.h)) {
		return fmt.Errorf("capture %v: %w", r, errdefs.ErrInvalidArgument)
	}
	d.captures.Add(1)
	d.captured.Add(int64(r.Dx() * r.Dy()))
	n := r.Dx() * r.Dy() * 4
	if cap(dst.Pix) < n {
		dst.Pix = make([]byte, n)
	}
	dst.Pix = dst.Pix[:n]
	d.mu.Lock()
	for y := r.Min.Y; y < r.Max.Y; y++ {
		copy(dst.Pix[(y-r.Min.Y)*r.Dx()*4:], d.pix[(y*d.w+r.Min.X)*4:(y*d.w+r.Max.X)*4])
	}
	d.mu.Unlock()
	dst.Stride, dst.Rect = r.Dx()*4, r
	return nil
}

func (d *fakeDisplay) WatchDamage(ctx context.Context, ch chan<- image.Rectangle) error {
	d.mu.Lock()
	d.watchers[ch] = ctx
	d.mu.Unlock()
	<-ctx.Done()
	d.mu.Lock()
	delete(d.watchers, ch)
	d.mu.Unlock()
	return ctx.Err()
}

func (d *fakeDisplay) CursorImage() (desktop.Cursor, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cursor, nil
}

func (d *fakeDisplay) CursorPosition() (int, int, error) {
	d.polls.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cursor.X, d.cursor.Y, nil
}

func (d *fakeDisplay) watching() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.watchers)
}

// draw changes r with fn(x, y) -> B, G, R and reports it as damage.
func (d *fakeDisplay) draw(r image.Rectangle, fn func(x, y int) (b, g, rr byte)) {
	d.mu.Lock()
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			o := (y*d.w + x) * 4
			d.pix[o], d.pix[o+1], d.pix[o+2] = fn(x, y)
		}
	}
	d.mu.Unlock()
	d.notify(r)
}

func (d *fakeDisplay) notify(r image.Rectangle) {
	d.mu.Lock()
	ws := make([]chan<- image.Rectangle, 0, len(d.watchers))
	ctxs := make([]context.Context, 0, len(d.watchers))
	for ch, ctx := range d.watchers {
		ws = append(ws, ch)
		ctxs = append(ctxs, ctx)
	}
	d.mu.Unlock()
	for i, ch := range ws {
		select {
		case ch <- r:
		case <-ctxs[i].Done():
		}
	}
}

// scroll moves the rows of r up by dy pixels (like a terminal scroll),
// clears the rows that came free and reports r as damage.
func (d *fakeDisplay) scroll(r image.Rectangle, dy int) {
	d.mu.Lock()
	for y := r.Min.Y; y < r.Max.Y; y++ {
		row := d.pix[(y*d.w+r.Min.X)*4 : (y*d.w+r.Max.X)*4]
		if y+dy < r.Max.Y {
			copy(row, d.pix[((y+dy)*d.w+r.Min.X)*4:((y+dy)*d.w+r.Max.X)*4])
			continue
		}
		for i := 0; i < len(row); i += 4 {
			row[i], row[i+1], row[i+2] = 0xee, 0xee, 0xee
		}
	}
	d.mu.Unlock()
	d.notify(r)
}

// glyph draws a 6x13 pattern derived from ch at text cell (col, row) of a
// terminal at (x0, y0), like a fixed font, plus a block cursor in the next
// cell, and returns the damaged rectangle.
func (d *fakeDisplay) glyph(x0, y0, col, row int, ch byte) image.Rectangle {
	const cw, chh = 6, 13
	r := image.Rect(x0+col*cw, y0+row*chh, x0+(col+2)*cw, y0+(row+1)*chh)
	d.draw(r, func(x, y int) (byte, byte, byte) {
		cx, cy := (x-x0)/cw, y-y0-row*chh
		if cx > col {
			return 0, 0, 0 // cursor block
		}
		px := x - x0 - col*cw
		h := uint32(ch)*2654435761 + uint32(cy)*40503 + uint32(px)*97
		if ch != ' ' && cy > 2 && cy < 11 && px < 5 && (h>>13)&3 == 0 {
			return 0, 0, 0
		}
		return 0xee, 0xee, 0xee
	})
	return r
}

// snapshot returns the screen as packed BGRX.
func (d *fakeDisplay) snapshot() []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]byte(nil), d.pix...)
}
