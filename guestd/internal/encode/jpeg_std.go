//go:build !cgo || noturbojpeg

package encode

import (
	"bytes"
	"image"
	"image/jpeg"
)

// JPEGBackend names the JPEG implementation compiled in.
const JPEGBackend = "image/jpeg"

// encodeJPEG is the pure-Go fallback: image/jpeg needs RGBA, so the frame
// is converted first (about ten times slower than TurboJPEG overall).
func encodeJPEG(dst []byte, img Image, quality int) ([]byte, error) {
	rgba := image.NewRGBA(image.Rect(0, 0, img.Width, img.Height))
	for y := 0; y < img.Height; y++ {
		s := img.Row(y)
		d := rgba.Pix[y*rgba.Stride : y*rgba.Stride+img.Width*4]
		for i := 0; i < len(s); i += 4 {
			d[i], d[i+1], d[i+2], d[i+3] = s[i+2], s[i+1], s[i], 0xff
		}
	}
	buf := bytes.NewBuffer(dst)
	if err := jpeg.Encode(buf, rgba, &jpeg.Options{Quality: quality}); err != nil {
		return dst, err
	}
	return buf.Bytes(), nil
}
