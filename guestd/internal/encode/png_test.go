package encode

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/adler32"
	"image"
	"image/png"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// checkRGB compares a decoded image with the source BGRX frame pixel by pixel.
func checkRGB(t *testing.T, got image.Image, want Image) {
	t.Helper()
	if got.Bounds() != want.Bounds() {
		t.Fatalf("bounds %v, want %v", got.Bounds(), want.Bounds())
	}
	for y := 0; y < want.Height; y++ {
		for x := 0; x < want.Width; x++ {
			r, g, b, a := got.At(x, y).RGBA()
			o := y*want.Stride + x*4
			if byte(r>>8) != want.Pix[o+2] || byte(g>>8) != want.Pix[o+1] || byte(b>>8) != want.Pix[o] || a != 0xffff {
				t.Fatalf("pixel (%d,%d) = %d,%d,%d,%d want %d,%d,%d", x, y, r>>8, g>>8, b>>8, a>>8,
					want.Pix[o+2], want.Pix[o+1], want.Pix[o])
			}
		}
	}
}

func TestPNGRoundTrip(t *testing.T) {
	noise := func(w, h, pad int) Image {
		m := newImage(w, h, pad)
		rng := rand.New(rand.NewPCG(9, uint64(w*h)))
		for i := range m.Pix {
			m.Pix[i] = byte(rng.Uint32())
		}
		return m
	}
	gens := map[string]func(w, h, pad int) Image{
		"sparse": sparseDesktop, "dense": denseText, "photo": photoLike, "noise": noise, "smooth": smooth, "mixed": mixed,
	}
	sizes := [][2]int{{1, 1}, {3, 7}, {7, 3}, {64, 65}, {1281, 801}}
	for name, gen := range gens {
		for _, sz := range sizes {
			for _, pad := range []int{0, 12} {
				for _, conc := range []int{1, 2, 5} {
					t.Run(fmt.Sprintf("%s/%dx%d/pad%d/c%d", name, sz[0], sz[1], pad, conc), func(t *testing.T) {
						src := gen(sz[0], sz[1], pad)
						enc := &PNGEncoder{Concurrency: conc}
						out, err := enc.Encode([]byte("prefix"), src)
						if err != nil {
							t.Fatal(err)
						}
						if !bytes.HasPrefix(out, []byte("prefix")) {
							t.Fatal("dst prefix lost")
						}
						img, err := png.Decode(bytes.NewReader(out[6:]))
						if err != nil {
							t.Fatal(err)
						}
						checkRGB(t, img, src)
						checkZlib(t, out[6:], src)
					})
				}
			}
		}
	}
}

// checkZlib inflates the IDAT stream to its end, which verifies the
// combined Adler-32 (image/png stops reading before the checksum).
func checkZlib(t *testing.T, p []byte, src Image) {
	t.Helper()
	i := bytes.Index(p, []byte("IDAT"))
	n := binary.BigEndian.Uint32(p[i-4:])
	zr, err := zlib.NewReader(bytes.NewReader(p[i+4 : i+4+int(n)]))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("inflate: %v", err)
	}
	if want := src.Height * (1 + 3*src.Width); len(raw) != want {
		t.Fatalf("inflated %d bytes, want %d", len(raw), want)
	}
}

func TestFilterChoice(t *testing.T) {
	count := func(img Image) map[byte]int {
		rb := &rowBufs{sub: make([]byte, 2+3*img.Width), up: make([]byte, 1+3*img.Width)}
		n := map[byte]int{}
		for y := 0; y < img.Height; y++ {
			if row := filterRow(img, y, rb); row == nil {
				n[ftUp]++
			} else {
				n[row[0]]++
			}
		}
		return n
	}
	if n := count(mixed(640, 100, 0)); n[ftPaeth] < 90 {
		t.Errorf("mixed runs/stripes should pick Paeth: %v", n)
	}
	if n := count(sparseDesktop(640, 400, 0)); n[ftPaeth] != 0 || n[ftUp] == 0 {
		t.Errorf("desktop filters: %v", n)
	}
}

