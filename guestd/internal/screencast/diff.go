package screencast

import (
	"bytes"
	"encoding/binary"
	"image"
	"slices"

	"github.com/forkfleet/forkfleet/guestd/internal/encode"
)

// diffTile is the grid on which changed pixels are searched. Each grid cell
// that changed contributes the exact bounding box of its changed pixels, so a
// typed glyph costs its cell, not a whole tile.
const diffTile = encode.TileSize

// mergeSlack is how many unchanged pixels a merge of two rectangles may add
// and still be taken: a tile costs a header on the wire (rect + length,
// about 12 to 20 bytes) and, for PNG tiles, a whole PNG envelope, while a few
// unchanged pixels cost almost nothing once compressed.
const mergeSlack = 96

// maxPairMerge bounds the quadratic merge pass; larger lists (a repaint of
// most of the screen) only merge neighbours along each band.
const maxPairMerge = 64

// changedRects appends to dst the rectangles (in image coordinates, inside
// area) covering every pixel of area where cur differs from ref. Rows are
// compared whole first; only differing rows are split per grid column, and
// each changed grid cell is shrunk to the bounding box of its changed pixels.
// cur and ref must have the same size.
func changedRects(dst []image.Rectangle, cur, ref encode.Image, area image.Rectangle) []image.Rectangle {
	area = area.Intersect(cur.Bounds())
	if area.Empty() {
		return dst
	}
	c0 := area.Min.X / diffTile
	c1 := (area.Max.X + diffTile - 1) / diffTile
	boxes := make([]image.Rectangle, c1-c0)
	for band := area.Min.Y / diffTile * diffTile; band < area.Max.Y; band += diffTile {
		clear(boxes)
		y0, y1 := max(band, area.Min.Y), min(band+diffTile, area.Max.Y)
		for y := y0; y < y1; y++ {
			a := cur.Row(y)[area.Min.X*4 : area.Max.X*4]
			b := ref.Row(y)[area.Min.X*4 : area.Max.X*4]
			if bytes.Equal(a, b) {
				continue
			}
			for c := c0; c < c1; c++ {
				x0, x1 := max(c*diffTile, area.Min.X), min((c+1)*diffTile, area.Max.X)
				lo, hi := (x0-area.Min.X)*4, (x1-area.Min.X)*4
				first, last, ok := diffSpan(a[lo:hi], b[lo:hi])
				if !ok {
					continue
				}
				r := image.Rect(x0+first, y, x0+last+1, y+1)
				if bx := &boxes[c-c0]; bx.Empty() {
					*bx = r
				} else {
					*bx = bx.Union(r)
				}
			}
		}
		start := len(dst)
		for _, bx := range boxes {
			if bx.Empty() {
				continue
			}
			// Cells of one band are in x order: join touching neighbours
			// right away, which keeps typing (glyph + cursor) one rect.
			if n := len(dst); n > start && worthMerging(dst[n-1], bx) {
				dst[n-1] = dst[n-1].Union(bx)
				continue
			}
			dst = append(dst, bx)
		}
	}
	return dst
}

// diffSpan returns the first and last differing pixel of two equal-length
// BGRX spans.
func diffSpan(a, b []byte) (first, last int, ok bool) {
	n := len(a) / 4
	first = -1
	for i := 0; i < n; i++ {
		if binary.LittleEndian.Uint32(a[4*i:]) != binary.LittleEndian.Uint32(b[4*i:]) {
			first = i
			break
		}
	}
	if first < 0 {
		return 0, 0, false
	}
	for i := n - 1; i >= first; i-- {
		if binary.LittleEndian.Uint32(a[4*i:]) != binary.LittleEndian.Uint32(b[4*i:]) {
			return first, i, true
		}
	}
	return first, first, true
}

func area(r image.Rectangle) int { return r.Dx() * r.Dy() }

// worthMerging reports whether replacing a and b by their union adds at most
// mergeSlack pixels that neither covers.
func worthMerging(a, b image.Rectangle) bool {
	covered := area(a) + area(b) - area(a.Intersect(b))
	return area(a.Union(b))-covered <= mergeSlack
}

// mergeRects merges rectangles whose union wastes few pixels, until no pair
// qualifies. The result covers the same pixels (and possibly a few more).
func mergeRects(rs []image.Rectangle) []image.Rectangle {
	if len(rs) < 2 || len(rs) > maxPairMerge {
		return rs
	}
	for merged := true; merged; {
		merged = false
		for i := 0; i < len(rs) && !merged; i++ {
			for j := i + 1; j < len(rs); j++ {
				if worthMerging(rs[i], rs[j]) {
					rs[i] = rs[i].Union(rs[j])
					rs = slices.Delete(rs, j, j+1)
					merged = true
					break
				}
			}
		}
	}
	return rs
}

// copyRect copies r (image coordinates) from src to dst; both have the same
// size.
func copyRect(dst, src encode.Image, r image.Rectangle) {
	r = r.Intersect(dst.Bounds())
	for y := r.Min.Y; y < r.Max.Y; y++ {
		copy(dst.Row(y)[r.Min.X*4:r.Max.X*4], src.Row(y)[r.Min.X*4:r.Max.X*4])
	}
}

// dirtySet is a bounded union of rectangles: past maxDirtyRects the closest
// pair is merged, so a flood of damage costs constant memory.
type dirtySet struct {
	rects []image.Rectangle
}

const maxDirtyRects = 32

func (d *dirtySet) empty() bool { return len(d.rects) == 0 }

func (d *dirtySet) add(r image.Rectangle) {
	if r.Empty() {
		return
	}
	for i, o := range d.rects {
		if r.In(o) {
			return
		}
		if o.In(r) || worthMerging(o, r) {
			d.rects[i] = o.Union(r)
			return
		}
	}
	d.rects = append(d.rects, r)
	if len(d.rects) <= maxDirtyRects {
		return
	}
	// Merge the pair whose union wastes the least.
	bi, bj, best := 0, 1, int(^uint(0)>>1)
	for i := range d.rects {
		for j := i + 1; j < len(d.rects); j++ {
			a, b := d.rects[i], d.rects[j]
			if w := area(a.Union(b)) - area(a) - area(b); w < best {
				bi, bj, best = i, j, w
			}
		}
	}
	d.rects[bi] = d.rects[bi].Union(d.rects[bj])
	d.rects = slices.Delete(d.rects, bj, bj+1)
}

// take returns the rectangles and empties the set.
func (d *dirtySet) take(dst []image.Rectangle) []image.Rectangle {
	dst = append(dst, d.rects...)
	d.rects = d.rects[:0]
	return dst
}
