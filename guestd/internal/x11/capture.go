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

// capturer reads screen pixels. With MIT-SHM the server writes the image
// into one SysV segment sized for the full screen (attached once, reused,
// marked for removal as soon as both sides are attached so it cannot leak
// past the process) and Capture copies it out; otherwise core GetImage.
type capturer struct {
	mu sync.Mutex
	// formatErr is non-nil when the root format is not 32-bit BGRX.
	formatErr error
	// shmSeg/shmBuf are valid while shmOn.
	shmOn  bool
	shmSeg shm.Seg
	shmBuf []byte
	// shmUsed is when a capture last wrote into shmBuf; zero once its pages
	// were given back (ReleaseScratch) and nothing was captured since.
	shmUsed time.Time
	// shmErr records why SHM is off (for diagnostics).
	shmErr error

	mir mirror
}

func (c *capturer) init(d *Desktop, setup *xproto.SetupInfo, scr *xproto.ScreenInfo) {
	c.formatErr = checkFormat(setup, scr)
	if c.formatErr != nil {
		return
	}
	c.shmErr = c.attachSHM(d)
}

// checkFormat insists on a ZPixmap layout of 32 bits per pixel, least
// significant byte first, with the usual 0xRRGGBB masks: memory order
// B, G, R, X, which is what desktop.Frame promises.
func checkFormat(setup *xproto.SetupInfo, scr *xproto.ScreenInfo) error {
	bpp := 0
	for _, f := range setup.PixmapFormats {
		if f.Depth == scr.RootDepth {
			bpp = int(f.BitsPerPixel)
		}
	}
	if bpp != 32 || (scr.RootDepth != 24 && scr.RootDepth != 32) || setup.ImageByteOrder != xproto.ImageOrderLSBFirst {
		return fmt.Errorf("x11: capture needs a 24/32-bit root with 32 bpp LSB-first pixels, have depth %d, %d bpp, byte order %d: %w",
			scr.RootDepth, bpp, setup.ImageByteOrder, errdefs.ErrUnavailable)
	}
	for _, dp := range scr.AllowedDepths {
		for _, v := range dp.Visuals {
			if v.VisualId == scr.RootVisual &&
				(v.RedMask != 0xff0000 || v.GreenMask != 0xff00 || v.BlueMask != 0xff) {
				return fmt.Errorf("x11: capture needs 0xRRGGBB visual masks, have %06x/%06x/%06x: %w",
					v.RedMask, v.GreenMask, v.BlueMask, errdefs.ErrUnavailable)
			}
		}
	}
	return nil
}

func (c *capturer) attachSHM(d *Desktop) error {
	if err := initExtension(d.conn, "MIT-SHM"); err != nil {
		return fmt.Errorf("MIT-SHM extension: %w", err)
	}
	seg, buf, err := d.newSegment(d.width * d.height * 4)
	if err != nil {
		return err
	}
	c.shmOn, c.shmSeg, c.shmBuf = true, seg, buf
	return nil
}

// newSegment creates a SysV segment of size bytes and attaches it on both
// sides.
func (d *Desktop) newSegment(size int) (shm.Seg, []byte, error) {
	id, err := unix.SysvShmGet(unix.IPC_PRIVATE, size, unix.IPC_CREAT|0o600)
	if err != nil {
		return 0, nil, fmt.Errorf("shmget %d bytes: %w", size, err)
	}
	// Whatever happens next, the segment must not outlive this process:
	// IPC_RMID destroys it once the last attachment goes away.
	defer unix.SysvShmCtl(id, unix.IPC_RMID, nil)
	buf, err := unix.SysvShmAttach(id, 0, 0)
	if err != nil {
		return 0, nil, fmt.Errorf("shmat: %w", err)
	}
	seg, err := shm.NewSegId(d.conn)
	if err != nil {
		unix.SysvShmDetach(buf)
		return 0, nil, xerr("allocate shm segment id", err)
	}
	if err := shm.AttachChecked(d.conn, seg, uint32(id), false).Check(); err != nil {
		// Typically a server in another IPC namespace or on another host.
		unix.SysvShmDetach(buf)
		return 0, nil, fmt.Errorf("server could not attach the segment: %w", err)
	}
	return seg, buf, nil
}