// TestFilterPaeth checks the Paeth filter against the PNG spec's decoder,
// since the cheap filter choice rarely picks it on synthetic frames.
func TestFilterPaeth(t *testing.T) {
	for _, img := range []Image{photoLike(97, 5, 0), smooth(64, 3, 4), denseText(50, 20, 0)} {
		w := img.Width
		out := make([]byte, 3*w)
		for y := 1; y < img.Height; y++ {
			cur, prev := img.Row(y), img.Row(y-1)
			filterPaeth(out, cur, prev, w)
			rgb := func(row []byte, i int) byte { // i-th byte of the RGB row
				return row[(i/3)*4+2-i%3]
			}
			dec := make([]byte, 3*w)
			for i := range dec {
				var a, c byte
				if i >= 3 {
					a, c = dec[i-3], rgb(prev, i-3)
				}
				b := rgb(prev, i)
				p := int(a) + int(b) - int(c)
				pa, pb, pc := abs(p-int(a)), abs(p-int(b)), abs(p-int(c))
				pred := c
				if pa <= pb && pa <= pc {
					pred = a
				} else if pb <= pc {
					pred = b
				}
				dec[i] = out[i] + pred
				if dec[i] != rgb(cur, i) {
					t.Fatalf("row %d byte %d: decoded %d want %d", y, i, dec[i], rgb(cur, i))
				}
			}
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func TestPNGLevels(t *testing.T) {
	src := denseText(200, 150, 0)
	for lvl := 1; lvl <= 9; lvl++ {
		out, err := (&PNGEncoder{Level: lvl}).Encode(nil, src)
		if err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(bytes.NewReader(out))
		if err != nil {
			t.Fatalf("level %d: %v", lvl, err)
		}
		checkRGB(t, img, src)
	}
	if _, err := (&PNGEncoder{Level: 10}).Encode(nil, src); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("level 10: %v", err)
	}
}

func TestPNGInvalid(t *testing.T) {
	for _, m := range []Image{
		{},
		{Pix: make([]byte, 10), Stride: 4, Width: 1, Height: 3},
		{Pix: make([]byte, 100), Stride: 4, Width: 2, Height: 2},
	} {
		if _, err := EncodePNG(nil, m); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%+v: err %v", m, err)
		}
	}
}

func TestAdler(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	a := make([]byte, 100_000)
	for i := range a {
		a[i] = byte(rng.Uint32())
	}
	if got, want := adler32Update(1, a), adler32.Checksum(a); got != want {
		t.Fatalf("update %08x want %08x", got, want)
	}
	z := make([]byte, 70_000)
	if got, want := adler32Zeros(adler32Update(1, a), len(z)), adler32.Checksum(append(a[:len(a):len(a)], z...)); got != want {
		t.Fatalf("zeros %08x want %08x", got, want)
	}
	for _, cut := range []int{0, 1, 5551, 65521, 99_999, 100_000} {
		got := adler32Combine(adler32.Checksum(a[:cut]), adler32.Checksum(a[cut:]), len(a)-cut)
		if want := adler32.Checksum(a); got != want {
			t.Fatalf("combine at %d: %08x want %08x", cut, got, want)
		}
	}
}

var benchFrames = map[string]func(w, h, pad int) Image{
	"Sparse": sparseDesktop, "Dense": denseText, "Photo": photoLike,
}

func benchPNG(b *testing.B, name string) {
	src := benchFrames[name](1280, 800, 0)
	var out []byte
	var err error
	b.SetBytes(int64(len(src.Pix)))
	b.ResetTimer()
	cpu := startCPU()
	for i := 0; i < b.N; i++ {
		if out, err = EncodePNG(out[:0], src); err != nil {
			b.Fatal(err)
		}
	}
	cpu.report(b)
	b.ReportMetric(float64(len(out)), "bytes/frame")
}

func BenchmarkPNGSparse(b *testing.B) { benchPNG(b, "Sparse") }
func BenchmarkPNGDense(b *testing.B)  { benchPNG(b, "Dense") }
func BenchmarkPNGPhoto(b *testing.B)  { benchPNG(b, "Photo") }

func BenchmarkStdPNGDenseBestSpeed(b *testing.B) {
	src := denseText(1280, 800, 0)
	rgba := image.NewRGBA(image.Rect(0, 0, 1280, 800))
	for i := 0; i < len(src.Pix); i += 4 {
		rgba.Pix[i], rgba.Pix[i+1], rgba.Pix[i+2], rgba.Pix[i+3] = src.Pix[i+2], src.Pix[i+1], src.Pix[i], 255
	}
	enc := png.Encoder{CompressionLevel: png.BestSpeed}
	var buf bytes.Buffer
	for i := 0; i < b.N; i++ {
		buf.Reset()
		enc.Encode(&buf, rgba)
	}
	b.ReportMetric(float64(buf.Len()), "bytes/frame")
}

func TestAdlerSizes(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	a := make([]byte, 3*65536+100)
	for i := range a {
		a[i] = byte(rng.Uint32())
	}
	ff := make([]byte, 2*65536+7)
	for i := range ff {
		ff[i] = 0xff
	}
	for _, buf := range [][]byte{a, ff} {
		for _, n := range []int{0, 1, 7, 8, 15, 16, 17, 31, 33, 5552, 5553, 65535, 65536, 65536 + 17, len(buf)} {
			for _, start := range []uint32{1, 0xfff0fff0, 0x12345678 % (65521 << 16)} {
				if got, want := adler32Update(start, buf[:n]), adler32Ref(start, buf[:n]); got != want {
					t.Fatalf("n=%d start=%08x: %08x want %08x", n, start, got, want)
				}
			}
		}
	}
}

// adler32Ref is the RFC 1950 definition, byte by byte.
func adler32Ref(adler uint32, p []byte) uint32 {
	s1, s2 := adler&0xffff, adler>>16
	for _, c := range p {
		s1 = (s1 + uint32(c)) % 65521
		s2 = (s2 + s1) % 65521
	}
	return s2<<16 | s1
}

func BenchmarkAdler32(b *testing.B) {
	a := make([]byte, 1<<20)
	for i := range a {
		a[i] = byte(i * 7)
	}
	b.SetBytes(int64(len(a)))
	for i := 0; i < b.N; i++ {
		adler32Update(1, a)
	}
}
