package screencast

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"math"
	"slices"
	"sync"
	"time"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
	"github.com/forkfleet/forkfleet/guestd/internal/encode"
)

// spriteRefresh is how often an overlay stream re-reads the cursor sprite
// while the pointer stands still (a shape change without a move is rare).
const spriteRefresh = time.Second

// stream is one screencast. The fields under mu are shared with the damage
// fan-out and the Caster's methods; the rest belong to the run goroutine.
type stream struct {
	c        *Caster
	id       uint32
	p        params
	send     SendFunc
	cursorFn CursorFunc
	cancel   context.CancelFunc
	wake     chan struct{}

	mu        sync.Mutex
	dirty     dirtySet
	keyReq    bool
	sending   bool
	coalesced uint32
	failErr   error

	recheckAt time.Time       // set before run starts
	gate      <-chan struct{} // first frame waits for it (nil: no wait)

	seq      uint64
	lastSent time.Time
	lastKey  time.Time
	forceKey bool

	// Frame times: the last keyframe's capture (monotonic) and the last
	// frame's time in microseconds after it. Delta frames carry the
	// difference to the previous frame, which stays a few bytes.
	keyAt  time.Time
	lastUs int64

	cur    encode.Image // region pixels as captured
	disp   encode.Image // cur with the cursor composited (== cur without overlay)
	ref    encode.Image // what the client holds (output size)
	scaled []byte
	grab   desktop.Frame
	rects  []image.Rectangle
	tiles  []image.Rectangle
	enc    []byte
	zl     zlibEncoder
	sd     scrollDetector

	// Cursor state (overlay and events).
	nextCursorPoll time.Time
	cursorX        int
	cursorY        int
	cursorKnown    bool
	sprite         desktop.Cursor
	spriteAt       time.Time
	drawn          image.Rectangle // composited sprite, region coordinates
	spriteDirty    bool
}

func newStream(c *Caster, id uint32, p params, send SendFunc, cursor CursorFunc, cancel context.CancelFunc) *stream {
	return &stream{c: c, id: id, p: p, send: send, cursorFn: cursor, cancel: cancel,
		wake: make(chan struct{}, 1), forceKey: true}
}

func (s *stream) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// addDamage records a changed root rectangle; called from the fan-out with
// the Caster's lock held, so it never blocks.
func (s *stream) addDamage(r image.Rectangle) {
	r = r.Intersect(s.p.region)
	if r.Empty() {
		return
	}
	s.mu.Lock()
	s.dirty.add(r.Sub(s.p.region.Min))
	if s.sending && s.coalesced < math.MaxUint32 {
		s.coalesced++
	}
	s.mu.Unlock()
	s.signal()
}

func (s *stream) requestKeyframe() {
	s.mu.Lock()
	s.keyReq = true
	s.mu.Unlock()
	s.signal()
}

func (s *stream) stop() { s.cancel() }

func (s *stream) fail(err error) {
	s.mu.Lock()
	if s.failErr == nil {
		s.failErr = err
	}
	s.mu.Unlock()
	s.signal()
}

func (s *stream) pollsCursor() bool { return s.p.cursor != aciv1.CursorMode_CURSOR_MODE_HIDDEN }

func newImage(w, h int) encode.Image {
	return encode.Image{Pix: make([]byte, w*h*4), Stride: w * 4, Width: w, Height: h}
}