// release unmaps the segment once the connection is closed. A capture
// still holding the lock (stuck on a frozen server) keeps the mapping; the
// segment is already marked for removal, so it goes with the process.
func (c *capturer) release() {
	c.mir.release()
	if !c.mu.TryLock() {
		return
	}
	defer c.mu.Unlock()
	if !c.shmOn {
		return
	}
	c.shmOn = false
	unix.SysvShmDetach(c.shmBuf)
	c.shmBuf = nil
}

// SHMEnabled reports whether captures use MIT-SHM, and if not, why.
func (d *Desktop) SHMEnabled() (bool, error) {
	d.cap.mu.Lock()
	defer d.cap.mu.Unlock()
	return d.cap.shmOn, d.cap.shmErr
}

// Capture copies the pixels of r (root coordinates, inside the screen)
// into dst as BGRX with Stride 4*r.Dx(), reusing dst.Pix when it is large
// enough.
func (d *Desktop) Capture(r image.Rectangle, dst *desktop.Frame) error {
	if dst == nil {
		return fmt.Errorf("x11: capture: nil frame: %w", errdefs.ErrInvalidArgument)
	}
	return d.CaptureView(r, func(f *desktop.Frame) error {
		setFrame(dst, r, f.Pix)
		return nil
	})
}

// CaptureView captures r like Capture but, instead of copying the pixels
// out, calls fn with a frame that aliases the capture buffer (the MIT-SHM
// segment, or the GetImage reply). The frame is valid only until fn
// returns; fn may modify it (the next capture overwrites it anyway). Other
// captures wait until fn returns, so fn should not block. fn's error is
// returned as is.
func (d *Desktop) CaptureView(r image.Rectangle, fn func(f *desktop.Frame) error) error {
	if fn == nil {
		return fmt.Errorf("x11: capture: nil callback: %w", errdefs.ErrInvalidArgument)
	}
	if r.Empty() || !r.In(image.Rect(0, 0, d.width, d.height)) {
		return fmt.Errorf("x11: capture: rectangle %v not inside the %dx%d screen: %w", r, d.width, d.height, errdefs.ErrInvalidArgument)
	}
	if d.cap.formatErr != nil {
		return d.cap.formatErr
	}
	d.cap.mu.Lock()
	defer d.cap.mu.Unlock()
	var f desktop.Frame
	if d.cap.shmOn {
		if d.cap.shmUsed.IsZero() {
			populate(d.cap.shmBuf[:r.Dx()*r.Dy()*4])
		}
		pix, err := d.shmView(r)
		d.cap.shmUsed = time.Now()
		if err == nil {
			f = desktop.Frame{Pix: pix, Stride: r.Dx() * 4, Rect: r}
			return fn(&f)
		}
		if !d.alive() {
			return err
		}
		d.cap.shmOn, d.cap.shmErr = false, err
		unix.SysvShmDetach(d.cap.shmBuf)
		d.cap.shmBuf = nil
	}
	pix, err := d.getImageView(r)
	if err != nil {
		return err
	}
	f = desktop.Frame{Pix: pix, Stride: r.Dx() * 4, Rect: r}
	return fn(&f)
}

// shmView has the server write r into the segment and returns its bytes.
func (d *Desktop) shmView(r image.Rectangle) ([]byte, error) {
	w, h := r.Dx(), r.Dy()
	rep, err := shm.GetImage(d.conn, xproto.Drawable(d.root), int16(r.Min.X), int16(r.Min.Y),
		uint16(w), uint16(h), 0xffffffff, xproto.ImageFormatZPixmap, d.cap.shmSeg, 0).Reply()
	if err != nil {
		return nil, xerr("shm GetImage", err)
	}
	if rep == nil {
		return nil, errNilReply("shm GetImage")
	}
	n := w * h * 4
	if int(rep.Size) != n {
		return nil, fmt.Errorf("x11: shm GetImage returned %d bytes for %dx%d", rep.Size, w, h)
	}
	return d.cap.shmBuf[:n:n], nil
}

