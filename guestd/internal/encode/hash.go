package encode

import (
	"fmt"
	"sync"

	"github.com/zeebo/xxh3"

	"github.com/forkfleet/forkfleet/api/errdefs"
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
	seed := frameSeed(img.Width, img.Height)
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

// frameSeed seeds a frame's hash with its size (Hash128, BandHasher).
func frameSeed(width, height int) uint64 { return uint64(width)<<32 | uint64(height) }

// BandHasher computes Hash128 of a frame fed in bands of whole rows, top to
// bottom, so a frame can be hashed without ever being in memory at once.
type BandHasher struct {
	h             *xxh3.Hasher128
	width, height int
	rows          int // rows written so far
}

// NewBandHasher starts the hash of a width x height frame.
func NewBandHasher(width, height int) (*BandHasher, error) {
	if width <= 0 || height <= 0 {
		return nil, fmt.Errorf("%w: frame size %dx%d", errdefs.ErrInvalidArgument, width, height)
	}
	h := xxh3.New128()
	h.ResetSeed(frameSeed(width, height))
	return &BandHasher{h: h, width: width, height: height}, nil
}

// Write hashes the next band: img must be as wide as the frame and fit in
// the rows that are left.
func (b *BandHasher) Write(img Image) error {
	if err := img.Validate(); err != nil {
		return err
	}
	if img.Width != b.width || b.rows+img.Height > b.height {
		return fmt.Errorf("%w: band %dx%d at row %d of a %dx%d frame", errdefs.ErrInvalidArgument, img.Width, img.Height, b.rows, b.width, b.height)
	}
	for y := 0; y < img.Height; y++ {
		b.h.Write(img.Row(y))
	}
	b.rows += img.Height
	return nil
}

// Sum is Hash128 of the frame once every row was written.
func (b *BandHasher) Sum() ([16]byte, error) {
	if b.rows != b.height {
		return [16]byte{}, fmt.Errorf("%w: %d of %d rows hashed", errdefs.ErrInvalidArgument, b.rows, b.height)
	}
	return b.h.Sum128().Bytes(), nil
}
