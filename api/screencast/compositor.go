// Package screencast is the client side of the ACI screencast: a Compositor
// that applies ScreencastFrame events (keyframes and delta tiles in PNG,
// JPEG or zlib) onto a framebuffer, detects lost frames and asks the server
// for a keyframe.
//
//	comp := screencast.NewCompositor(screencast.RGBA,
//		screencast.WithKeyframeRequester(screencast.SessionKeyframes(ctx, sess)))
//	id, _ := sess.ScreencastStart(ctx, &aciv1.ScreencastStartRequest{Delta: true})
//	for ev := range sess.Events(ctx) {
//		if f := ev.GetFrame(); f != nil && f.GetStreamId() == id {
//			if err := comp.Apply(f); err != nil { ... }
//		}
//	}
//
// Frames come from a sandbox and are decoded as hostile input: a keyframe
// larger than the maximum frame (WithMaxFrame; 8192x8192 by default) is
// refused before anything is allocated, an image tile's size is read from its
// header and must match its rect before it is decoded, and what one frame
// may paint (tiles, zlib records) is bounded by a few times the frame's
// area, so a small message cannot make the client allocate or work without
// bound. Such frames fail with ErrCorrupt.
//
// Offer the "screencast.zlib" capability (aci.WithCapabilities) to receive
// zlib delta frames from a lossless stream: typing then costs a few tens of
// bytes per update instead of a PNG per tile. Delta frames carry no hash
// unless the stream was started with frame_hashes (FrameHash is nil after
// one that carried none); CapturedAt rebuilds every frame's capture time.
package screencast

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/draw"
	"image/jpeg"
	"image/png"
	"sync"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/api/screen"
)

// FormatZlib is the image format of zlib delta frames.
const FormatZlib = aciv1.ImageFormat_IMAGE_FORMAT_ZLIB_RECORDS

// FormatZlibTiles is the zlib delta format of older servers (records
// spread over tiles); Apply still decodes it.
const FormatZlibTiles = aciv1.ImageFormat_IMAGE_FORMAT_ZLIB_BGR

// CapabilityZlib is the session capability that enables zlib delta tiles.
const CapabilityZlib = "screencast.zlib"

// PixelFormat is the memory layout of the Compositor's framebuffer.
type PixelFormat int

const (
	// RGBA stores R, G, B, 0xff per pixel (image.RGBA's layout).
	RGBA PixelFormat = iota
	// BGRX stores B, G, R, 0xff per pixel (the X server's layout).
	BGRX
)

// Errors returned by Apply.
var (
	// ErrGap: frames were lost (or the stream's compression context broke);
	// the frame was dropped and a keyframe was requested. Frames are then
	// ignored until the keyframe arrives.
	ErrGap = errors.New("screencast: sequence gap")
	// ErrAwaitingKeyframe: a delta frame arrived before any keyframe (or
	// while a requested keyframe is pending) and was ignored.
	ErrAwaitingKeyframe = errors.New("screencast: awaiting keyframe")
	// ErrCorrupt: a tile could not be decoded or lies outside the frame.
	ErrCorrupt = errors.New("screencast: corrupt frame")
)

// DefaultMaxFrameEdge bounds a keyframe's width and height unless
// WithMaxFrame says otherwise: the largest screen a sandbox can have.
const DefaultMaxFrameEdge = screen.MaxEdge

// Painting bounds per frame: every tile and zlib record costs its area, and
// at least minPaintCost pixels (its own overhead), against paintFactor
// times the frame's area plus paintSlack. An honest frame paints each
// changed pixel about once.
const (
	paintFactor  = 4
	paintSlack   = 1 << 16
	minPaintCost = 64
)

// Option configures a Compositor.
type Option func(*Compositor)

// WithMaxFrame sets the largest keyframe accepted (DefaultMaxFrameEdge
// square by default); a larger one fails with ErrCorrupt before any
// allocation. Set it to the screen size the sandbox was created with to
// bound the framebuffer exactly.
func WithMaxFrame(width, height int) Option {
	return func(c *Compositor) {
		if width > 0 && height > 0 {
			c.maxW, c.maxH = width, height
		}
	}
}

// WithKeyframeRequester sets the function called (once per gap) when the
// compositor needs a keyframe. It runs on the caller of Apply; it should
// not block for long (SessionKeyframes returns one that does not).
func WithKeyframeRequester(fn func(streamID uint32)) Option {
	return func(c *Compositor) { c.requestKey = fn }
}