func (s *stream) run(ctx context.Context) error {
	rw, rh := s.p.region.Dx(), s.p.region.Dy()
	s.cur = newImage(rw, rh)
	s.disp = s.cur
	if s.p.cursor == aciv1.CursorMode_CURSOR_MODE_OVERLAY {
		s.disp = newImage(rw, rh)
	}
	ow, oh := encode.ScaledSize(rw, rh, s.p.maxLongEdge)
	s.ref = newImage(ow, oh)

	if s.gate != nil {
		select {
		case <-s.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		now := time.Now()
		var next time.Time
		if s.pollsCursor() {
			if !now.Before(s.nextCursorPoll) {
				if err := s.pollCursor(now); err != nil {
					return err
				}
				s.nextCursorPoll = now.Add(s.p.interval)
			}
			next = s.nextCursorPoll
		}
		if !s.recheckAt.IsZero() {
			if !now.Before(s.recheckAt) {
				s.recheckAt = time.Time{}
				s.mu.Lock()
				s.dirty.add(image.Rect(0, 0, rw, rh))
				s.mu.Unlock()
			} else {
				next = earliest(next, s.recheckAt)
			}
		}
		s.mu.Lock()
		pending := !s.dirty.empty() || s.keyReq || s.forceKey || s.spriteDirty
		failErr := s.failErr
		s.mu.Unlock()
		if failErr != nil {
			return failErr
		}
		if pending {
			due := s.lastSent.Add(s.p.interval)
			if !now.Before(due) {
				if err := s.frame(now); err != nil {
					return err
				}
				continue
			}
			next = earliest(next, due)
		}
		if !next.IsZero() {
			timer.Reset(time.Until(next))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.wake:
		case <-timer.C:
		}
		timer.Stop()
	}
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || b.Before(a) {
		return b
	}
	return a
}

// pollCursor reads the pointer (and, for an overlay, the sprite when the
// pointer moved or the sprite is old), marking the cursor dirty or pushing a
// CursorEvent on a change.
func (s *stream) pollCursor(now time.Time) error {
	x, y, err := s.c.display.CursorPosition()
	if err != nil {
		return fmt.Errorf("screencast: cursor position: %w", err)
	}
	moved := !s.cursorKnown || x != s.cursorX || y != s.cursorY
	s.cursorX, s.cursorY, s.cursorKnown = x, y, true
	if s.p.cursor == aciv1.CursorMode_CURSOR_MODE_EVENTS {
		if moved {
			if err := s.cursorFn(&aciv1.CursorEvent{Position: &aciv1.Point{X: int32(x), Y: int32(y)}, StreamId: s.id}); err != nil {
				return fmt.Errorf("screencast: send cursor event: %w", err)
			}
		}
		return nil
	}
	if !moved && now.Sub(s.spriteAt) < spriteRefresh {
		return nil
	}
	cur, err := s.c.display.CursorImage()
	if err != nil {
		return fmt.Errorf("screencast: cursor image: %w", err)
	}
	s.spriteAt = now
	old := s.sprite
	s.sprite = cur
	if moved || !sameSprite(old, cur) {
		s.spriteDirty = true
	}
	return nil
}

func sameSprite(a, b desktop.Cursor) bool {
	return a.X == b.X && a.Y == b.Y && a.XHot == b.XHot && a.YHot == b.YHot &&
		a.Width == b.Width && a.Height == b.Height && slices.Equal(a.ARGB, b.ARGB)
}

// frame builds and sends the next frame: captures the dirty rectangles (or
// the whole region for a keyframe), diffs them against what the client
// holds and sends the changed tiles. Nothing is sent when nothing changed.
func (s *stream) frame(now time.Time) error {
	s.mu.Lock()
	rects := s.dirty.take(s.rects[:0])
	keyReq := s.keyReq
	s.keyReq = false
	coalesced := s.coalesced
	s.coalesced = 0
	s.mu.Unlock()
	s.rects = rects

	key := s.forceKey || keyReq || !s.p.delta ||
		(s.p.keyInterval > 0 && now.Sub(s.lastKey) >= s.p.keyInterval)
	whole := s.cur.Bounds()
	capturedAt := time.Now()
	if key {
		rects = append(rects[:0], whole)
		s.grab.Pix = s.cur.Pix
		if err := s.c.display.Capture(s.p.region, &s.grab); err != nil {
			return fmt.Errorf("screencast: capture: %w", err)
		}
		if &s.grab.Pix[0] != &s.cur.Pix[0] {
			copy(s.cur.Pix, s.grab.Pix)
		}
		s.grab.Pix = nil
	} else {
		for _, r := range rects {
			if err := s.c.display.Capture(r.Add(s.p.region.Min), &s.grab); err != nil {
				return fmt.Errorf("screencast: capture: %w", err)
			}
			g := encode.Image{Pix: s.grab.Pix, Stride: s.grab.Stride, Width: r.Dx(), Height: r.Dy()}
			for y := 0; y < r.Dy(); y++ {
				copy(s.cur.Row(r.Min.Y + y)[r.Min.X*4:r.Max.X*4], g.Row(y))
			}
		}
	}
	if s.p.cursor == aciv1.CursorMode_CURSOR_MODE_OVERLAY {
		rects = s.overlayCursor(rects, key)
	}
	s.spriteDirty = false

	out := s.disp
	if s.ref.Width != out.Width || s.ref.Height != out.Height {
		sc, err := encode.Downscale(s.scaled, out, s.p.maxLongEdge)
		if err != nil {
			return fmt.Errorf("screencast: downscale: %w", err)
		}
		s.scaled = sc.Pix
		for i, r := range rects {
			rects[i] = scaleRect(r, out.Width, out.Height, sc.Width, sc.Height)
		}
		out = sc
	}

	forced := s.forceKey || keyReq
	if key && !forced && sameImage(out, s.ref) {
		// A keyframe due only to damage (delta=false, or the keyframe
		// interval) whose pixels the client already holds: a damage event
		// without a visible change, or the watch-start re-check. Idle
		// stays one keyframe and then nothing, in every mode.
		return nil
	}

	// Delta frames carry neither geometry nor absolute time (see the proto):
	// only what the client cannot know.
	f := &aciv1.ScreencastFrame{
		StreamId:  s.id,
		Seq:       s.seq + 1,
		Keyframe:  key,
		Format:    s.p.format,
		Coalesced: coalesced,
	}
	var frameUs int64 // microseconds after the keyframe's capture
	if key {
		f.CapturedAtNs = uint64(capturedAt.UnixNano())
		f.Width, f.Height = uint32(out.Width), uint32(out.Height)
		copy(s.ref.Pix, out.Pix)
		if s.p.format != aciv1.ImageFormat_IMAGE_FORMAT_NONE {
			data, err := s.encodeImage(out)
			if err != nil {
				return err
			}
			f.Tiles = []*aciv1.Tile{{Rect: protoRect(out.Bounds()), Data: data}}
		}
		if s.p.zlib {
			if err := s.zl.reset(); err != nil {
				return err
			}
		}
	} else {
		frameUs = max(capturedAt.Sub(s.keyAt).Microseconds(), s.lastUs)
		f.CapturedAtDeltaUs = uint64(frameUs - s.lastUs)
		// Scrolls first: a copy is only expressible in zlib frames. The
		// copies are applied to ref (as the client will) before the diff,
		// which then only finds the rows that scrolled in.
		var copies []zlibTile
		if s.p.zlib {
			for _, r := range rects {
				if dst, src, ok := s.sd.detect(out, s.ref, r); ok {
					copyWithin(s.ref, dst, src)
					copies = append(copies, zlibTile{rect: dst, copy: true, src: src})
				}
			}
		}
		tiles := s.tiles[:0]
		for _, r := range rects {
			n := len(tiles)
			tiles = changedRects(tiles, out, s.ref, r)
			// Update what the client will hold right away, so overlapping
			// dirty rectangles do not yield the same pixels twice.
			for _, t := range tiles[n:] {
				copyRect(s.ref, out, t)
			}
		}
		tiles = mergeRects(tiles)
		s.tiles = tiles
		if len(tiles) == 0 && len(copies) == 0 {
			return nil // damage without a visible change
		}
		if err := s.encodeTiles(f, out, copies, tiles); err != nil {
			return err
		}
	}
	if key || s.p.frameHashes {
		sum, err := encode.Hash128(out)
		if err != nil {
			return fmt.Errorf("screencast: hash: %w", err)
		}
		f.FrameHash = sum[:]
	}

	s.mu.Lock()
	s.sending = true
	s.mu.Unlock()
	err := s.send(f)
	s.mu.Lock()
	s.sending = false
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("screencast: send frame: %w", err)
	}
	s.seq++
	s.lastSent = now
	s.lastUs = frameUs
	if key {
		s.lastKey = now
		s.forceKey = false
		s.keyAt = capturedAt
	}
	return nil
}

