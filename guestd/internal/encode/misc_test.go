package encode

import (
	"errors"
	"image"
	"reflect"
	"testing"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

func TestScaledSize(t *testing.T) {
	for _, tc := range [][5]int{
		{1280, 800, 1024, 1024, 640},
		{1280, 800, 0, 1280, 800},
		{1280, 800, 2000, 1280, 800},
		{800, 1280, 512, 320, 512},
		{1000, 1, 10, 10, 1},
	} {
		if w, h := ScaledSize(tc[0], tc[1], tc[2]); w != tc[3] || h != tc[4] {
			t.Errorf("ScaledSize(%d,%d,%d) = %d,%d want %d,%d", tc[0], tc[1], tc[2], w, h, tc[3], tc[4])
		}
	}
}

func TestDownscale(t *testing.T) {
	// Exact halving: every output pixel is the rounded mean of a 2x2 block.
	src := photoLike(640, 400, 8)
	out, err := Downscale(nil, src, 320)
	if err != nil {
		t.Fatal(err)
	}
	if out.Width != 320 || out.Height != 200 {
		t.Fatalf("size %dx%d", out.Width, out.Height)
	}
	for y := 0; y < out.Height; y++ {
		for x := 0; x < out.Width; x++ {
			for c := 0; c < 3; c++ {
				var sum int
				for _, d := range [][2]int{{0, 0}, {1, 0}, {0, 1}, {1, 1}} {
					sum += int(src.Pix[(2*y+d[1])*src.Stride+(2*x+d[0])*4+c])
				}
				got, want := int(out.Pix[y*out.Stride+x*4+c]), (sum+2)/4
				if got-want > 1 || want-got > 1 {
					t.Fatalf("(%d,%d,%d) = %d want %d", x, y, c, got, want)
				}
			}
		}
	}
	// Uniform colour stays exactly uniform at a fractional ratio, and the
	// destination buffer is reused.
	flat := newImage(1280, 800, 0)
	flat.fill(0, 0, 1280, 800, 200, 100, 50)
	buf := make([]byte, 0, 1024*640*4)
	out, err = Downscale(buf, flat, 1024)
	if err != nil {
		t.Fatal(err)
	}
	if &out.Pix[0] != &buf[:1][0] {
		t.Error("dst buffer not reused")
	}
	for i := 0; i < len(out.Pix); i += 4 {
		if out.Pix[i] != 50 || out.Pix[i+1] != 100 || out.Pix[i+2] != 200 {
			t.Fatalf("pixel %d = %v", i/4, out.Pix[i:i+3])
		}
	}
	// Already small enough: returned as is.
	if out, _ := Downscale(nil, flat, 1280); &out.Pix[0] != &flat.Pix[0] {
		t.Error("fitting frame was copied")
	}
	if _, err := Downscale(nil, flat, -1); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Error(err)
	}
}

func TestHash128(t *testing.T) {
	a := denseText(301, 77, 0)
	b := denseText(301, 77, 36)
	ha, err := Hash128(a)
	if err != nil {
		t.Fatal(err)
	}
	hb, _ := Hash128(b)
	if ha != hb {
		t.Fatal("hash depends on stride")
	}
	b.Pix[76*b.Stride+300*4+1] ^= 1
	if hb2, _ := Hash128(b); hb2 == ha {
		t.Fatal("one-bit change not detected")
	}
	// Padding is not hashed.
	c := denseText(301, 77, 36)
	for y := 0; y < c.Height; y++ {
		c.Pix[y*c.Stride+301*4] = byte(y)
	}
	if hc, _ := Hash128(c); hc != ha {
		t.Fatal("padding was hashed")
	}
	// Same bytes, different shape.
	flat := newImage(10, 20, 0)
	flat2 := Image{Pix: flat.Pix, Stride: 80, Width: 20, Height: 10}
	h1, _ := Hash128(flat)
	h2, _ := Hash128(flat2)
	if h1 == h2 {
		t.Fatal("shape not part of the hash")
	}
}

