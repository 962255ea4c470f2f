package screencast

import (
	"compress/flate"
	"encoding/binary"
	"errors"
	"fmt"
	"image"
	"io"

	"github.com/forkfleet/forkfleet/api/aci/wire"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// Zlib framing (see guestd/internal/screencast/zlib.go, the encoder, and
// the ImageFormat comments in the proto): one raw DEFLATE stream per stream
// that restarts after each keyframe; each frame is the next chunk, ending
// with a sync flush. IMAGE_FORMAT_ZLIB_RECORDS frames carry the chunk in
// zlib_chunk without the flush's 00 00 ff ff tail, and each record carries
// its rect (uint16 LE x, y, w, h) up to an end record. The older
// IMAGE_FORMAT_ZLIB_BGR frames spread the chunk over their tiles' data, one
// record per tile without a rect. Records: 0x00 raw B,G,R pixels, 0x01
// copy from src x, y of the framebuffer as it is at that point, 0x02 solid
// fill, 0x03 end.

// syncFlushTail is the constant end of a sync flush that ZLIB_RECORDS
// frames leave off.
var syncFlushTail = []byte{0x00, 0x00, 0xff, 0xff}

// errChunkEnd is what the chunk feeder returns once the frame's bytes are
// used up: more input was needed than the frame carried.
var errChunkEnd = errors.New("zlib chunk ended early")

// chunkReader feeds the current frame's compressed bytes to the inflater.
// It implements io.ByteReader so flate reads exactly what it needs and no
// read-ahead swallows bytes of the next frame.
type chunkReader struct {
	parts [][]byte
}

func (r *chunkReader) ReadByte() (byte, error) {
	for len(r.parts) > 0 {
		if p := r.parts[0]; len(p) > 0 {
			r.parts[0] = p[1:]
			return p[0], nil
		}
		r.parts = r.parts[1:]
	}
	return 0, errChunkEnd
}

func (r *chunkReader) Read(b []byte) (int, error) {
	for len(r.parts) > 0 {
		if p := r.parts[0]; len(p) > 0 {
			n := copy(b, p)
			r.parts[0] = p[n:]
			return n, nil
		}
		r.parts = r.parts[1:]
	}
	return 0, errChunkEnd
}

func (r *chunkReader) remaining() int {
	n := 0
	for _, p := range r.parts {
		n += len(p)
	}
	return n
}

type zlibDecoder struct {
	in  chunkReader
	fr  io.ReadCloser
	buf []byte
	// legacy: the stream is IMAGE_FORMAT_ZLIB_BGR (int32 copy sources).
	legacy bool
}

// reset forgets the stream (a keyframe starts a new one).
func (z *zlibDecoder) reset() {
	z.fr = nil
	z.in.parts = nil
}

func (z *zlibDecoder) read(n int) ([]byte, error) {
	if cap(z.buf) < n {
		z.buf = make([]byte, n)
	}
	b := z.buf[:n]
	if _, err := io.ReadFull(z.fr, b); err != nil {
		return nil, err
	}
	return b, nil
}

// feed queues the frame's compressed bytes behind the previous frame's
// unread tail (the sync flush's empty stored block, consumed only when the
// next block is needed).
func (z *zlibDecoder) feed(parts ...[]byte) {
	tail := z.in.parts[:0]
	for _, p := range z.in.parts {
		if len(p) > 0 {
			tail = append(tail, p)
		}
	}
	z.in.parts = append(tail, parts...)
	if z.fr == nil {
		z.fr = flate.NewReader(&z.in)
	}
}

// fail forgets the stream: the inflater's state is gone with the error, so
// only a keyframe (which resets it) can resynchronize.
func (z *zlibDecoder) fail(i int, err error) error {
	z.reset()
	return fmt.Errorf("%w: zlib record %d: %v", ErrCorrupt, i, err)
}

// done checks that only the sync flush is left: its empty stored block is
// consumed by the next frame's first read, so up to its 5 bytes (plus a
// partial byte) may remain.
func (z *zlibDecoder) done(i int) error {
	if n := z.in.remaining(); n > 6 {
		return z.fail(i, fmt.Errorf("%d bytes left after the last record", n))
	}
	return nil
}

// applyTiles applies an IMAGE_FORMAT_ZLIB_BGR frame: one record per tile.
func (z *zlibDecoder) applyTiles(c *Compositor, tiles []*aciv1.Tile, rects []image.Rectangle) error {
	parts := make([][]byte, 0, len(tiles))
	for _, t := range tiles {
		parts = append(parts, t.GetData())
	}
	z.legacy = true
	z.feed(parts...)
	for i, r := range rects {
		if err := c.paint(r); err != nil {
			z.reset()
			return err
		}
		op, err := z.read(1)
		if err != nil {
			return z.fail(i, err)
		}
		if err := z.record(c, op[0], r); err != nil {
			return z.fail(i, err)
		}
	}
	return z.done(len(rects) - 1)
}

// applyRecords applies an IMAGE_FORMAT_ZLIB_RECORDS frame.
func (z *zlibDecoder) applyRecords(c *Compositor, chunk []byte) (records int, err error) {
	z.legacy = false
	z.feed(chunk, syncFlushTail)
	bounds := image.Rect(0, 0, c.width, c.height)
	for i := 0; ; i++ {
		op, err := z.read(1)
		if err != nil {
			return i, z.fail(i, err)
		}
		if op[0] == wire.ZlibOpEnd {
			return i, z.done(i)
		}
		op0 := op[0]
		h, err := z.read(8)
		if err != nil {
			return i, z.fail(i, err)
		}
		x, y := int(binary.LittleEndian.Uint16(h)), int(binary.LittleEndian.Uint16(h[2:]))
		r := image.Rect(x, y, x+int(binary.LittleEndian.Uint16(h[4:])), y+int(binary.LittleEndian.Uint16(h[6:])))
		if r.Empty() || !r.In(bounds) {
			return i, z.fail(i, fmt.Errorf("rect %v outside the %dx%d frame", r, c.width, c.height))
		}
		if err := c.paint(r); err != nil {
			z.reset()
			return i, err
		}
		if err := z.record(c, op0, r); err != nil {
			return i, z.fail(i, err)
		}
	}
}

// record applies one record's body (after its op byte and, for
// ZLIB_RECORDS, its rect) to r.
func (z *zlibDecoder) record(c *Compositor, op byte, r image.Rectangle) error {
	switch op {
	case wire.ZlibOpRaw:
		w := r.Dx()
		for y := 0; y < r.Dy(); y++ {
			src, err := z.read(3 * w)
			if err != nil {
				return err
			}
			d := c.row(r, y)
			for x := 0; x < w; x++ {
				c.putBGR(d[4*x:4*x+4:4*x+4], src[3*x], src[3*x+1], src[3*x+2])
			}
		}
	case wire.ZlibOpSolid:
		px, err := z.read(3)
		if err != nil {
			return err
		}
		b, g, rr := px[0], px[1], px[2]
		for y := 0; y < r.Dy(); y++ {
			d := c.row(r, y)
			for x := 0; x < len(d); x += 4 {
				c.putBGR(d[x:x+4:x+4], b, g, rr)
			}
		}
	case wire.ZlibOpCopy:
		var sx, sy int
		if z.legacy {
			p, err := z.read(8)
			if err != nil {
				return err
			}
			sx, sy = int(int32(binary.LittleEndian.Uint32(p))), int(int32(binary.LittleEndian.Uint32(p[4:])))
		} else {
			p, err := z.read(4)
			if err != nil {
				return err
			}
			sx, sy = int(binary.LittleEndian.Uint16(p)), int(binary.LittleEndian.Uint16(p[2:]))
		}
		src := image.Rect(sx, sy, sx+r.Dx(), sy+r.Dy())
		if !src.In(image.Rect(0, 0, c.width, c.height)) {
			return fmt.Errorf("copy source %v outside the frame", src)
		}
		c.copyWithin(r, src.Min)
	default:
		return fmt.Errorf("unknown op %d", op)
	}
	return nil
}

// copyWithin copies the same-size rect at src onto dst inside the
// framebuffer, overlap-safe (memmove semantics per row, rows ordered away
// from the overlap).
func (c *Compositor) copyWithin(dst image.Rectangle, src image.Point) {
	h := dst.Dy()
	rowLen := dst.Dx() * 4
	line := func(y int) {
		so := ((src.Y+y)*c.width + src.X) * 4
		do := ((dst.Min.Y+y)*c.width + dst.Min.X) * 4
		copy(c.pix[do:do+rowLen], c.pix[so:so+rowLen])
	}
	if src.Y < dst.Min.Y {
		for y := h - 1; y >= 0; y-- {
			line(y)
		}
		return
	}
	for y := 0; y < h; y++ {
		line(y)
	}
}
