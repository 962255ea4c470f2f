package aci

import (
	"bytes"
	"context"
	"errors"
	"image"
	"time"
	"unsafe"

	"github.com/zeebo/xxh3"

	"github.com/forkfleet/forkfleet/api/errdefs"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
	"github.com/forkfleet/forkfleet/guestd/internal/encode"
)

const (
	defaultJPEGQuality    = 80
	defaultSettleTimeout  = time.Second
	maxSettle             = 60 * time.Second
	shrinkBuffersAbove    = 64 << 20
	hashLen               = 16
	maxScreenshotLongEdge = 1 << 14
)

// executorState is owned by the session's executor goroutine: buffers reused
// across requests so a steady stream of screenshots allocates nothing.
type executorState struct {
	hello      bool
	wantsReady bool
	zlibTiles  bool // the client takes zlib screencast tiles

	frame  desktop.Frame // captured BGRX pixels (desktops without FrameViewer)
	scaled []byte        // downscale output
	png    encode.PNGStream
	shot   shotCache
}

func (e *executorState) release() {
	e.frame.Pix, e.scaled = nil, nil
	e.png.Reset()
	e.shot = shotCache{}
}

// shotKey is what, besides the screen contents, determines a screenshot's
// pixels.
type shotKey struct {
	desk    *deskBox // a new Desktop (X reconnect) has an unrelated damage sequence
	region  image.Rectangle
	maxEdge int
	cursor  cursorKey
}

// cursorKey identifies the composited cursor sprite and place; the zero
// value means no cursor was drawn.
type cursorKey struct {
	drawn            bool
	x, y, xHot, yHot int
	width, height    int
	sprite           [16]byte
}

func cursorKeyOf(c desktop.Cursor) cursorKey {
	k := cursorKey{drawn: true, x: c.X, y: c.Y, xHot: c.XHot, yHot: c.YHot, width: c.Width, height: c.Height}
	if len(c.ARGB) > 0 {
		k.sprite = xxh3.Hash128(unsafe.Slice((*byte)(unsafe.Pointer(&c.ARGB[0])), 4*len(c.ARGB))).Bytes()
	}
	return k
}

// provedShot is the server's last frame any session captured with a damage
// sequence: while the sequence stays at seq the screen of key still hashes
// to hash. Checkpoints (a new admin session each) and hash-only observers
// answer from it without a capture.
type provedShot struct {
	epoch         uint64 // Server.shotEpoch when it was captured
	key           shotKey
	seq           uint64
	hash          [hashLen]byte
	width, height int
}

// shotCache remembers the session's last frame: while the display's damage
// sequence stays at seq, the screen is provably what it was when the frame
// of key was captured, so a repeat needs no capture, hash or encode. The
// encodings are keyed by the frame hash alone (pixels and size), so they
// also serve a recapture that found identical pixels.
type shotCache struct {
	proved bool // seq and key describe the frame with hash
	key    shotKey
	seq    uint64

	framed bool // hash, width and height are set
	hash   [hashLen]byte
	width  int
	height int

	pngOK bool
	png   []byte
	jpegQ int // quality of jpeg; 0 when there is none
	jpeg  []byte
}

// setFrame records the identity of a newly captured frame, dropping
// encodings of different pixels.
func (c *shotCache) setFrame(sum [hashLen]byte, w, h int) {
	if c.framed && c.hash == sum && c.width == w && c.height == h {
		return
	}
	c.framed, c.hash, c.width, c.height = true, sum, w, h
	c.pngOK, c.jpegQ = false, 0
}

// encoded returns the cached encoding of the current frame in format, or nil.
func (c *shotCache) encoded(format aciv1.ImageFormat, quality int) []byte {
	switch {
	case !c.framed:
		return nil
	case format == aciv1.ImageFormat_IMAGE_FORMAT_PNG && c.pngOK:
		return c.png
	case format == aciv1.ImageFormat_IMAGE_FORMAT_JPEG && c.jpegQ == quality:
		return c.jpeg
	}
	return nil
}