// SessionKeyframes returns a keyframe requester that sends a
// ScreencastKeyframeRequest on s without blocking the caller. Errors are
// dropped: a lost request is retried on the next gap, and the periodic
// keyframe (keyframe_interval_ms) is the backstop.
func SessionKeyframes(ctx context.Context, s *aci.Session) func(streamID uint32) {
	return func(id uint32) {
		go func() { _ = s.ScreencastKeyframe(ctx, id) }()
	}
}

// Stats counts what a Compositor applied.
type Stats struct {
	Frames    uint64 // frames applied
	Keyframes uint64
	Tiles     uint64 // tiles and zlib records
	Bytes     uint64 // tile data and zlib chunk bytes of applied frames
	Gaps      uint64 // sequence gaps detected
	Dropped   uint64 // frames ignored while awaiting a keyframe
}

// Compositor reconstructs one stream's frames. Safe for concurrent use.
type Compositor struct {
	pf         PixelFormat
	requestKey func(uint32)
	maxW, maxH int

	mu     sync.Mutex
	pix    []byte
	width  int
	height int
	stream uint32
	seq    uint64
	synced bool // a keyframe was applied and no gap since
	hash   []byte
	// capturedUs is the last applied frame's capture time (Unix
	// microseconds): a keyframe's captured_at_ns, plus the deltas since.
	capturedUs int64
	zl         zlibDecoder
	stats      Stats
	scratchR   *image.RGBA
	// painted is what the frame being applied has painted so far, against
	// paintMax (see paintFactor).
	painted, paintMax int
}

// NewCompositor returns a Compositor whose framebuffer has layout pf.
func NewCompositor(pf PixelFormat, opts ...Option) *Compositor {
	c := &Compositor{pf: pf, maxW: DefaultMaxFrameEdge, maxH: DefaultMaxFrameEdge}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Apply applies f. A frame that does not follow the previous one (seq gap)
// and is not a keyframe is dropped, a keyframe is requested once and
// ErrGap is returned; later delta frames return ErrAwaitingKeyframe until a
// keyframe arrives. On ErrCorrupt the framebuffer may be partly updated and
// a keyframe is requested as for a gap.
func (c *Compositor) Apply(f *aciv1.ScreencastFrame) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f == nil {
		return fmt.Errorf("%w: nil frame", ErrCorrupt)
	}
	if f.GetKeyframe() {
		if err := c.applyKeyframe(f); err != nil {
			c.lose(f.GetStreamId())
			return err
		}
		return nil
	}
	if !c.synced {
		c.stats.Dropped++
		return ErrAwaitingKeyframe
	}
	if f.GetStreamId() != c.stream || f.GetSeq() != c.seq+1 {
		c.stats.Gaps++
		c.stats.Dropped++
		c.lose(f.GetStreamId())
		return fmt.Errorf("%w: stream %d seq %d after %d", ErrGap, f.GetStreamId(), f.GetSeq(), c.seq)
	}
	// Delta frames omit their geometry (it is the keyframe's); a server
	// that sends it anyway must agree with the framebuffer.
	if (f.GetWidth() != 0 || f.GetHeight() != 0) && (int(f.GetWidth()) != c.width || int(f.GetHeight()) != c.height) {
		c.lose(f.GetStreamId())
		return fmt.Errorf("%w: delta frame %dx%d on a %dx%d framebuffer", ErrCorrupt, f.GetWidth(), f.GetHeight(), c.width, c.height)
	}
	if err := c.applyTiles(f); err != nil {
		c.lose(f.GetStreamId())
		return err
	}
	c.seq = f.GetSeq()
	// Without a hash on this frame the previous one no longer describes
	// the framebuffer.
	c.hash = append(c.hash[:0], f.GetFrameHash()...)
	if ns := f.GetCapturedAtNs(); ns != 0 {
		c.capturedUs = int64(ns / 1e3)
	} else {
		c.capturedUs += int64(f.GetCapturedAtDeltaUs())
	}
	c.stats.Frames++
	return nil
}

// lose marks the compositor out of sync and asks for a keyframe.
func (c *Compositor) lose(stream uint32) {
	if !c.synced {
		return
	}
	c.synced = false
	if c.requestKey != nil {
		c.requestKey(stream)
	}
}

