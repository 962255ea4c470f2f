package encode

import (
	"sync"

	"github.com/zeebo/xxh3"
)

var hasherPool = sync.Pool{New: func() any { return xxh3.New128() }}

// Hash128 is the 128-bit XXH3 of the frame's pixels, row by row (stride
// padding is never hashed), seeded with the frame size so equal bytes in a
// different shape hash differently. Equal pixels give equal hashes whatever
// the strides. The result is the canonical big-endian form of the hash.
func Hash128(img Image) ([16]byte, error) {
	if err := img.Validate(); err != nil {
		return [16]byte{}, err
	}
	seed := uint64(img.Width)<<32 | uint64(img.Height)
	if img.contiguous() {
		return xxh3.Hash128Seed(img.Pix[:img.Width*img.Height*4], seed).Bytes(), nil
	}
	h := hasherPool.Get().(*xxh3.Hasher128)
	defer hasherPool.Put(h)
	h.ResetSeed(seed)
	for y := 0; y < img.Height; y++ {
		h.Write(img.Row(y))
	}
	return h.Sum128().Bytes(), nil
}
