package encode

import (
	"bytes"
	"errors"
	"fmt"
	"image/jpeg"
	"math"
	"testing"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// psnr of a decoded image against the source frame, over R, G and B.
func psnr(t *testing.T, data []byte, src Image) float64 {
	t.Helper()
	img, err := jpeg.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if img.Bounds() != src.Bounds() {
		t.Fatalf("bounds %v want %v", img.Bounds(), src.Bounds())
	}
	var se float64
	for y := 0; y < src.Height; y++ {
		for x := 0; x < src.Width; x++ {
			r, g, b, _ := img.At(x, y).RGBA()
			o := y*src.Stride + x*4
			for i, v := range []uint32{b >> 8, g >> 8, r >> 8} {
				d := float64(v) - float64(src.Pix[o+i])
				se += d * d
			}
		}
	}
	mse := se / float64(3*src.Width*src.Height)
	if mse == 0 {
		return math.Inf(1)
	}
	return 10 * math.Log10(255*255/mse)
}

func TestJPEG(t *testing.T) {
	for _, tc := range []struct {
		name    string
		img     Image
		quality int
		minPSNR float64
	}{
		{"photo-q80", photoLike(1280, 800, 0), 80, 28},
		{"photo-q80-padded", photoLike(333, 211, 20), 80, 28},
		{"desktop-q90", sparseDesktop(640, 400, 0), 90, 28},
		{"photo-q10", photoLike(320, 200, 0), 10, 20},
		{"tiny", photoLike(1, 1, 0), 0, 10},
		{"odd", photoLike(3, 7, 4), 100, 12}, // 4:2:0 chroma on 3x7 pixels of noise
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := EncodeJPEG([]byte("x"), tc.img, tc.quality)
			if err != nil {
				t.Fatal(err)
			}
			if out[0] != 'x' {
				t.Fatal("dst prefix lost")
			}
			if p := psnr(t, out[1:], tc.img); p < tc.minPSNR {
				t.Fatalf("PSNR %.1f dB < %.1f", p, tc.minPSNR)
			} else {
				t.Logf("%s: %d bytes, PSNR %.1f dB", JPEGBackend, len(out)-1, p)
			}
		})
	}
	for _, q := range []int{-1, 101} {
		if _, err := EncodeJPEG(nil, photoLike(8, 8, 0), q); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("quality %d: %v", q, err)
		}
	}
}

func TestJPEGConcurrent(t *testing.T) {
	src := sparseDesktop(300, 200, 0)
	errs := make(chan error, 16)
	for i := 0; i < 16; i++ {
		go func() {
			out, err := EncodeJPEG(nil, src, 50+i)
			if err == nil {
				if _, derr := jpeg.Decode(bytes.NewReader(out)); derr != nil {
					err = fmt.Errorf("decode: %w", derr)
				}
			}
			errs <- err
		}()
	}
	for i := 0; i < 16; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

func benchJPEG(b *testing.B, name string, q int) {
	src := benchFrames[name](1280, 800, 0)
	var out []byte
	var err error
	b.ResetTimer()
	cpu := startCPU()
	for i := 0; i < b.N; i++ {
		if out, err = EncodeJPEG(out[:0], src, q); err != nil {
			b.Fatal(err)
		}
	}
	cpu.report(b)
	b.ReportMetric(float64(len(out)), "bytes/frame")
}

func BenchmarkJPEGSparseQ80(b *testing.B) { benchJPEG(b, "Sparse", 80) }
func BenchmarkJPEGDenseQ80(b *testing.B)  { benchJPEG(b, "Dense", 80) }
func BenchmarkJPEGPhotoQ80(b *testing.B)  { benchJPEG(b, "Photo", 80) }
func BenchmarkJPEGPhotoQ50(b *testing.B)  { benchJPEG(b, "Photo", 50) }