func (c *Compositor) applyKeyframe(f *aciv1.ScreencastFrame) error {
	w, h := int(f.GetWidth()), int(f.GetHeight())
	if w <= 0 || h <= 0 || w > c.maxW || h > c.maxH {
		return fmt.Errorf("%w: keyframe size %dx%d (at most %dx%d)", ErrCorrupt, w, h, c.maxW, c.maxH)
	}
	if w != c.width || h != c.height {
		c.pix = make([]byte, w*h*4)
		c.width, c.height = w, h
	}
	c.zl.reset()
	if err := c.applyTiles(f); err != nil {
		return err
	}
	c.stream = f.GetStreamId()
	c.seq = f.GetSeq()
	c.synced = true
	c.hash = append(c.hash[:0], f.GetFrameHash()...)
	c.capturedUs = int64(f.GetCapturedAtNs() / 1e3)
	c.stats.Frames++
	c.stats.Keyframes++
	return nil
}

func (c *Compositor) applyTiles(f *aciv1.ScreencastFrame) error {
	c.painted, c.paintMax = 0, paintFactor*c.width*c.height+paintSlack
	bounds := image.Rect(0, 0, c.width, c.height)
	tiles := f.GetTiles()
	rects := make([]image.Rectangle, len(tiles))
	for i, t := range tiles {
		r := t.GetRect()
		rects[i] = image.Rect(int(r.GetX()), int(r.GetY()), int(r.GetX())+int(r.GetWidth()), int(r.GetY())+int(r.GetHeight()))
		if rects[i].Empty() || !rects[i].In(bounds) {
			return fmt.Errorf("%w: tile %d rect %v outside the %dx%d frame", ErrCorrupt, i, rects[i], c.width, c.height)
		}
		c.stats.Bytes += uint64(len(t.GetData()))
	}
	c.stats.Tiles += uint64(len(tiles))
	switch f.GetFormat() {
	case FormatZlib:
		if f.GetKeyframe() || len(tiles) != 0 {
			return fmt.Errorf("%w: a zlib records frame must be a delta frame without tiles", ErrCorrupt)
		}
		c.stats.Bytes += uint64(len(f.GetZlibChunk()))
		n, err := c.zl.applyRecords(c, f.GetZlibChunk())
		c.stats.Tiles += uint64(n)
		return err
	case FormatZlibTiles:
		if f.GetKeyframe() {
			return fmt.Errorf("%w: a keyframe cannot use zlib tiles", ErrCorrupt)
		}
		return c.zl.applyTiles(c, tiles, rects)
	case aciv1.ImageFormat_IMAGE_FORMAT_NONE:
		return nil
	case aciv1.ImageFormat_IMAGE_FORMAT_UNSPECIFIED, aciv1.ImageFormat_IMAGE_FORMAT_PNG, aciv1.ImageFormat_IMAGE_FORMAT_JPEG:
		for i, t := range tiles {
			if err := c.paint(rects[i]); err != nil {
				return fmt.Errorf("tile %d: %w", i, err)
			}
			img, err := decodeImage(t.GetData(), rects[i].Size())
			if err != nil {
				return fmt.Errorf("%w: tile %d: %v", ErrCorrupt, i, err)
			}
			c.blit(rects[i], img)
		}
		return nil
	default:
		return fmt.Errorf("%w: unknown tile format %d", ErrCorrupt, int32(f.GetFormat()))
	}
}

// paint charges r against the frame's painting bound.
func (c *Compositor) paint(r image.Rectangle) error {
	c.painted += max(r.Dx()*r.Dy(), minPaintCost)
	if c.painted > c.paintMax {
		return fmt.Errorf("%w: the frame paints more than %d pixels", ErrCorrupt, c.paintMax)
	}
	return nil
}

