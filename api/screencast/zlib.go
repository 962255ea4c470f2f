package screencast

import (
	"compress/flate"
	"encoding/binary"
	"errors"
	"fmt"
	"image"
	"io"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// Zlib tile framing (see guestd/internal/screencast/zlib.go, the encoder):
// the tiles' data of a frame, concatenated, is the next chunk of one raw
// DEFLATE stream per stream that restarts after each keyframe and ends each
// frame with a sync flush. Inflated, it holds one record per tile:
// 0x00 + w*h*3 bytes B,G,R (raw), 0x01 + int32 LE src x, y (copy from the
// framebuffer as it is at that point), 0x02 + B,G,R (solid fill).
const (
	zlibOpRaw   = 0
	zlibOpCopy  = 1
	zlibOpSolid = 2
)

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

func (z *zlibDecoder) apply(c *Compositor, tiles []*aciv1.Tile, rects []image.Rectangle) error {
	// Keep the previous frame's unread tail (the sync flush's empty stored
	// block, consumed only when the next block is needed).
	tail := z.in.parts[:0]
	for _, p := range z.in.parts {
		if len(p) > 0 {
			tail = append(tail, p)
		}
	}
	z.in.parts = tail
	for _, t := range tiles {
		z.in.parts = append(z.in.parts, t.GetData())
	}
	if z.fr == nil {
		z.fr = flate.NewReader(&z.in)
	}
	fail := func(i int, err error) error {
		// The inflater's state is gone with the error: only a keyframe
		// (which resets it) can resynchronize.
		z.reset()
		return fmt.Errorf("%w: zlib tile %d: %v", ErrCorrupt, i, err)
	}
	for i, r := range rects {
		op, err := z.read(1)
		if err != nil {
			return fail(i, err)
		}
		switch op[0] {
		case zlibOpRaw:
			w := r.Dx()
			for y := 0; y < r.Dy(); y++ {
				src, err := z.read(3 * w)
				if err != nil {
					return fail(i, err)
				}
				d := c.row(r, y)
				for x := 0; x < w; x++ {
					c.putBGR(d[4*x:4*x+4:4*x+4], src[3*x], src[3*x+1], src[3*x+2])
				}
			}
		case zlibOpSolid:
			px, err := z.read(3)
			if err != nil {
				return fail(i, err)
			}
			b, g, rr := px[0], px[1], px[2]
			for y := 0; y < r.Dy(); y++ {
				d := c.row(r, y)
				for x := 0; x < len(d); x += 4 {
					c.putBGR(d[x:x+4:x+4], b, g, rr)
				}
			}
		case zlibOpCopy:
			p, err := z.read(8)
			if err != nil {
				return fail(i, err)
			}
			sx := int(int32(binary.LittleEndian.Uint32(p)))
			sy := int(int32(binary.LittleEndian.Uint32(p[4:])))
			src := image.Rect(sx, sy, sx+r.Dx(), sy+r.Dy())
			if !src.In(image.Rect(0, 0, c.width, c.height)) {
				return fail(i, fmt.Errorf("copy source %v outside the frame", src))
			}
			c.copyWithin(r, src.Min)
		default:
			return fail(i, fmt.Errorf("unknown op %d", op[0]))
		}
	}
	// The frame's chunk ends with a sync flush: the empty stored block is
	// consumed by the next frame's first read, so up to its 5 bytes (plus a
	// partial byte) may remain here.
	if n := z.in.remaining(); n > 6 {
		return fail(len(rects)-1, fmt.Errorf("%d bytes left after the last tile", n))
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
