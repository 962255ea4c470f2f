package screencast

import (
	"bytes"
	"image"

	"github.com/zeebo/xxh3"

	"github.com/forkfleet/forkfleet/guestd/internal/encode"
)

// Scroll detection: a terminal or a browser that scrolls repaints a large
// rectangle whose rows are the previous rows shifted. Sending it as a copy
// of what the client already holds (a CopyRect) plus the few new rows costs
// a few hundred bytes instead of the whole area.
const (
	// minScrollRows/minScrollWidth: smaller rectangles are cheap to send.
	minScrollRows  = 32
	minScrollWidth = 32
	// minScrollVotes is how many distinct, non-blank rows must agree on the
	// shift before it is trusted.
	minScrollVotes = 4
)

// scrollDetector keeps its scratch between frames.
type scrollDetector struct {
	cur, ref []uint64
	flat     []bool
	index    map[uint64]int32
	votes    map[int]int
}

// detect looks for a vertical shift dy such that the rows of out inside r
// are the rows of ref at y+dy. On success it returns the destination
// rectangle of the copy and the source point (both image coordinates);
// the caller applies the copy to ref before diffing.
func (sd *scrollDetector) detect(out, ref encode.Image, r image.Rectangle) (dst image.Rectangle, src image.Point, ok bool) {
	if r.Dy() < minScrollRows || r.Dx() < minScrollWidth {
		return
	}
	h := r.Dy()
	sd.cur = growU64(sd.cur, h)
	sd.ref = growU64(sd.ref, h)
	if cap(sd.flat) < h {
		sd.flat = make([]bool, h)
	}
	sd.flat = sd.flat[:h]
	lo, hi := r.Min.X*4, r.Max.X*4
	unchanged := 0
	for i := 0; i < h; i++ {
		a := out.Row(r.Min.Y + i)[lo:hi]
		b := ref.Row(r.Min.Y + i)[lo:hi]
		sd.cur[i] = xxh3.Hash(a)
		sd.ref[i] = xxh3.Hash(b)
		// A row of one colour matches any other such row: no evidence.
		sd.flat[i] = bytes.Equal(a[4:], a[:len(a)-4])
		if sd.cur[i] == sd.ref[i] {
			unchanged++
		}
	}
	if sd.index == nil {
		sd.index, sd.votes = map[uint64]int32{}, map[int]int{}
	}
	clear(sd.index)
	clear(sd.votes)
	for i, v := range sd.ref {
		if _, dup := sd.index[v]; dup {
			sd.index[v] = -1
			continue
		}
		sd.index[v] = int32(i)
	}
	for i, v := range sd.cur {
		if sd.flat[i] {
			continue
		}
		if j, hit := sd.index[v]; hit && j >= 0 && int(j) != i {
			sd.votes[int(j)-i]++
		}
	}
	best, bestVotes := 0, 0
	for dy, n := range sd.votes {
		if n > bestVotes || (n == bestVotes && abs(dy) < abs(best)) {
			best, bestVotes = dy, n
		}
	}
	if bestVotes < minScrollVotes {
		return
	}
	dy := best
	// Rows i whose source i+dy lies inside r.
	i0, i1 := max(0, -dy), min(h, h-dy)
	matched := 0
	for i := i0; i < i1; i++ {
		if sd.cur[i] == sd.ref[i+dy] {
			matched++
		}
	}
	// Worth it only when the copy explains clearly more rows than leaving
	// them in place does.
	if matched < (i1-i0)/2 || matched <= unchanged+minScrollVotes {
		return
	}
	dst = image.Rect(r.Min.X, r.Min.Y+i0, r.Max.X, r.Min.Y+i1)
	return dst, image.Pt(r.Min.X, dst.Min.Y+dy), true
}

// copyWithin copies the same-size rectangle at src onto dst inside img,
// safe for overlap.
func copyWithin(img encode.Image, dst image.Rectangle, src image.Point) {
	lo, hi := dst.Min.X*4, dst.Max.X*4
	sx := (src.X - dst.Min.X) * 4
	line := func(i int) {
		copy(img.Row(dst.Min.Y + i)[lo:hi], img.Row(src.Y + i)[lo+sx:hi+sx])
	}
	if src.Y < dst.Min.Y {
		for i := dst.Dy() - 1; i >= 0; i-- {
			line(i)
		}
		return
	}
	for i := 0; i < dst.Dy(); i++ {
		line(i)
	}
}

func growU64(b []uint64, n int) []uint64 {
	if cap(b) < n {
		return make([]uint64, n)
	}
	return b[:n]
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}