// decodeImage decodes a PNG or JPEG tile of size want. The size in the
// image's header is checked first: the decoders allocate what the header
// says (an 81-byte PNG can claim 2^30 pixels).
func decodeImage(data []byte, want image.Point) (image.Image, error) {
	decodeConfig, decode := jpeg.DecodeConfig, jpeg.Decode
	if bytes.HasPrefix(data, []byte("\x89PNG")) {
		decodeConfig, decode = png.DecodeConfig, png.Decode
	}
	cfg, err := decodeConfig(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	if cfg.Width != want.X || cfg.Height != want.Y {
		return nil, fmt.Errorf("image is %dx%d, its rect %dx%d", cfg.Width, cfg.Height, want.X, want.Y)
	}
	img, err := decode(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	if img.Bounds().Size() != want {
		return nil, fmt.Errorf("image is %v, its rect %v", img.Bounds().Size(), want)
	}
	return img, nil
}

// blit draws img at r.Min.
func (c *Compositor) blit(r image.Rectangle, img image.Image) {
	src, ok := img.(*image.RGBA)
	if !ok {
		if c.scratchR == nil || c.scratchR.Rect.Dx() < r.Dx() || c.scratchR.Rect.Dy() < r.Dy() {
			c.scratchR = image.NewRGBA(image.Rect(0, 0, max(r.Dx(), 64), max(r.Dy(), 64)))
		}
		dst := c.scratchR.SubImage(image.Rect(0, 0, r.Dx(), r.Dy())).(*image.RGBA)
		draw.Draw(dst, dst.Rect, img, img.Bounds().Min, draw.Src)
		src = dst
	}
	for y := 0; y < r.Dy(); y++ {
		s := src.Pix[src.PixOffset(src.Rect.Min.X, src.Rect.Min.Y+y):][:r.Dx()*4]
		d := c.row(r, y)
		if c.pf == RGBA {
			copy(d, s)
			continue
		}
		for x := 0; x < len(s); x += 4 {
			d[x], d[x+1], d[x+2], d[x+3] = s[x+2], s[x+1], s[x], 0xff
		}
	}
}

// row is the framebuffer bytes of rect r's row y (relative to r).
func (c *Compositor) row(r image.Rectangle, y int) []byte {
	o := ((r.Min.Y+y)*c.width + r.Min.X) * 4
	return c.pix[o : o+r.Dx()*4 : o+r.Dx()*4]
}

// putBGR stores one pixel given as B, G, R.
func (c *Compositor) putBGR(d []byte, b, g, r byte) {
	if c.pf == RGBA {
		d[0], d[1], d[2], d[3] = r, g, b, 0xff
		return
	}
	d[0], d[1], d[2], d[3] = b, g, r, 0xff
}

// Synced reports whether the framebuffer holds a complete frame of the
// stream (a keyframe was applied and no frame was lost since).
func (c *Compositor) Synced() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.synced
}

// Seq is the sequence number of the last applied frame.
func (c *Compositor) Seq() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seq
}

// FrameHash is the server's frame_hash of the last applied frame: nil when
// that frame carried none (delta frames carry one only on a stream started
// with frame_hashes).
func (c *Compositor) FrameHash() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.hash) == 0 {
		return nil
	}
	return bytes.Clone(c.hash)
}

// CapturedAt is when the server captured the last applied frame (zero
// before the first keyframe), reconstructed from the keyframe's
// captured_at_ns and the delta frames' captured_at_delta_us.
func (c *Compositor) CapturedAt() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.capturedUs == 0 {
		return time.Time{}
	}
	return time.UnixMicro(c.capturedUs)
}

// Stats returns the counters.
func (c *Compositor) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// Size is the framebuffer size (0x0 before the first keyframe).
func (c *Compositor) Size() (w, h int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.width, c.height
}

// Snapshot copies the framebuffer into dst (reused when large enough) and
// returns it with its size; rows are packed (stride 4*w) in the
// compositor's PixelFormat.
func (c *Compositor) Snapshot(dst []byte) (pix []byte, w, h int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cap(dst) < len(c.pix) {
		dst = make([]byte, len(c.pix))
	}
	dst = dst[:len(c.pix)]
	copy(dst, c.pix)
	return dst, c.width, c.height
}

// Image returns a copy of the current frame as an *image.RGBA (nil before
// the first keyframe).
func (c *Compositor) Image() *image.RGBA {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.width == 0 {
		return nil
	}
	img := image.NewRGBA(image.Rect(0, 0, c.width, c.height))
	copy(img.Pix, c.pix)
	if c.pf == BGRX {
		for i := 0; i < len(img.Pix); i += 4 {
			img.Pix[i], img.Pix[i+2] = img.Pix[i+2], img.Pix[i]
		}
	}
	return img
}