// sameImage reports whether a and b (same size) hold the same pixels.
func sameImage(a, b encode.Image) bool {
	if a.Width != b.Width || a.Height != b.Height {
		return false
	}
	for y := 0; y < a.Height; y++ {
		if !bytes.Equal(a.Row(y)[:4*a.Width], b.Row(y)[:4*b.Width]) {
			return false
		}
	}
	return true
}

// overlayCursor refreshes disp from cur over rects, moves the sprite, and
// returns rects plus the sprite's old and new places.
func (s *stream) overlayCursor(rects []image.Rectangle, key bool) []image.Rectangle {
	if key {
		copy(s.disp.Pix, s.cur.Pix)
	} else {
		for _, r := range rects {
			copyRect(s.disp, s.cur, r)
		}
		if !s.drawn.Empty() {
			copyRect(s.disp, s.cur, s.drawn)
			rects = append(rects, s.drawn)
		}
	}
	s.drawn = image.Rectangle{}
	sp := s.sprite
	if sp.Width <= 0 || sp.Height <= 0 {
		return rects
	}
	x := sp.X - sp.XHot - s.p.region.Min.X
	y := sp.Y - sp.YHot - s.p.region.Min.Y
	r := image.Rect(x, y, x+sp.Width, y+sp.Height).Intersect(s.disp.Bounds())
	if r.Empty() {
		return rects
	}
	if err := encode.CompositeARGB(s.disp, x, y, sp.ARGB, sp.Width, sp.Height); err != nil {
		// A malformed sprite from the server: show the frame without it.
		s.c.log.Debug("screencast cursor composite", "err", err)
		return rects
	}
	s.drawn = r
	if !key {
		rects = append(rects, r)
	}
	return rects
}

