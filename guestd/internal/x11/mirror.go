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

// mirror is a whole-screen copy in guestd's own memory, refreshed from the
// rows the counting DAMAGE object reported since the previous refresh: a
// small repaint costs a GetImage of a few rows instead of the whole screen.
// The server writes the rows band by band into a small MIT-SHM segment of
// the mirror's own (so region captures, which write at the start of the
// capture segment, cannot clobber them), and each band is copied into the
// copy. The copy is private anonymous memory, not a second full-screen
// segment: once its pages were given back (a checkpoint, a pool member's
// freeze, an idle release) the next full refresh has the server fault in
// only the band's pages, not a screen's worth (1000 pages at 1280x800, each
// a trap on these VMs), and identical copies of replicas merge under KSM,
// which SysV shared memory never does. Attached on first use.
type mirror struct {
	mu   sync.Mutex
	on   bool
	err  error // attaching failed: the mirror is off for good
	seg  shm.Seg
	band []byte // the segment: two halves of rows screen rows
	rows int
	buf  []byte // the copy (mmap: outside the Go heap)
	// valid: buf holds the whole screen as of the last refresh
	valid bool
	// used is when a refresh last wrote into buf; zero: the band was given
	// back since (and the copy too unless ReleaseShared kept it).
	used time.Time
}

// mirrorBandRows is the height of each half of the band, the rows the
// server writes at a time: a 640 KiB segment at 1280 pixels wide, 13
// requests for a whole 800-row screen.
const mirrorBandRows = 64

func (m *mirror) release() {
	if !m.mu.TryLock() {
		return
	}
	defer m.mu.Unlock()
	if m.on {
		m.off()
	}
}

// off detaches the band and unmaps the copy.
func (m *mirror) off() {
	m.on, m.valid = false, false
	unix.SysvShmDetach(m.band)
	unix.Munmap(m.buf)
	m.band, m.buf = nil, nil
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
		// The band's halves take turns from the first: the rows read use
		// its first y1-y0 rows, all of it past two halves.
		populate(m.band[:min(y1-y0, 2*m.rows)*stride])
		populate(m.buf[y0*stride : y1*stride])
	}
	m.used = time.Now()
	if y1 > y0 {
		if err := d.refreshRows(m, y0, y1, stride); err != nil {
			return err
		}
	}
	m.valid = true
	n := d.width * d.height * 4
	f := desktop.Frame{Pix: m.buf[:n:n], Stride: d.width * 4, Rect: image.Rect(0, 0, d.width, d.height)}
	return fn(&f)
}

// bandRead is a GetImage of rows y to y+h into the band at off.
type bandRead struct {
	c    shm.GetImageCookie
	y, h int
	off  int
}

// refreshRows reads rows y0 to y1 of the screen into m.buf through the
// band, and turns the mirror off for good if the server refuses it.
func (d *Desktop) refreshRows(m *mirror, y0, y1, stride int) error {
	// The band's two halves take turns: the server writes the next rows
	// into one while the last rows are copied out of the other.
	half := m.rows * stride
	get := func(y, i int) bandRead {
		h := min(m.rows, y1-y)
		c := shm.GetImage(d.conn, xproto.Drawable(d.root), 0, int16(y), uint16(d.width), uint16(h),
			0xffffffff, xproto.ImageFormatZPixmap, m.seg, uint32(i*half))
		return bandRead{c: c, y: y, h: h, off: i * half}
	}
	next := get(y0, 0)
	for i := 1; ; i++ {
		cur := next
		more := cur.y+cur.h < y1
		if more {
			next = get(cur.y+cur.h, i%2)
		}
		rep, err := cur.c.Reply()
		if err == nil && rep == nil {
			err = errNilReply("shm GetImage")
		} else if err == nil && int(rep.Size) != cur.h*stride {
			err = fmt.Errorf("x11: shm GetImage returned %d bytes for %dx%d", rep.Size, d.width, cur.h)
		}
		if err != nil {
			// The rows taken are lost: the next refresh reads everything.
			m.valid = false
			if !d.alive() {
				return xerr("shm GetImage (mirror)", err)
			}
			// The server refused the segment: turn the mirror off for good
			// and let the caller capture another way.
			m.off()
			m.err = err
			return fmt.Errorf("x11: screen mirror: %v: %w", err, errdefs.ErrUnavailable)
		}
		copy(m.buf[cur.y*stride:(cur.y+cur.h)*stride], m.band[cur.off:cur.off+cur.h*stride])
		if !more {
			break
		}
	}
	return nil
}

func (d *Desktop) attachMirror(m *mirror) error {
	d.cap.mu.Lock()
	shmOn := d.cap.shmOn
	d.cap.mu.Unlock()
	if !shmOn {
		return fmt.Errorf("MIT-SHM unavailable")
	}
	rows := min(mirrorBandRows, d.height)
	buf, err := unix.Mmap(-1, 0, d.width*d.height*4, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("map the screen copy: %w", err)
	}
	seg, band, err := d.newSegment(2 * d.width * rows * 4)
	if err != nil {
		unix.Munmap(buf)
		return err
	}
	m.on, m.seg, m.band, m.rows, m.buf, m.valid = true, seg, band, rows, buf, false
	return nil
}
