//go:build linux

package x11

import (
	"fmt"
	"image"
	"sync"
	"time"

	"github.com/jezek/xgb/shm"
	"github.com/jezek/xgb/xproto"
	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
)

// mirror is a whole-screen copy in a second MIT-SHM segment (so region
// captures, which write at the start of the first one, cannot clobber it).
// It is refreshed from the rows the counting DAMAGE object reported since
// the previous refresh: a small repaint costs a GetImage of a few rows
// instead of the whole screen. The segment is attached on first use.
type mirror struct {
	mu    sync.Mutex
	on    bool
	err   error // attaching failed: the mirror is off for good
	seg   shm.Seg
	buf   []byte
	valid bool // buf holds the whole screen as of the last refresh
	// used is when a refresh last wrote into buf (zero: released since).
	used time.Time
}

func (m *mirror) release() {
	if !m.mu.TryLock() {
		return
	}
	defer m.mu.Unlock()
	if m.on {
		m.on, m.valid = false, false
		unix.SysvShmDetach(m.buf)
		m.buf = nil
	}
}

// dirtyRows is the band of screen rows drawn to since the mirror last took
// it; the event goroutine widens it for every counted DAMAGE event.
type dirtyRows struct {
	mu     sync.Mutex
	y0, y1 int // empty when y0 >= y1
}

func (r *dirtyRows) add(a xproto.Rectangle) {
	y0, y1 := int(a.Y), int(a.Y)+int(a.Height)
	if y1 <= y0 {
		return
	}
	r.mu.Lock()
	if r.y0 >= r.y1 {
		r.y0, r.y1 = y0, y1
	} else {
		r.y0, r.y1 = min(r.y0, y0), max(r.y1, y1)
	}
	r.mu.Unlock()
}

func (r *dirtyRows) take() (y0, y1 int) {
	r.mu.Lock()
	y0, y1 = r.y0, r.y1
	r.y0, r.y1 = 0, 0
	r.mu.Unlock()
	return y0, y1
}

// CaptureScreenSynced calls fn with the whole screen, read from a mirror
// that only re-reads the rows DAMAGE reported as drawn since its last
// refresh. The frame reflects every drawing the X server processed before
// the caller's most recent DamageSeqSync returned, so call DamageSeqSync
// first (at or after the moment the frame must reflect). The frame aliases
// the mirror and is valid only until fn returns; fn must not modify it.
// Other CaptureScreenSynced calls wait for fn; Capture and CaptureView do
// not. It fails with an error wrapping errdefs.ErrUnavailable, before
// calling fn, when the server cannot support a mirror (no DAMAGE counting
// or no MIT-SHM); fn's error is returned as is.
func (d *Desktop) CaptureScreenSynced(fn func(f *desktop.Frame) error) error {
	if fn == nil {
		return fmt.Errorf("x11: capture: nil callback: %w", errdefs.ErrInvalidArgument)
	}
	if d.seq.err != nil {
		return fmt.Errorf("x11: screen mirror: %v: %w", d.seq.err, errdefs.ErrUnavailable)
	}
	if d.cap.formatErr != nil {
		return d.cap.formatErr
	}
	m := &d.cap.mir
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.on {
		if m.err == nil {
			m.err = d.attachMirror(m)
		}
		if m.err != nil {
			return fmt.Errorf("x11: screen mirror: %v: %w", m.err, errdefs.ErrUnavailable)
		}
	}
	// Rows drawn after this take are either inside the rows read below or
	// reported again for the next refresh.
	y0, y1 := d.seq.dirty.take()
	if !m.valid {
		y0, y1 = 0, d.height
	}
	y0, y1 = max(y0, 0), min(y1, d.height)
	stride := d.width * 4
	if m.used.IsZero() && y1 > y0 {
		populate(m.buf[y0*stride : y1*stride])
	}
	m.used = time.Now()
	if y1 > y0 {
		h := y1 - y0
		rep, err := shm.GetImage(d.conn, xproto.Drawable(d.root), 0, int16(y0), uint16(d.width), uint16(h),
			0xffffffff, xproto.ImageFormatZPixmap, m.seg, uint32(y0*stride)).Reply()
		if err == nil && rep == nil {
			err = errNilReply("shm GetImage")
		} else if err == nil && int(rep.Size) != h*stride {
			err = fmt.Errorf("x11: shm GetImage returned %d bytes for %dx%d", rep.Size, d.width, h)
		}
		if err != nil {
			// The rows taken are lost: the next refresh reads everything.
			m.valid = false
			if !d.alive() {
				return xerr("shm GetImage (mirror)", err)
			}
			// The server refused the segment: turn the mirror off for good
			// and let the caller capture another way.
			m.on, m.err = false, err
			unix.SysvShmDetach(m.buf)
			m.buf = nil
			return fmt.Errorf("x11: screen mirror: %v: %w", err, errdefs.ErrUnavailable)
		}
	}
	m.valid = true
	n := d.width * d.height * 4
	f := desktop.Frame{Pix: m.buf[:n:n], Stride: d.width * 4, Rect: image.Rect(0, 0, d.width, d.height)}
	return fn(&f)
}

func (d *Desktop) attachMirror(m *mirror) error {
	d.cap.mu.Lock()
	shmOn := d.cap.shmOn
	d.cap.mu.Unlock()
	if !shmOn {
		return fmt.Errorf("MIT-SHM unavailable")
	}
	seg, buf, err := d.newSegment()
	if err != nil {
		return err
	}
	m.on, m.seg, m.buf, m.valid = true, seg, buf, false
	return nil
}
