package encode

import (
	"fmt"
	"image"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// CompositeARGB draws a premultiplied-alpha ARGB sprite (w x h, row-major,
// 0xAARRGGBB as XFIXES returns cursors) onto img with its top-left corner
// at (x, y) in img coordinates, using the Porter-Duff over operator. Parts
// outside img are clipped.
func CompositeARGB(img Image, x, y int, argb []uint32, w, h int) error {
	if err := img.Validate(); err != nil {
		return err
	}
	if w < 0 || h < 0 || len(argb) < w*h {
		return fmt.Errorf("%w: sprite %dx%d with %d pixels", errdefs.ErrInvalidArgument, w, h, len(argb))
	}
	r := image.Rect(x, y, x+w, y+h).Intersect(img.Bounds())
	for py := r.Min.Y; py < r.Max.Y; py++ {
		srow := argb[(py-y)*w : (py-y+1)*w]
		drow := img.Row(py)
		for px := r.Min.X; px < r.Max.X; px++ {
			s := srow[px-x]
			a := s >> 24
			if a == 0 && s == 0 {
				continue
			}
			d := drow[4*px : 4*px+3 : 4*px+3]
			if a == 0xff {
				d[0], d[1], d[2] = byte(s), byte(s>>8), byte(s>>16)
				continue
			}
			inv := 255 - a
			d[0] = clamp8(s&0xff + div255(uint32(d[0])*inv))
			d[1] = clamp8(s>>8&0xff + div255(uint32(d[1])*inv))
			d[2] = clamp8(s>>16&0xff + div255(uint32(d[2])*inv))
		}
	}
	return nil
}

// div255 is round(v/255) for v <= 255*255.
func div255(v uint32) uint32 { v += 128; return (v + v>>8) >> 8 }

func clamp8(v uint32) byte {
	if v > 255 {
		return 255
	}
	return byte(v)
}
