package encode

import (
	"bytes"
	"image/png"
	"testing"
)

func TestPNGStream(t *testing.T) {
	var s PNGStream
	a := sparseDesktop(1281, 801, 8)
	b := sparseDesktop(1281, 801, 8)
	b.fill(700, 300, 760, 316, 10, 20, 30) // inside one band
	c := sparseDesktop(1281, 801, 8)
	c.fill(0, 63, 5, 64, 1, 1, 1) // last row of a band: the next band's filters read it
	for i, img := range []Image{a, b, b, c, a, sparseDesktop(300, 200, 0), denseText(1281, 801, 0)} {
		out, err := s.Encode(nil, img)
		if err != nil {
			t.Fatal(err)
		}
		dec, err := png.Decode(bytes.NewReader(out))
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		checkRGB(t, dec, img)
		checkZlib(t, out, img)
		var fresh PNGStream
		want, _ := fresh.Encode(nil, img)
		if !bytes.Equal(out, want) {
			t.Fatalf("frame %d: cached output differs from a fresh encode", i)
		}
	}
}

func BenchmarkPNGStreamSmallChange(b *testing.B) {
	x := denseText(1280, 800, 0)
	y := denseText(1280, 800, 0)
	y.fill(300, 300, 360, 313, 0, 0, 0) // a typed word
	var s PNGStream
	var out []byte
	cpu := startCPU()
	for i := 0; i < b.N; i++ {
		src := x
		if i%2 == 1 {
			src = y
		}
		var err error
		if out, err = s.Encode(out[:0], src); err != nil {
			b.Fatal(err)
		}
	}
	cpu.report(b)
	b.ReportMetric(float64(len(out)), "bytes/frame")
}
