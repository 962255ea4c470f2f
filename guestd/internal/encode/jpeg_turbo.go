//go:build cgo && !noturbojpeg

package encode

/*
#cgo LDFLAGS: -lturbojpeg
#include <stdlib.h>
#include <turbojpeg.h>
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// JPEGBackend names the JPEG implementation compiled in.
const JPEGBackend = "turbojpeg"

// tjCompressor is a TurboJPEG compress handle plus its output buffer, sized
// with tjBufSize so TJFLAG_NOREALLOC holds.
type tjCompressor struct {
	h   C.tjhandle
	buf *C.uchar
	cap C.ulong
}

// tjIdle keeps up to GOMAXPROCS idle compressors; a compressor is used by
// one goroutine at a time and extra ones made under burst are destroyed.
var tjIdle = make(chan *tjCompressor, max(2, runtime.GOMAXPROCS(0)))

func getCompressor() (*tjCompressor, error) {
	select {
	case c := <-tjIdle:
		return c, nil
	default:
	}
	h := C.tjInitCompress()
	if h == nil {
		return nil, errors.New("encode: tjInitCompress failed")
	}
	return &tjCompressor{h: h}, nil
}

func putCompressor(c *tjCompressor) {
	select {
	case tjIdle <- c:
	default:
		c.destroy()
	}
}

func (c *tjCompressor) destroy() {
	if c.buf != nil {
		C.tjFree(c.buf)
		c.buf = nil
	}
	C.tjDestroy(c.h)
}

func encodeJPEG(dst []byte, img Image, quality int) ([]byte, error) {
	c, err := getCompressor()
	if err != nil {
		return dst, err
	}
	defer putCompressor(c)

	need := C.tjBufSize(C.int(img.Width), C.int(img.Height), C.TJSAMP_420)
	if need == C.ulong(^C.ulong(0)) {
		return dst, fmt.Errorf("%w: tjBufSize rejected %dx%d", errdefs.ErrInvalidArgument, img.Width, img.Height)
	}
	if c.cap < need {
		if c.buf != nil {
			C.tjFree(c.buf)
		}
		c.buf = C.tjAlloc(C.int(need))
		if c.buf == nil {
			c.cap = 0
			return dst, fmt.Errorf("encode: tjAlloc(%d) failed", need)
		}
		c.cap = need
	}
	out := c.buf
	size := c.cap
	// The source is Go memory holding no Go pointers, which cgo allows to
	// pass for the duration of the call; BGRX is TurboJPEG's TJPF_BGRX.
	rc := C.tjCompress2(c.h, (*C.uchar)(unsafe.Pointer(&img.Pix[0])),
		C.int(img.Width), C.int(img.Stride), C.int(img.Height), C.TJPF_BGRX,
		&out, &size, C.TJSAMP_420, C.int(quality), C.TJFLAG_NOREALLOC|C.TJFLAG_FASTDCT)
	runtime.KeepAlive(img.Pix)
	if rc != 0 {
		return dst, fmt.Errorf("encode: tjCompress2: %s", C.GoString(C.tjGetErrorStr2(c.h)))
	}
	return append(dst, unsafe.Slice((*byte)(unsafe.Pointer(out)), int(size))...), nil
}