// screenshot captures, optionally composites the cursor and downscales,
// hashes, and encodes unless the hash matches if_none_match. When the
// desktop can prove the screen unchanged since the session's previous
// frame of the same shape, it answers from that frame instead. field
// prefixes error fields ("screenshot" or "step.observe").
func (ss *session) screenshot(ctx context.Context, r *aciv1.ScreenshotRequest, field string) (*aciv1.ScreenshotResponse, error) {
	box := ss.srv.desk.Load()
	if box == nil {
		return nil, errNoDesktop
	}
	d := box.d
	format := r.GetFormat()
	switch format {
	case aciv1.ImageFormat_IMAGE_FORMAT_UNSPECIFIED:
		format = aciv1.ImageFormat_IMAGE_FORMAT_PNG
	case aciv1.ImageFormat_IMAGE_FORMAT_PNG, aciv1.ImageFormat_IMAGE_FORMAT_JPEG, aciv1.ImageFormat_IMAGE_FORMAT_NONE:
	default:
		return nil, errInvalid(field+".format", "unknown image format %d", int32(format))
	}
	quality := int(r.GetQuality())
	if quality > 100 {
		return nil, errInvalid(field+".quality", "quality %d: want 1..100", quality)
	}
	if quality == 0 {
		quality = defaultJPEGQuality
	}
	inm := r.GetIfNoneMatch()
	if n := len(inm); n != 0 && n != hashLen {
		return nil, errInvalid(field+".if_none_match", "if_none_match must be a %d-byte frame_hash, got %d bytes", hashLen, n)
	}
	if r.GetMaxLongEdge() > maxScreenshotLongEdge {
		return nil, errInvalid(field+".max_long_edge", "max_long_edge %d too large", r.GetMaxLongEdge())
	}
	sw, sh := d.ScreenSize()
	region, err := clipRegion(r.GetRegion(), sw, sh, field+".region")
	if err != nil {
		return nil, err
	}
	if settle := time.Duration(r.GetSettleMs()) * time.Millisecond; settle > 0 {
		bound := defaultSettleTimeout
		if r.GetSettleTimeoutMs() > 0 {
			bound = time.Duration(r.GetSettleTimeoutMs()) * time.Millisecond
		}
		if settle > maxSettle || bound > maxSettle {
			return nil, errInvalid(field+".settle_ms", "settle_ms and settle_timeout_ms are capped at %s", maxSettle)
		}
		// Not settling within the bound is not an error: the client gets
		// the frame as it is at the deadline.
		if _, err := ss.srv.damage.settle(ctx, settle, bound); err != nil {
			return nil, err
		}
	}

	e := &ss.exec
	c := &e.shot
	t0 := time.Now()
	capturedAt := ss.srv.since()
	key := shotKey{desk: box, region: region, maxEdge: int(r.GetMaxLongEdge())}
	var cursor desktop.Cursor
	if r.GetIncludeCursor() {
		// A missing sprite (no XFIXES) leaves the frame as captured.
		if cur, cerr := d.CursorImage(); cerr == nil && cur.Width > 0 {
			cursor, key.cursor = cur, cursorKeyOf(cur)
		}
	}
	// Read before the damage sequence: a frame stored under an epoch a
	// checkpoint has since ended is never answered from.
	epoch := ss.srv.shotEpoch.Load()
	seq, seqOK := uint64(0), false
	if sq, ok := d.(DamageSequencer); ok {
		if seq, err = sq.DamageSeqSync(ctx); err == nil {
			seqOK = true
		} else if ctx.Err() != nil {
			return nil, err
		}
		// Any other failure only costs the shortcut: capture as usual.
	}
	resp := &aciv1.ScreenshotResponse{
		Format:       format,
		Region:       &aciv1.Rect{X: int32(region.Min.X), Y: int32(region.Min.Y), Width: int32(region.Dx()), Height: int32(region.Dy())},
		CapturedAtNs: uint64(capturedAt),
	}
	if seqOK && c.proved && c.seq == seq && c.key == key {
		// Nothing was drawn since the cached frame was captured.
		resp.Width, resp.Height = uint32(c.width), uint32(c.height)
		resp.FrameHash = append([]byte(nil), c.hash[:]...)
		resp.CaptureNs = uint64(time.Since(t0))
		if len(inm) == hashLen && bytes.Equal(inm, c.hash[:]) {
			resp.NotModified = true
			return resp, nil
		}
		if format == aciv1.ImageFormat_IMAGE_FORMAT_NONE {
			return resp, nil
		}
		if data := c.encoded(format, quality); data != nil {
			resp.Data = data
			return resp, nil
		}
		// Same pixels in a codec not cached yet: capture them again.
	}
	if p := ss.srv.provedShot.Load(); seqOK && format == aciv1.ImageFormat_IMAGE_FORMAT_NONE && p != nil && p.epoch == epoch && epoch%2 == 0 &&
		p.seq == seq && p.key == key {
		// Another session captured this view and nothing was drawn since:
		// a hash-only request needs no capture (nor this session's buffers).
		resp.Width, resp.Height = uint32(p.width), uint32(p.height)
		resp.FrameHash = append([]byte(nil), p.hash[:]...)
		resp.CaptureNs = uint64(time.Since(t0))
		resp.NotModified = len(inm) == hashLen && bytes.Equal(inm, p.hash[:])
		return resp, nil
	}
	c.proved = false

	process := func(f *desktop.Frame) error {
		img := encode.Image{Pix: f.Pix, Stride: f.Stride, Width: region.Dx(), Height: region.Dy()}
		if key.cursor.drawn {
			// The frame is ours to draw into (a copy, or the capture buffer
			// the next capture overwrites).
			p := image.Pt(cursor.X-cursor.XHot, cursor.Y-cursor.YHot).Sub(region.Min)
			if err := encode.CompositeARGB(img, p.X, p.Y, cursor.ARGB, cursor.Width, cursor.Height); err != nil {
				return err
			}
		}
		if key.maxEdge > 0 {
			scaled, err := encode.Downscale(e.scaled, img, key.maxEdge)
			if err != nil {
				return err
			}
			if &scaled.Pix[0] != &img.Pix[0] {
				e.scaled = scaled.Pix
			}
			img = scaled
		}
		sum, err := encode.Hash128(img)
		if err != nil {
			return err
		}
		c.setFrame(sum, img.Width, img.Height)
		resp.Width, resp.Height = uint32(img.Width), uint32(img.Height)
		resp.FrameHash = append([]byte(nil), sum[:]...)
		resp.CaptureNs = uint64(time.Since(t0))
		if len(inm) == hashLen && bytes.Equal(inm, sum[:]) {
			resp.NotModified = true
			return nil
		}
		if format == aciv1.ImageFormat_IMAGE_FORMAT_NONE {
			return nil
		}
		if data := c.encoded(format, quality); data != nil {
			resp.Data = data
			return nil
		}
		t1 := time.Now()
		switch format {
		case aciv1.ImageFormat_IMAGE_FORMAT_PNG:
			c.png, err = e.png.Encode(c.png[:0], img)
			c.pngOK = err == nil
			resp.Data = c.png
		case aciv1.ImageFormat_IMAGE_FORMAT_JPEG:
			c.jpegQ = 0
			if c.jpeg, err = encode.EncodeJPEG(c.jpeg[:0], img, quality); err == nil {
				c.jpegQ = quality
			}
			resp.Data = c.jpeg
		}
		resp.EncodeNs = uint64(time.Since(t1))
		return err
	}
	// The cheapest source first: the damage-refreshed mirror needs the
	// sync done above and a frame nobody draws into (no cursor), then a
	// lent capture buffer, then a copy.
	captured := false
	if m, ok := d.(ScreenMirror); ok && seqOK && !key.cursor.drawn && region == image.Rect(0, 0, sw, sh) {
		err = m.CaptureScreenSynced(func(f *desktop.Frame) error { captured = true; return process(f) })
		if err != nil && !captured && errors.Is(err, errdefs.ErrUnavailable) {
			err = nil // no mirror on this display
		} else {
			captured = true
		}
	}
	if !captured {
		if v, ok := d.(FrameViewer); ok {
			err = v.CaptureView(region, process)
		} else if err = d.Capture(region, &e.frame); err == nil {
			err = process(&e.frame)
		}
	}
	if err != nil {
		return nil, err
	}
	if seqOK {
		c.proved, c.key, c.seq = true, key, seq
		if epoch%2 == 0 {
			ss.srv.provedShot.Store(&provedShot{epoch: epoch, key: key, seq: seq, hash: c.hash, width: c.width, height: c.height})
		}
	}
	e.trim()
	return resp, nil
}

// trim drops buffers an unusually large capture grew, after the reply that
// aliases them has been built (the slice header keeps the bytes alive until
// emit has marshaled it).
func (e *executorState) trim() {
	if cap(e.frame.Pix) > shrinkBuffersAbove {
		e.frame.Pix = nil
	}
	if cap(e.scaled) > shrinkBuffersAbove {
		e.scaled = nil
	}
	if cap(e.shot.png) > shrinkBuffersAbove {
		e.shot.png, e.shot.pngOK = nil, false
	}
	if cap(e.shot.jpeg) > shrinkBuffersAbove {
		e.shot.jpeg, e.shot.jpegQ = nil, 0
	}
}