// scaleRect maps r from a w x h frame onto the sw x sh downscaled one,
// widened by a pixel each side since the box filter's footprint straddles
// destination pixels.
func scaleRect(r image.Rectangle, w, h, sw, sh int) image.Rectangle {
	x0 := r.Min.X*sw/w - 1
	y0 := r.Min.Y*sh/h - 1
	x1 := (r.Max.X*sw+w-1)/w + 1
	y1 := (r.Max.Y*sh+h-1)/h + 1
	return image.Rect(x0, y0, x1, y1).Intersect(image.Rect(0, 0, sw, sh))
}

func (s *stream) encodeImage(img encode.Image) ([]byte, error) {
	var err error
	switch s.p.format {
	case aciv1.ImageFormat_IMAGE_FORMAT_JPEG:
		s.enc, err = encode.EncodeJPEG(s.enc[:0], img, s.p.quality)
	default:
		s.enc, err = encode.EncodePNG(s.enc[:0], img)
	}
	if err != nil {
		return nil, fmt.Errorf("screencast: encode: %w", err)
	}
	return append([]byte(nil), s.enc...), nil
}

// encodeTiles fills f's tiles: copies (zlib only) first, then the changed
// rectangles.
func (s *stream) encodeTiles(f *aciv1.ScreencastFrame, out encode.Image, copies []zlibTile, tiles []image.Rectangle) error {
	switch {
	case s.p.format == aciv1.ImageFormat_IMAGE_FORMAT_NONE:
		return nil
	case s.p.zlib && (len(copies) > 0 || totalArea(tiles) <= zlibMaxArea):
		zt := append(make([]zlibTile, 0, len(copies)+len(tiles)), copies...)
		for _, t := range tiles {
			zt = append(zt, zlibTile{rect: t})
		}
		chunk, err := s.zl.encode(out, zt)
		if err != nil {
			// The DEFLATE context is now unknown to the client: the next
			// frame must be a keyframe.
			s.forceKey = true
			return fmt.Errorf("screencast: zlib records: %w", err)
		}
		f.Format = FormatZlib
		f.ZlibChunk = chunk
		return nil
	}
	if s.p.zlib {
		f.Format = aciv1.ImageFormat_IMAGE_FORMAT_PNG
	}
	f.Tiles = make([]*aciv1.Tile, 0, len(tiles))
	for _, t := range tiles {
		data, err := s.encodeImage(out.SubImage(t))
		if err != nil {
			return err
		}
		f.Tiles = append(f.Tiles, &aciv1.Tile{Rect: protoRect(t), Data: data})
	}
	return nil
}

func totalArea(rs []image.Rectangle) int {
	n := 0
	for _, r := range rs {
		n += area(r)
	}
	return n
}
