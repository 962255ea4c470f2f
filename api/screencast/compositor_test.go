package screencast

import (
	"bytes"
	"compress/flate"
	"encoding/binary"
	"errors"
	"image"
	"image/color"
	"image/png"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/api/aci/wire"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

func pngOf(t testing.TB, w, h int, fn func(x, y int) color.RGBA) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			img.SetRGBA(x, y, fn(x, y))
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func rect(x, y, w, h int) *aciv1.Rect {
	return &aciv1.Rect{X: int32(x), Y: int32(y), Width: int32(w), Height: int32(h)}
}

func keyframe(t testing.TB, seq uint64, w, h int, fn func(x, y int) color.RGBA) *aciv1.ScreencastFrame {
	return &aciv1.ScreencastFrame{StreamId: 1, Seq: seq, Keyframe: true, Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG,
		Width: uint32(w), Height: uint32(h), Tiles: []*aciv1.Tile{{Rect: rect(0, 0, w, h), Data: pngOf(t, w, h, fn)}}}
}

// zlibStream plays the server side of the zlib framing: ZLIB_RECORDS, or
// the older ZLIB_BGR tiles when legacy is set.
type zlibStream struct {
	buf    bytes.Buffer
	zw     *flate.Writer
	legacy bool
}

func newZlibStream(t testing.TB) *zlibStream {
	z := &zlibStream{}
	var err error
	if z.zw, err = flate.NewWriter(&z.buf, 6); err != nil {
		t.Fatal(err)
	}
	return z
}

type rec struct {
	r    *aciv1.Rect
	body []byte // op byte + payload (copy sources as int32, the legacy layout)
}

func (z *zlibStream) frame(t testing.TB, seq uint64, w, h int, recs ...rec) *aciv1.ScreencastFrame {
	if !z.legacy {
		return z.records(t, seq, w, h, recs...)
	}
	f := &aciv1.ScreencastFrame{StreamId: 1, Seq: seq, Format: FormatZlibTiles, Width: uint32(w), Height: uint32(h)}
	for i, r := range recs {
		if _, err := z.zw.Write(r.body); err != nil {
			t.Fatal(err)
		}
		if i == len(recs)-1 {
			if err := z.zw.Flush(); err != nil {
				t.Fatal(err)
			}
		}
		f.Tiles = append(f.Tiles, &aciv1.Tile{Rect: r.r, Data: bytes.Clone(z.buf.Bytes())})
		z.buf.Reset()
	}
	return f
}

func (z *zlibStream) records(t testing.TB, seq uint64, w, h int, recs ...rec) *aciv1.ScreencastFrame {
	var in []byte
	for _, r := range recs {
		in = append(in, r.body[0])
		for _, v := range []int32{r.r.GetX(), r.r.GetY(), r.r.GetWidth(), r.r.GetHeight()} {
			in = binary.LittleEndian.AppendUint16(in, uint16(v))
		}
		if r.body[0] == wire.ZlibOpCopy {
			in = binary.LittleEndian.AppendUint16(in, uint16(binary.LittleEndian.Uint32(r.body[1:])))
			in = binary.LittleEndian.AppendUint16(in, uint16(binary.LittleEndian.Uint32(r.body[5:])))
			continue
		}
		in = append(in, r.body[1:]...)
	}
	in = append(in, wire.ZlibOpEnd)
	if _, err := z.zw.Write(in); err != nil {
		t.Fatal(err)
	}
	if err := z.zw.Flush(); err != nil {
		t.Fatal(err)
	}
	chunk, ok := bytes.CutSuffix(z.buf.Bytes(), syncFlushTail)
	if !ok {
		t.Fatalf("sync flush without its tail: %x", z.buf.Bytes())
	}
	z.buf.Reset()
	return &aciv1.ScreencastFrame{StreamId: 1, Seq: seq, Format: FormatZlib, Width: uint32(w), Height: uint32(h), ZlibChunk: bytes.Clone(chunk)}
}

func raw(w, h int, b, g, r byte) []byte {
	out := []byte{wire.ZlibOpRaw}
	for i := 0; i < w*h; i++ {
		out = append(out, b, g, r)
	}
	return out
}

func copyOp(x, y int) []byte {
	out := []byte{wire.ZlibOpCopy, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.LittleEndian.PutUint32(out[1:], uint32(x))
	binary.LittleEndian.PutUint32(out[5:], uint32(y))
	return out
}

func pixelAt(c *Compositor, x, y int) [3]byte {
	pix, w, _ := c.Snapshot(nil)
	o := (y*w + x) * 4
	if c.pf == BGRX {
		return [3]byte{pix[o+2], pix[o+1], pix[o]}
	}
	return [3]byte{pix[o], pix[o+1], pix[o+2]}
}

func TestZlibTilesBothLayouts(t *testing.T) {
	for i := range 4 {
		pf, legacy := []PixelFormat{RGBA, BGRX}[i%2], i >= 2
		c := NewCompositor(pf)
		gradient := func(x, y int) color.RGBA { return color.RGBA{uint8(x), uint8(y), 7, 255} }
		if err := c.Apply(keyframe(t, 1, 64, 48, gradient)); err != nil {
			t.Fatal(err)
		}
		if got := pixelAt(c, 10, 20); got != [3]byte{10, 20, 7} {
			t.Fatalf("keyframe pixel %v", got)
		}
		z := newZlibStream(t)
		z.legacy = legacy
		// raw 4x2 of (r=1,g=2,b=3), solid 3x3 of (r=9,g=8,b=7)
		if err := c.Apply(z.frame(t, 2, 64, 48,
			rec{rect(0, 0, 4, 2), raw(4, 2, 3, 2, 1)},
			rec{rect(30, 30, 3, 3), []byte{wire.ZlibOpSolid, 7, 8, 9}})); err != nil {
			t.Fatal(err)
		}
		if got := pixelAt(c, 3, 1); got != [3]byte{1, 2, 3} {
			t.Fatalf("raw tile pixel %v", got)
		}
		if got := pixelAt(c, 32, 32); got != [3]byte{9, 8, 7} {
			t.Fatalf("solid tile pixel %v", got)
		}
		// Scroll rows 10..47 up by 5 (copy from y=15), then the same raw
		// tile again: the second frame leans on the first's dictionary.
		if err := c.Apply(z.frame(t, 3, 64, 48,
			rec{rect(0, 10, 64, 33), copyOp(0, 15)},
			rec{rect(8, 0, 4, 2), raw(4, 2, 3, 2, 1)})); err != nil {
			t.Fatal(err)
		}
		if got := pixelAt(c, 5, 10); got != [3]byte{5, 15, 7} {
			t.Fatalf("copied pixel %v, want the one from y=15", got)
		}
		if got := pixelAt(c, 9, 1); got != [3]byte{1, 2, 3} {
			t.Fatalf("second raw tile pixel %v", got)
		}
		if st := c.Stats(); st.Frames != 3 || st.Keyframes != 1 || st.Gaps != 0 {
			t.Fatalf("stats %+v", st)
		}
		img := c.Image()
		if r, g, b, _ := img.At(3, 1).RGBA(); r>>8 != 1 || g>>8 != 2 || b>>8 != 3 {
			t.Fatalf("Image() pixel %d %d %d", r>>8, g>>8, b>>8)
		}
	}
}

func TestGapAsksForKeyframe(t *testing.T) {
	var asked []uint32
	c := NewCompositor(RGBA, WithKeyframeRequester(func(id uint32) { asked = append(asked, id) }))
	white := func(x, y int) color.RGBA { return color.RGBA{255, 255, 255, 255} }
	if err := c.Apply(&aciv1.ScreencastFrame{StreamId: 1, Seq: 1, Format: FormatZlib, Width: 8, Height: 8}); !errors.Is(err, ErrAwaitingKeyframe) {
		t.Fatalf("delta before keyframe: %v", err)
	}
	if err := c.Apply(keyframe(t, 2, 8, 8, white)); err != nil {
		t.Fatal(err)
	}
	z := newZlibStream(t)
	f3 := z.frame(t, 3, 8, 8, rec{rect(0, 0, 1, 1), raw(1, 1, 0, 0, 0)})
	f4 := z.frame(t, 4, 8, 8, rec{rect(1, 0, 1, 1), raw(1, 1, 0, 0, 0)})
	_ = f3 // lost on the way
	if err := c.Apply(f4); !errors.Is(err, ErrGap) {
		t.Fatalf("gap: %v", err)
	}
	f5 := z.frame(t, 5, 8, 8, rec{rect(2, 0, 1, 1), raw(1, 1, 0, 0, 0)})
	if err := c.Apply(f5); !errors.Is(err, ErrAwaitingKeyframe) {
		t.Fatalf("after gap: %v", err)
	}
	if len(asked) != 1 || asked[0] != 1 || c.Synced() {
		t.Fatalf("keyframe requests %v, synced %v", asked, c.Synced())
	}
	if err := c.Apply(keyframe(t, 6, 8, 8, white)); err != nil {
		t.Fatal(err)
	}
	// The zlib context restarts after a keyframe.
	z = newZlibStream(t)
	if err := c.Apply(z.frame(t, 7, 8, 8, rec{rect(0, 0, 2, 2), raw(2, 2, 0, 0, 0)})); err != nil {
		t.Fatal(err)
	}
	if !c.Synced() || c.Seq() != 7 || pixelAt(c, 1, 1) != [3]byte{} {
		t.Fatalf("not resynced: seq %d", c.Seq())
	}
}

func TestCorruptFrames(t *testing.T) {
	asked := 0
	c := NewCompositor(BGRX, WithKeyframeRequester(func(uint32) { asked++ }))
	white := func(x, y int) color.RGBA { return color.RGBA{255, 255, 255, 255} }
	for i, f := range []*aciv1.ScreencastFrame{
		// tile outside the frame
		{StreamId: 1, Seq: 2, Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG, Width: 8, Height: 8,
			Tiles: []*aciv1.Tile{{Rect: rect(6, 6, 4, 4), Data: pngOf(t, 4, 4, white)}}},
		// tile image size differs from its rect
		{StreamId: 1, Seq: 2, Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG, Width: 8, Height: 8,
			Tiles: []*aciv1.Tile{{Rect: rect(0, 0, 2, 2), Data: pngOf(t, 4, 4, white)}}},
		// garbage zlib, both framings
		{StreamId: 1, Seq: 2, Format: FormatZlib, ZlibChunk: []byte{0xff, 0x00, 0x12}},
		{StreamId: 1, Seq: 2, Format: FormatZlibTiles, Width: 8, Height: 8,
			Tiles: []*aciv1.Tile{{Rect: rect(0, 0, 2, 2), Data: []byte{0xff, 0x00, 0x12}}}},
		// a zlib record outside the frame
		newZlibStream(t).records(t, 2, 0, 0, rec{rect(6, 6, 4, 4), raw(4, 4, 1, 2, 3)}),
		// a zlib copy from outside the frame
		newZlibStream(t).records(t, 2, 0, 0, rec{rect(0, 0, 4, 4), copyOp(6, 6)}),
		// zlib records with tiles
		{StreamId: 1, Seq: 2, Format: FormatZlib, ZlibChunk: newZlibStream(t).records(t, 2, 0, 0).GetZlibChunk(),
			Tiles: []*aciv1.Tile{{Rect: rect(0, 0, 2, 2), Data: []byte{1}}}},
		// unknown format
		{StreamId: 1, Seq: 2, Format: 42, Width: 8, Height: 8,
			Tiles: []*aciv1.Tile{{Rect: rect(0, 0, 2, 2), Data: []byte{1}}}},
	} {
		if err := c.Apply(keyframe(t, 1, 8, 8, white)); err != nil {
			t.Fatal(err)
		}
		if err := c.Apply(f); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("case %d: %v, want ErrCorrupt", i, err)
		}
		if asked != i+1 {
			t.Fatalf("case %d: %d keyframe requests", i, asked)
		}
	}
}

// TestCompactDeltaFrames: delta frames without geometry, absolute time or
// hash (what a server sends by default) apply onto the keyframe's
// framebuffer, and the capture time is rebuilt from the deltas.
func TestCompactDeltaFrames(t *testing.T) {
	c := NewCompositor(RGBA)
	white := func(x, y int) color.RGBA { return color.RGBA{255, 255, 255, 255} }
	key := keyframe(t, 1, 16, 8, white)
	const keyNs = 1_700_000_000_123_456_789
	key.CapturedAtNs, key.FrameHash = keyNs, bytes.Repeat([]byte{7}, 16)
	if err := c.Apply(key); err != nil {
		t.Fatal(err)
	}
	if got := c.CapturedAt(); got != time.UnixMicro(keyNs/1000) {
		t.Fatalf("keyframe time %v", got)
	}
	if len(c.FrameHash()) != 16 {
		t.Fatalf("keyframe hash %x", c.FrameHash())
	}
	z := newZlibStream(t)
	f2 := z.frame(t, 2, 0, 0, rec{rect(1, 1, 2, 2), raw(2, 2, 0, 0, 0)})
	f2.CapturedAtDeltaUs = 1500
	if err := c.Apply(f2); err != nil {
		t.Fatal(err)
	}
	f3 := z.frame(t, 3, 0, 0, rec{rect(4, 1, 1, 1), []byte{wire.ZlibOpSolid, 1, 2, 3}})
	f3.CapturedAtDeltaUs = 250
	if err := c.Apply(f3); err != nil {
		t.Fatal(err)
	}
	if got, want := c.CapturedAt(), time.UnixMicro(keyNs/1000+1750); got != want {
		t.Fatalf("delta time %v, want %v", got, want)
	}
	if c.FrameHash() != nil {
		t.Fatalf("a hashless delta left the keyframe's hash %x", c.FrameHash())
	}
	if w, h := c.Size(); w != 16 || h != 8 || pixelAt(c, 2, 2) != [3]byte{} || pixelAt(c, 4, 1) != [3]byte{3, 2, 1} {
		t.Fatalf("size %dx%d, pixels %v %v", w, h, pixelAt(c, 2, 2), pixelAt(c, 4, 1))
	}
	// Geometry on a delta frame is still checked when present.
	if err := c.Apply(z.frame(t, 4, 32, 8, rec{rect(0, 0, 1, 1), raw(1, 1, 0, 0, 0)})); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("delta frame with another size: %v", err)
	}
}