// A frame hashed in bands of any height, with any stride, hashes as the
// whole frame does; a band that does not fit, or a short frame, is refused.
func TestBandHasher(t *testing.T) {
	img := denseText(301, 77, 36)
	want, err := Hash128(img)
	if err != nil {
		t.Fatal(err)
	}
	for _, rows := range []int{1, 7, 38, 76, 77} {
		b, err := NewBandHasher(301, 77)
		if err != nil {
			t.Fatal(err)
		}
		for y := 0; y < img.Height; y += rows {
			// Each band in a buffer of its own, packed: a capture's view.
			band := img.SubImage(image.Rect(0, y, 301, min(y+rows, 77)))
			packed := newImage(band.Width, band.Height, 0)
			for r := 0; r < band.Height; r++ {
				copy(packed.Row(r), band.Row(r))
			}
			if err := b.Write(packed); err != nil {
				t.Fatalf("bands of %d: %v", rows, err)
			}
		}
		if got, err := b.Sum(); err != nil || got != want {
			t.Errorf("bands of %d rows: %x (%v), want %x", rows, got, err, want)
		}
	}
	b, _ := NewBandHasher(301, 77)
	if err := b.Write(newImage(300, 1, 0)); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a narrower band: %v", err)
	}
	if err := b.Write(img.SubImage(image.Rect(0, 0, 301, 70))); err != nil {
		t.Fatal(err)
	}
	if err := b.Write(img.SubImage(image.Rect(0, 0, 301, 8))); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a band past the last row: %v", err)
	}
	if _, err := b.Sum(); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("the sum of 70 of 77 rows: %v", err)
	}
	if _, err := NewBandHasher(0, 1); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("an empty frame: %v", err)
	}
}

func TestCompositeARGB(t *testing.T) {
	img := newImage(4, 4, 0)
	img.fill(0, 0, 4, 4, 100, 100, 100)
	sprite := []uint32{
		0xff102030, 0x00000000,
		0x80400000, 0x00000000,
	}
	if err := CompositeARGB(img, 3, 3, sprite, 2, 2); err != nil { // clipped to one pixel
		t.Fatal(err)
	}
	if got := img.Pix[3*img.Stride+3*4 : 3*img.Stride+3*4+3]; !reflect.DeepEqual(got, []byte{0x30, 0x20, 0x10}) {
		t.Fatalf("opaque pixel %v", got)
	}
	if err := CompositeARGB(img, -1, 0, sprite, 2, 2); err != nil {
		t.Fatal(err)
	}
	// (0,0) gets sprite(1,0) = transparent; (0,1) gets sprite(1,1) too.
	if got := img.Pix[0:3]; !reflect.DeepEqual(got, []byte{100, 100, 100}) {
		t.Fatalf("transparent pixel %v", got)
	}
	if err := CompositeARGB(img, 0, 0, sprite, 2, 2); err != nil {
		t.Fatal(err)
	}
	// (0,1): premultiplied red 0x40 at alpha 0x80 over grey 100.
	o := img.Stride
	want := []byte{byte(div255(100 * 127)), byte(div255(100 * 127)), byte(0x40 + div255(100*127))}
	if got := img.Pix[o : o+3]; !reflect.DeepEqual(got, want) {
		t.Fatalf("blended pixel %v want %v", got, want)
	}
	if err := CompositeARGB(img, 0, 0, sprite, 3, 3); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatal(err)
	}
}

func TestDiffTiles(t *testing.T) {
	prev := sparseDesktop(200, 130, 4)
	cur := sparseDesktop(200, 130, 0)
	got, err := DiffTiles(nil, prev, cur)
	if err != nil || len(got) != 0 {
		t.Fatalf("identical frames: %v %v", got, err)
	}
	cur.set(0, 0, 1, 2, 3)
	cur.set(70, 70, 1, 2, 3)
	cur.set(199, 129, 1, 2, 3)
	got, err = DiffTiles(got, prev, cur)
	if err != nil {
		t.Fatal(err)
	}
	want := []image.Rectangle{
		image.Rect(0, 0, 64, 64), image.Rect(64, 64, 128, 128), image.Rect(192, 128, 200, 130),
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v want %v", got, want)
	}
	if _, err := DiffTiles(nil, prev, sparseDesktop(10, 10, 0)); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatal(err)
	}
}

func BenchmarkHash128(b *testing.B) {
	src := denseText(1280, 800, 0)
	b.SetBytes(int64(len(src.Pix)))
	for i := 0; i < b.N; i++ {
		Hash128(src)
	}
}

func BenchmarkDownscale1024(b *testing.B) {
	src := denseText(1280, 800, 0)
	var buf []byte
	cpu := startCPU()
	for i := 0; i < b.N; i++ {
		out, _ := Downscale(buf, src, 1024)
		buf = out.Pix
	}
	cpu.report(b)
}

func BenchmarkDownscale512(b *testing.B) {
	src := denseText(1280, 800, 0)
	var buf []byte
	cpu := startCPU()
	for i := 0; i < b.N; i++ {
		out, _ := Downscale(buf, src, 512)
		buf = out.Pix
	}
	cpu.report(b)
}

func BenchmarkDiffTiles(b *testing.B) {
	prev := denseText(1280, 800, 0)
	cur := denseText(1280, 800, 0)
	cur.fill(300, 300, 340, 316, 1, 2, 3) // a typed word
	var out []image.Rectangle
	for i := 0; i < b.N; i++ {
		out, _ = DiffTiles(out[:0], prev, cur)
	}
}
