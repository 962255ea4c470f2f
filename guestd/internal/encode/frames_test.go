package encode

import (
	"math"
	"math/rand/v2"
)

// Synthetic BGRX frames standing in for the three content classes the
// encoders are tuned for.

func newImage(w, h, pad int) Image {
	stride := w*4 + pad
	return Image{Pix: make([]byte, stride*h), Stride: stride, Width: w, Height: h}
}

func (m Image) set(x, y int, r, g, b byte) {
	o := y*m.Stride + x*4
	m.Pix[o], m.Pix[o+1], m.Pix[o+2], m.Pix[o+3] = b, g, r, 0
}

func (m Image) fill(x0, y0, x1, y1 int, r, g, b byte) {
	for y := max(y0, 0); y < min(y1, m.Height); y++ {
		for x := max(x0, 0); x < min(x1, m.Width); x++ {
			m.set(x, y, r, g, b)
		}
	}
}

// glyphs are 95 pseudo-random 6x13 bitmaps, dense enough to look like text
// to a compressor.
func glyphs(rng *rand.Rand) [][13]uint8 {
	g := make([][13]uint8, 95)
	for i := range g {
		for r := 2; r < 11; r++ {
			g[i][r] = uint8(rng.IntN(64)) & 0x3e
		}
	}
	return g
}

// drawText lays out lines of words (a fixed vocabulary of glyph runs, as
// real text repeats words) on a 6x13 monospace grid, like a terminal.
func drawText(m Image, rng *rand.Rand, g [][13]uint8, x0, y0, x1, y1 int, fill float64) {
	colors := [][3]byte{{0, 0, 0}, {0, 0, 0}, {0, 0, 0}, {160, 20, 20}, {20, 110, 20}, {30, 30, 170}}
	vocab := make([][]int, 300)
	for i := range vocab {
		w := make([]int, 2+rng.IntN(8))
		for j := range w {
			w[j] = rng.IntN(len(g))
		}
		vocab[i] = w
	}
	cols := (x1 - x0) / 6
	for y := y0; y+13 <= y1; y += 13 {
		lineLen := int(float64(cols) * fill * (0.3 + 0.7*rng.Float64()))
		c := colors[rng.IntN(len(colors))]
		col := rng.IntN(3) * 2 // indentation
		for col < lineLen {
			for _, gi := range vocab[rng.IntN(len(vocab))] {
				if col >= cols {
					break
				}
				gl := g[gi]
				for r := 0; r < 13; r++ {
					for b := 0; b < 6; b++ {
						px, py := x0+col*6+b, y+r
						if gl[r]&(1<<b) != 0 && px < x1 && px < m.Width && py < m.Height {
							m.set(px, py, c[0], c[1], c[2])
						}
					}
				}
				col++
			}
			col++ // space
		}
	}
}

func denseText(w, h, pad int) Image {
	m := newImage(w, h, pad)
	m.fill(0, 0, w, h, 255, 255, 255)
	rng := rand.New(rand.NewPCG(1, 2))
	drawText(m, rng, glyphs(rng), 0, 0, w, h, 0.95)
	return m
}

func sparseDesktop(w, h, pad int) Image {
	m := newImage(w, h, pad)
	m.fill(0, 0, w, h, 48, 92, 120)               // wallpaper
	m.fill(0, h-32, w, h, 40, 40, 44)             // panel
	m.fill(w/8, h/8, w/2, h/2, 240, 240, 240)     // window 1
	m.fill(w/8, h/8, w/2, h/8+24, 70, 70, 80)     // title bar
	m.fill(w/3, h/3, w*7/8, h*3/4, 250, 250, 250) // window 2
	m.fill(w/3, h/3, w*7/8, h/3+24, 60, 90, 160)
	rng := rand.New(rand.NewPCG(3, 4))
	g := glyphs(rng)
	drawText(m, rng, g, w/3+8, h/3+32, w*7/8-8, h/3+32+13*8, 0.9)
	drawText(m, rng, g, w/8+8, h/8+32, w/3-8, h/8+32+13*4, 0.9)
	for i := 0; i < 8; i++ { // panel icons
		m.fill(8+i*40, h-28, 8+i*40+24, h-4, byte(40*i), 200, byte(255-30*i))
	}
	return m
}

func photoLike(w, h, pad int) Image {
	m := newImage(w, h, pad)
	rng := rand.New(rand.NewPCG(5, 6))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			fx, fy := float64(x)/float64(w), float64(y)/float64(h)
			r := 128 + 100*math.Sin(fx*9+fy*3)
			g := 128 + 100*math.Sin(fx*4-fy*7+1)
			b := 128 + 100*math.Cos(fx*fy*20)
			n := func(v float64) byte { return byte(min(255, max(0, v+float64(rng.IntN(17)-8)))) }
			m.set(x, y, n(r), n(g), n(b))
		}
	}
	return m
}

// smooth is a noiseless diagonal gradient: the content Paeth is for.
func smooth(w, h, pad int) Image {
	m := newImage(w, h, pad)
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			m.set(x, y, byte(x*3+y*5), byte(x*7-y*2), byte((x+y)*11/3))
		}
	}
	return m
}

// mixed has horizontal runs on the left half and vertical stripes on the
// right: Sub and Up each fail on one half, Paeth predicts both.
func mixed(w, h, pad int) Image {
	m := newImage(w, h, pad)
	rng := rand.New(rand.NewPCG(7, 8))
	cols := make([][3]byte, w)
	for x := range cols {
		cols[x] = [3]byte{byte(rng.Uint32()), byte(rng.Uint32()), byte(rng.Uint32())}
	}
	for y := 0; y < h; y++ {
		row := [3]byte{byte(rng.Uint32()), byte(rng.Uint32()), byte(rng.Uint32())}
		for x := 0; x < w; x++ {
			c := cols[x]
			if x < w/2 {
				c = row
			}
			m.set(x, y, c[0], c[1], c[2])
		}
	}
	return m
}
