package screencast

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"image"
	"math"

	"github.com/klauspost/compress/flate"

	"github.com/forkfleet/forkfleet/api/aci/wire"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/encode"
)

// Zlib records: the lossless delta encoding whose compression context
// persists across the frames of a stream (what makes VNC's ZRLE cheap for
// typing: a glyph typed before costs a back-reference).
//
// A frame with format FormatZlib carries no tiles: its zlib_chunk is the
// next chunk of one raw DEFLATE stream (RFC 1951, no zlib header) per
// stream, ending with a sync flush whose constant tail 00 00 ff ff is left
// off (as in RFC 7692; the client appends it). The DEFLATE stream starts
// afresh after every keyframe (which is itself PNG or JPEG). Inflated, the
// chunk is records applied in order; integers are uint16 little-endian and
// a rect is x, y, width, height:
//
//	op 0 (raw):   0x00, rect, then width*height pixels row-major, 3 bytes
//	              each: B, G, R
//	op 1 (copy):  0x01, rect, src_x, src_y: the rect is a copy of the
//	              same-size rect at (src_x, src_y) of the client's frame as it
//	              is at this point of applying the frame
//	op 2 (solid): 0x02, rect, B, G, R: the whole rect has this colour
//	op 3 (end):   0x03: the frame's last record
//
// The rects travel inside the compressed stream rather than as protobuf
// Tile messages: a typing update's rect repeats most bytes of the previous
// one (same row, same glyph size), so it costs a few bits instead of the
// 16 bytes of a Tile with its Rect.
const (
	// FormatZlib is the format of zlib delta frames.
	FormatZlib = aciv1.ImageFormat_IMAGE_FORMAT_ZLIB_RECORDS
	// CapabilityZlib is the HelloRequest/HelloResponse capability that
	// enables zlib delta frames on a session.
	CapabilityZlib = "screencast.zlib"
)

// syncFlushTail ends every sync flush (the empty stored block's LEN and
// NLEN); frames leave it off.
var syncFlushTail = []byte{0x00, 0x00, 0xff, 0xff}

// zlibLevel trades guest CPU for bytes. Typing updates are a few hundred
// raw bytes, where the exhaustive match search of level 9 costs
// microseconds and finds the older occurrences of the same glyph in the
// window: measured on xterm typing, 17 B of tile data per update against
// 28 B at level 8 and 50 B at levels 1 to 6. Its cost grows steeply with
// the input (about 7 ms for 64K pixels of dense text), hence zlibMaxArea.
const zlibLevel = 9

// zlibMaxArea is the changed area (pixels) up to which a frame uses zlib
// tiles. Larger repaints (a window opening) gain nothing from the history
// and go out as PNG tiles, whose encoder is parallel and several times
// faster there; the zlib context is untouched by them. A frame carrying a
// scroll copy is zlib whatever its size.
const zlibMaxArea = 16384

// zlibEncoder owns one stream's compression context.
type zlibEncoder struct {
	out bytes.Buffer
	zw  *flate.Writer
	row []byte
}

// reset starts a new DEFLATE stream (after a keyframe).
func (z *zlibEncoder) reset() error {
	z.out.Reset()
	if z.zw == nil {
		zw, err := flate.NewWriter(&z.out, zlibLevel)
		if err != nil {
			return fmt.Errorf("screencast: zlib writer: %w", err)
		}
		z.zw = zw
		return nil
	}
	z.zw.Reset(&z.out)
	return nil
}

// zlibTile is one record to encode: raw (or solid) pixels of rect from
// img, or a copy from src.
type zlibTile struct {
	rect image.Rectangle
	copy bool
	src  image.Point
}

// encode appends the records to the stream and returns the frame's chunk.
// On error the stream is unusable; the caller must send a keyframe next.
func (z *zlibEncoder) encode(img encode.Image, tiles []zlibTile) ([]byte, error) {
	var hdr [16]byte
	rect := func(op byte, r image.Rectangle) []byte {
		hdr[0] = op
		binary.LittleEndian.PutUint16(hdr[1:], uint16(r.Min.X))
		binary.LittleEndian.PutUint16(hdr[3:], uint16(r.Min.Y))
		binary.LittleEndian.PutUint16(hdr[5:], uint16(r.Dx()))
		binary.LittleEndian.PutUint16(hdr[7:], uint16(r.Dy()))
		return hdr[:9]
	}
	for _, t := range tiles {
		if t.rect.Empty() || t.rect.Max.X > math.MaxUint16 || t.rect.Max.Y > math.MaxUint16 || t.rect.Min.X < 0 || t.rect.Min.Y < 0 {
			return nil, fmt.Errorf("screencast: zlib record rect %v out of range", t.rect)
		}
		switch {
		case t.copy:
			b := rect(wire.ZlibOpCopy, t.rect)
			b = binary.LittleEndian.AppendUint16(b, uint16(t.src.X))
			b = binary.LittleEndian.AppendUint16(b, uint16(t.src.Y))
			if _, err := z.zw.Write(b); err != nil {
				return nil, err
			}
		default:
			if c, ok := solid(img, t.rect); ok {
				if _, err := z.zw.Write(append(rect(wire.ZlibOpSolid, t.rect), c[0], c[1], c[2])); err != nil {
					return nil, err
				}
				break
			}
			if _, err := z.zw.Write(rect(wire.ZlibOpRaw, t.rect)); err != nil {
				return nil, err
			}
			w := t.rect.Dx()
			if cap(z.row) < 3*w {
				z.row = make([]byte, 3*w)
			}
			row := z.row[:3*w]
			for y := t.rect.Min.Y; y < t.rect.Max.Y; y++ {
				src := img.Row(y)[t.rect.Min.X*4 : t.rect.Max.X*4]
				for x := 0; x < w; x++ {
					row[3*x], row[3*x+1], row[3*x+2] = src[4*x], src[4*x+1], src[4*x+2]
				}
				if _, err := z.zw.Write(row); err != nil {
					return nil, err
				}
			}
		}
	}
	if _, err := z.zw.Write([]byte{wire.ZlibOpEnd}); err != nil {
		return nil, err
	}
	if err := z.zw.Flush(); err != nil {
		return nil, err
	}
	chunk, ok := bytes.CutSuffix(z.out.Bytes(), syncFlushTail)
	if !ok {
		return nil, errors.New("screencast: zlib sync flush without its 00 00 ff ff tail")
	}
	out := bytes.Clone(chunk)
	// Keep the buffer from growing without bound over a long stream.
	z.out.Reset()
	return out, nil
}

// solid reports whether every pixel of r has the same B, G, R.
func solid(img encode.Image, r image.Rectangle) ([3]byte, bool) {
	first := img.Row(r.Min.Y)[r.Min.X*4:]
	c := [3]byte{first[0], first[1], first[2]}
	for y := r.Min.Y; y < r.Max.Y; y++ {
		row := img.Row(y)[r.Min.X*4 : r.Max.X*4]
		for x := 0; x < len(row); x += 4 {
			if row[x] != c[0] || row[x+1] != c[1] || row[x+2] != c[2] {
				return c, false
			}
		}
	}
	return c, true
}

func protoRect(r image.Rectangle) *aciv1.Rect {
	return &aciv1.Rect{X: int32(r.Min.X), Y: int32(r.Min.Y), Width: int32(r.Dx()), Height: int32(r.Dy())}
}
