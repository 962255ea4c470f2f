// Package encode holds the pixel pipeline of guestd: PNG and JPEG encoders
// that read BGRX frames directly, a box-filter downscaler, a 128-bit frame
// hash, cursor compositing and a tile diff. Everything here is a pure
// function over memory buffers; nothing depends on X.
package encode

import (
	"fmt"
	"image"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// Image is a BGRX frame: 4 bytes per pixel in memory order B, G, R, X (the
// X byte is ignored). Row y starts at Pix[y*Stride]; Stride may include
// padding, which is never read.
type Image struct {
	Pix    []byte
	Stride int
	Width  int
	Height int
}

// Validate reports whether the geometry is consistent with Pix.
func (m Image) Validate() error {
	if m.Width <= 0 || m.Height <= 0 {
		return fmt.Errorf("%w: image size %dx%d", errdefs.ErrInvalidArgument, m.Width, m.Height)
	}
	if m.Stride < m.Width*4 {
		return fmt.Errorf("%w: stride %d < 4*width %d", errdefs.ErrInvalidArgument, m.Stride, m.Width*4)
	}
	if need := (m.Height-1)*m.Stride + m.Width*4; len(m.Pix) < need {
		return fmt.Errorf("%w: pixel buffer %d bytes, need %d", errdefs.ErrInvalidArgument, len(m.Pix), need)
	}
	return nil
}

// Bounds is the image rectangle with origin (0,0).
func (m Image) Bounds() image.Rectangle { return image.Rect(0, 0, m.Width, m.Height) }

// Row returns the Width*4 bytes of row y, without stride padding.
func (m Image) Row(y int) []byte {
	o := y * m.Stride
	return m.Pix[o : o+m.Width*4 : o+m.Width*4]
}

// SubImage returns the part of m inside r (clipped to m.Bounds()), sharing
// pixels with m.
func (m Image) SubImage(r image.Rectangle) Image {
	r = r.Intersect(m.Bounds())
	if r.Empty() {
		return Image{}
	}
	o := r.Min.Y*m.Stride + r.Min.X*4
	return Image{Pix: m.Pix[o:], Stride: m.Stride, Width: r.Dx(), Height: r.Dy()}
}

// contiguous reports whether the rows are packed without padding.
func (m Image) contiguous() bool { return m.Stride == m.Width*4 }

// grow returns b resliced to n bytes, reallocating only when its capacity
// is too small.
func grow(b []byte, n int) []byte {
	if cap(b) >= n {
		return b[:n]
	}
	return make([]byte, n)
}
