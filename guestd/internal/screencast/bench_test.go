package screencast

import (
	"image"
	"testing"

	"github.com/forkfleet/forkfleet/guestd/internal/encode"
)

// denseText is a full screen of fake terminal glyphs.
func denseText(w, h int) encode.Image {
	d := newFakeDisplay(w, h)
	for row := 0; row < h/13; row++ {
		for col := 0; col < w/6-2; col++ {
			d.glyph(0, 0, col, row, byte('a'+(row*7+col*3)%26))
		}
	}
	return imageOf(d.snapshot(), w, h)
}

// BenchmarkLargeUpdate compares the tile encoders on a whole dense 1280x800
// repaint (a window opening): zlib tiles against PNG.
func BenchmarkLargeUpdate(b *testing.B) {
	img := denseText(1280, 800)
	full := img.Bounds()
	b.Run("zlib", func(b *testing.B) {
		var z zlibEncoder
		n := 0
		for b.Loop() {
			if err := z.reset(); err != nil {
				b.Fatal(err)
			}
			chunk, err := z.encode(img, []zlibTile{{rect: full}})
			if err != nil {
				b.Fatal(err)
			}
			n = len(chunk)
		}
		b.ReportMetric(float64(n), "bytes")
	})
	b.Run("png", func(b *testing.B) {
		n := 0
		for b.Loop() {
			out, err := encode.EncodePNG(nil, img.SubImage(image.Rect(0, 0, 1280, 800)))
			if err != nil {
				b.Fatal(err)
			}
			n = len(out)
		}
		b.ReportMetric(float64(n), "bytes")
	})
}