// getImageView fetches r with core GetImage and returns the reply's bytes.
func (d *Desktop) getImageView(r image.Rectangle) ([]byte, error) {
	w, h := r.Dx(), r.Dy()
	rep, err := xproto.GetImage(d.conn, xproto.ImageFormatZPixmap, xproto.Drawable(d.root),
		int16(r.Min.X), int16(r.Min.Y), uint16(w), uint16(h), 0xffffffff).Reply()
	if err != nil {
		return nil, xerr("GetImage", err)
	}
	if rep == nil {
		return nil, errNilReply("GetImage")
	}
	n := w * h * 4
	if len(rep.Data) < n {
		return nil, fmt.Errorf("x11: GetImage returned %d bytes for %dx%d", len(rep.Data), w, h)
	}
	return rep.Data[:n:n], nil
}

func setFrame(dst *desktop.Frame, r image.Rectangle, pix []byte) {
	if cap(dst.Pix) >= len(pix) {
		dst.Pix = dst.Pix[:len(pix)]
	} else {
		dst.Pix = make([]byte, len(pix))
	}
	copy(dst.Pix, pix)
	dst.Stride = r.Dx() * 4
	dst.Rect = r
}

// ReleaseScratch gives the pages of the capture segments nothing captured
// into for at least idle back to the kernel (MADV_REMOVE; idle 0: every
// segment) and returns how many bytes that was. They are scratch the next
// capture rewrites (faulting them back in), but SysV shared memory is not
// merged by KSM: every replica of a checkpoint would keep its own copy, and
// CRIU would dump it. The mirror's private copy of the screen goes too: a
// dump would carry it into every replica.
func (d *Desktop) ReleaseScratch(idle time.Duration) int {
	return d.release(idle, false)
}

// ReleaseShared gives back the shared-memory segments only (the capture
// segment and the mirror's band) and keeps the mirror's copy of the screen,
// valid: what a frozen pool member holds. The copy is private memory that
// KSM merges with the identical copies of the member's siblings, and the
// first capture after the claim reads only the rows drawn since instead of
// faulting in a whole screen (1000 pages at 1280x800). The idle release
// leaves the kept copy alone until a capture uses it again: a thawed
// member's overdue idle check would otherwise drop it right at the claim.
func (d *Desktop) ReleaseShared() int {
	return d.release(0, true)
}

func (d *Desktop) release(idle time.Duration, keepCopy bool) int {
	n := 0
	d.cap.mu.Lock()
	if d.cap.shmOn && stale(d.cap.shmUsed, idle) && unix.Madvise(d.cap.shmBuf, unix.MADV_REMOVE) == nil {
		n += len(d.cap.shmBuf)
		d.cap.shmUsed = time.Time{}
	}
	d.cap.mu.Unlock()
	m := &d.cap.mir
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.on || !stale(m.used, idle) || unix.Madvise(m.band, unix.MADV_REMOVE) != nil {
		return n
	}
	n += len(m.band)
	m.used = time.Time{}
	if !keepCopy && unix.Madvise(m.buf, unix.MADV_DONTNEED) == nil {
		n += len(m.buf)
		m.valid = false // the mirror is refreshed in full next time
	}
	return n
}

// populate brings in the pages of a range about to be written that were
// given back or never used (a segment the X server writes into, the
// mirror's copy): one madvise instead of a page fault per page, each a trap
// to the hypervisor on these VMs (a first page touch costs 2 to 14 us; a
// full-screen frame is 1000 pages). The server still maps a segment's pages
// in its own address space on its writes, but no longer allocates them. A
// kernel without MADV_POPULATE_WRITE (before 5.14) only keeps the faults.
func populate(b []byte) {
	if len(b) > 0 {
		_ = unix.Madvise(b, unix.MADV_POPULATE_WRITE)
	}
}

// stale reports whether a buffer last written at used (zero: nothing held
// since its last release) is due for release after idle (0: always).
func stale(used time.Time, idle time.Duration) bool {
	return idle <= 0 || (!used.IsZero() && time.Since(used) >= idle)
}
