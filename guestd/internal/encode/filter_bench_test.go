package encode

import "testing"

func BenchmarkFilterRowsDense(b *testing.B) {
	img := denseText(1280, 800, 0)
	rb := &rowBufs{sub: make([]byte, 1+3*1280+1), up: make([]byte, 1+3*1280)}
	for i := 0; i < b.N; i++ {
		for y := 0; y < img.Height; y++ {
			filterRow(img, y, rb)
		}
	}
}
