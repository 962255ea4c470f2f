package screencast

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"image"

	"github.com/klauspost/compress/flate"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/encode"
)

// Zlib tiles: the lossless delta encoding whose compression context persists
// across the frames of a stream (what makes VNC's ZRLE cheap for typing: a
// glyph typed before costs a back-reference).
//
// Framing of a frame with format FormatZlib: the data of its tiles,
// concatenated in tile order, is the next chunk of one raw DEFLATE stream
// (RFC 1951, no zlib header) per stream, ending with a sync flush
// (00 00 ff ff). The DEFLATE stream starts afresh after every keyframe (which
// is itself PNG or JPEG). Inflated, the chunk holds one record per tile, in
// tile order:
//
//	op 0 (raw):   0x00, then width*height pixels row-major, 3 bytes each: B, G, R
//	op 1 (copy):  0x01, int32 LE src_x, int32 LE src_y: the tile's rect is a
//	              copy of the same-size rect at (src_x, src_y) of the client's
//	              frame as it is at this point of applying the frame
//	op 2 (solid): 0x02, B, G, R: the whole rect has this colour
//
// Tiles are applied in order. How the chunk's bytes are spread over the
// tiles' data fields carries no meaning (the server puts the bytes the
// compressor emitted while writing a tile on that tile, and the flush on the
// last one).
const (
	// FormatZlib is the format of zlib delta frames.
	FormatZlib = aciv1.ImageFormat_IMAGE_FORMAT_ZLIB_BGR
	// CapabilityZlib is the HelloRequest/HelloResponse capability that
	// enables zlib tiles on a session.
	CapabilityZlib = "screencast.zlib"

	zlibOpRaw   = 0
	zlibOpCopy  = 1
	zlibOpSolid = 2
)

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

// zlibTile is one tile to encode: raw pixels of rect from img, or a copy
// from src.
type zlibTile struct {
	rect image.Rectangle
	copy bool
	src  image.Point
}

// encode appends the tiles to the stream and returns one proto tile each.
// On error the stream is unusable; the caller must send a keyframe next.
func (z *zlibEncoder) encode(img encode.Image, tiles []zlibTile) ([]*aciv1.Tile, error) {
	out := make([]*aciv1.Tile, 0, len(tiles))
	taken := 0
	take := func() []byte {
		b := bytes.Clone(z.out.Bytes()[taken:])
		taken = z.out.Len()
		return b
	}
	var hdr [9]byte
	for i, t := range tiles {
		switch {
		case t.copy:
			hdr[0] = zlibOpCopy
			binary.LittleEndian.PutUint32(hdr[1:], uint32(int32(t.src.X)))
			binary.LittleEndian.PutUint32(hdr[5:], uint32(int32(t.src.Y)))
			if _, err := z.zw.Write(hdr[:9]); err != nil {
				return nil, err
			}
		default:
			if c, ok := solid(img, t.rect); ok {
				hdr[0], hdr[1], hdr[2], hdr[3] = zlibOpSolid, c[0], c[1], c[2]
				if _, err := z.zw.Write(hdr[:4]); err != nil {
					return nil, err
				}
				break
			}
			hdr[0] = zlibOpRaw
			if _, err := z.zw.Write(hdr[:1]); err != nil {
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
		if i == len(tiles)-1 {
			if err := z.zw.Flush(); err != nil {
				return nil, err
			}
		}
		out = append(out, &aciv1.Tile{Rect: protoRect(t.rect), Data: take()})
	}
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
