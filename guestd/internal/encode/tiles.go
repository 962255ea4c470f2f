package encode

import (
	"bytes"
	"fmt"
	"image"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// TileSize is the edge of the delta-screencast tiles.
const TileSize = 64

// DiffTiles appends to dst the TileSize x TileSize tiles (clipped at the
// right and bottom edges, in image coordinates, row-major order) in which
// cur differs from prev. Both frames must have the same size. Each row is
// compared whole first, and only differing rows are split per tile.
func DiffTiles(dst []image.Rectangle, prev, cur Image) ([]image.Rectangle, error) {
	if err := prev.Validate(); err != nil {
		return dst, err
	}
	if err := cur.Validate(); err != nil {
		return dst, err
	}
	if prev.Width != cur.Width || prev.Height != cur.Height {
		return dst, fmt.Errorf("%w: frame sizes differ: %dx%d vs %dx%d", errdefs.ErrInvalidArgument,
			prev.Width, prev.Height, cur.Width, cur.Height)
	}
	cols := (cur.Width + TileSize - 1) / TileSize
	dirty := make([]bool, cols)
	const tb = TileSize * 4
	for ty := 0; ty < cur.Height; ty += TileSize {
		clear(dirty)
		nDirty := 0
		yEnd := min(ty+TileSize, cur.Height)
		for y := ty; y < yEnd && nDirty < cols; y++ {
			a, b := prev.Row(y), cur.Row(y)
			if bytes.Equal(a, b) {
				continue
			}
			for c := 0; c < cols; c++ {
				if dirty[c] {
					continue
				}
				lo, hi := c*tb, min((c+1)*tb, len(b))
				if !bytes.Equal(a[lo:hi], b[lo:hi]) {
					dirty[c] = true
					nDirty++
				}
			}
		}
		for c, d := range dirty {
			if d {
				dst = append(dst, image.Rect(c*TileSize, ty, min((c+1)*TileSize, cur.Width), yEnd))
			}
		}
	}
	return dst, nil
}
