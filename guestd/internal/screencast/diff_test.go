package screencast

import (
	"image"
	"math/rand/v2"
	"testing"
)

func TestChangedRectsCoverAndShrink(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 9))
	const w, h = 300, 200
	for iter := 0; iter < 200; iter++ {
		ref := newImage(w, h)
		cur := newImage(w, h)
		var want []image.Point
		for n := rng.IntN(6); n > 0; n-- {
			x, y := rng.IntN(w), rng.IntN(h)
			cur.Pix[y*cur.Stride+4*x+1] = 0x80
			want = append(want, image.Pt(x, y))
		}
		area := image.Rect(rng.IntN(50), rng.IntN(50), w-rng.IntN(50), h-rng.IntN(50))
		rs := mergeRects(changedRects(nil, cur, ref, area))
		for _, p := range want {
			inArea := p.In(area)
			covered := false
			for _, r := range rs {
				if p.In(r) {
					covered = true
				}
			}
			if inArea != covered {
				t.Fatalf("iter %d: point %v in area %v: covered=%v by %v", iter, p, area, covered, rs)
			}
		}
		for _, r := range rs {
			if !r.In(area) {
				t.Fatalf("rect %v outside area %v", r, area)
			}
		}
	}
	// A single changed pixel yields exactly that pixel.
	ref, cur := newImage(w, h), newImage(w, h)
	cur.Pix[70*cur.Stride+4*100] = 1
	if rs := changedRects(nil, cur, ref, cur.Bounds()); len(rs) != 1 || rs[0] != image.Rect(100, 70, 101, 71) {
		t.Fatalf("single pixel: %v", rs)
	}
}

func TestDirtySetBounded(t *testing.T) {
	var d dirtySet
	rng := rand.New(rand.NewPCG(1, 1))
	union := image.Rectangle{}
	for i := 0; i < 10000; i++ {
		x, y := rng.IntN(1000), rng.IntN(700)
		r := image.Rect(x, y, x+1+rng.IntN(30), y+1+rng.IntN(30))
		union = union.Union(r)
		d.add(r)
		if len(d.rects) > maxDirtyRects {
			t.Fatalf("%d rects", len(d.rects))
		}
	}
	got := image.Rectangle{}
	for _, r := range d.take(nil) {
		got = got.Union(r)
	}
	if got != union || !d.empty() {
		t.Fatalf("bounding box %v, want %v", got, union)
	}
}
