package encode

import (
	"fmt"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// DefaultJPEGQuality is the quality used when the caller passes 0.
const DefaultJPEGQuality = 80

// EncodeJPEG appends a baseline JPEG (4:2:0 chroma subsampling) of img at
// quality 1..100 (0 means DefaultJPEGQuality) to dst. The default build
// uses TurboJPEG through cgo; the noturbojpeg build tag (or CGO_ENABLED=0)
// selects the much slower image/jpeg.
func EncodeJPEG(dst []byte, img Image, quality int) ([]byte, error) {
	if err := img.Validate(); err != nil {
		return dst, err
	}
	if quality == 0 {
		quality = DefaultJPEGQuality
	}
	if quality < 1 || quality > 100 {
		return dst, fmt.Errorf("%w: jpeg quality %d not in 1..100", errdefs.ErrInvalidArgument, quality)
	}
	if img.Width > 65535 || img.Height > 65535 {
		return dst, fmt.Errorf("%w: image %dx%d exceeds the JPEG size limit", errdefs.ErrInvalidArgument, img.Width, img.Height)
	}
	return encodeJPEG(dst, img, quality)
}
