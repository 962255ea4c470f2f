package screencast

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"image/color"
	"runtime"
	"testing"

	"github.com/forkfleet/forkfleet/api/aci/wire"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// pngBomb is a PNG whose header claims w x h RGBA pixels and whose image
// data is a few bytes: a decoder that trusts the header allocates 4*w*h.
func pngBomb(w, h uint32) []byte {
	chunk := func(out []byte, typ string, data []byte) []byte {
		out = binary.BigEndian.AppendUint32(out, uint32(len(data)))
		start := len(out)
		out = append(out, typ...)
		out = append(out, data...)
		return binary.BigEndian.AppendUint32(out, crc32.ChecksumIEEE(out[start:]))
	}
	ihdr := binary.BigEndian.AppendUint32(nil, w)
	ihdr = binary.BigEndian.AppendUint32(ihdr, h)
	ihdr = append(ihdr, 8, 6, 0, 0, 0) // 8-bit RGBA, no interlace
	var idat bytes.Buffer
	zw := zlib.NewWriter(&idat)
	zw.Write([]byte{0, 0, 0, 0})
	zw.Close()
	out := []byte("\x89PNG\r\n\x1a\n")
	out = chunk(out, "IHDR", ihdr)
	out = chunk(out, "IDAT", idat.Bytes())
	return chunk(out, "IEND", nil)
}

// allocated returns the bytes fn allocated.
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func solid(x, y int) color.RGBA { return color.RGBA{10, 20, 30, 255} }

// TestPNGBombTile is issue #12 item 10: an 81-byte tile whose PNG header
// claims 8000x8000 pixels made the client allocate 244 MiB before it
// noticed the tile was 16x16. The header is checked first now.
func TestPNGBombTile(t *testing.T) {
	c := NewCompositor(RGBA)
	if err := c.Apply(keyframe(t, 1, 64, 64, solid)); err != nil {
		t.Fatal(err)
	}
	bomb := pngBomb(8000, 8000)
	t.Logf("bomb tile: %d bytes", len(bomb))
	var err error
	n := allocated(func() {
		err = c.Apply(&aciv1.ScreencastFrame{StreamId: 1, Seq: 2, Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG,
			Tiles: []*aciv1.Tile{{Rect: rect(0, 0, 16, 16), Data: bomb}}})
	})
	if !errors.Is(err, ErrCorrupt) {
		t.Fatalf("bomb tile: %v", err)
	}
	if n > 1<<20 {
		t.Fatalf("a %d-byte tile made the compositor allocate %d bytes", len(bomb), n)
	}
	// The same header on a keyframe that size is refused as well.
	n = allocated(func() {
		err = c.Apply(&aciv1.ScreencastFrame{StreamId: 1, Seq: 3, Keyframe: true, Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG,
			Width: 64, Height: 64, Tiles: []*aciv1.Tile{{Rect: rect(0, 0, 64, 64), Data: bomb}}})
	})
	if !errors.Is(err, ErrCorrupt) || n > 1<<20 {
		t.Fatalf("bomb keyframe tile: %v, %d bytes allocated", err, n)
	}
}

// TestHugeKeyframe is issue #12 item 10: a keyframe of 32768x32768 made
// the client allocate a 4 GiB framebuffer. Keyframes larger than the
// maximum frame are refused before any allocation; WithMaxFrame tightens
// the maximum.
func TestHugeKeyframe(t *testing.T) {
	c := NewCompositor(RGBA)
	var err error
	n := allocated(func() {
		err = c.Apply(&aciv1.ScreencastFrame{StreamId: 1, Seq: 1, Keyframe: true, Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG,
			Width: 32768, Height: 32768, Tiles: []*aciv1.Tile{{Rect: rect(0, 0, 32768, 32768), Data: pngBomb(32768, 32768)}}})
	})
	if !errors.Is(err, ErrCorrupt) || n > 1<<20 {
		t.Fatalf("32768x32768 keyframe: %v, %d bytes allocated", err, n)
	}
	if w, h := c.Size(); w != 0 || h != 0 {
		t.Fatalf("framebuffer %dx%d after a refused keyframe", w, h)
	}
	small := NewCompositor(RGBA, WithMaxFrame(64, 48))
	if err := small.Apply(keyframe(t, 1, 64, 48, solid)); err != nil {
		t.Fatal(err)
	}
	if err := small.Apply(keyframe(t, 2, 64, 64, solid)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("keyframe over WithMaxFrame: %v", err)
	}
}

// TestPaintBound: a frame may paint a few times its area, not without
// bound. Tiles that each cover the whole frame, or zlib records that fill
// it again and again (a few bytes each once compressed), fail with
// ErrCorrupt once past the bound instead of keeping the client busy.
func TestPaintBound(t *testing.T) {
	const w, h = 256, 256
	full := pngOf(t, w, h, solid)
	c := NewCompositor(RGBA)
	if err := c.Apply(keyframe(t, 1, w, h, solid)); err != nil {
		t.Fatal(err)
	}
	f := &aciv1.ScreencastFrame{StreamId: 1, Seq: 2, Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG}
	for range 100 {
		f.Tiles = append(f.Tiles, &aciv1.Tile{Rect: rect(0, 0, w, h), Data: full})
	}
	if err := c.Apply(f); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("100 full-frame tiles: %v", err)
	}

	c = NewCompositor(RGBA)
	if err := c.Apply(keyframe(t, 1, w, h, solid)); err != nil {
		t.Fatal(err)
	}
	z := newZlibStream(t)
	var recs []rec
	for range 100000 {
		recs = append(recs, rec{rect(0, 0, w, h), []byte{wire.ZlibOpSolid, 1, 2, 3}})
	}
	zf := z.records(t, 2, w, h, recs...)
	t.Logf("100000 full-frame fills in %d bytes", len(zf.GetZlibChunk()))
	before := c.Stats().Tiles
	if err := c.Apply(zf); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("zlib fill bomb: %v", err)
	}
	if n := c.Stats().Tiles - before; n > paintFactor+2 {
		t.Fatalf("%d records applied before the bound stopped them", n)
	}
	// Many tiny records cost their overhead, not just their pixel.
	c = NewCompositor(RGBA)
	if err := c.Apply(keyframe(t, 1, w, h, solid)); err != nil {
		t.Fatal(err)
	}
	z = newZlibStream(t)
	recs = recs[:0]
	for range 100000 {
		recs = append(recs, rec{rect(0, 0, 1, 1), []byte{wire.ZlibOpSolid, 1, 2, 3}})
	}
	if err := c.Apply(z.records(t, 2, w, h, recs...)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("100000 one-pixel records: %v", err)
	}
	// An honest full repaint plus a scroll copy stays well inside.
	c = NewCompositor(RGBA)
	if err := c.Apply(keyframe(t, 1, w, h, solid)); err != nil {
		t.Fatal(err)
	}
	z = newZlibStream(t)
	if err := c.Apply(z.records(t, 2, w, h, rec{rect(0, 0, w, h-16), copyOp(0, 16)}, rec{rect(0, h-16, w, 16), raw(w, 16, 1, 2, 3)})); err != nil {
		t.Fatalf("scroll frame: %v", err)
	}
}
