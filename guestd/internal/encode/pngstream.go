package encode

import (
	"fmt"
	"image"
	"sync"
	"sync/atomic"
)

// streamBandRows is the height of the row bands PNGStream caches: small
// enough that a typical agent step (a typed word, a hovered button)
// invalidates one or two of the 25 bands of a 1280x800 frame and re-encodes
// little, large enough that restarting the deflate dictionary per band
// costs little (about 0.3% on dense text against 64-row bands).
const streamBandRows = 32

// PNGStream encodes successive frames of one screen, reusing the deflate
// output of row bands whose pixels (and the row above them, which the
// filters read) did not change since the previous frame; unchanged bands
// are recognised by their 128-bit XXH3 hash. Bands are hashed and encoded
// in parallel. Its output is byte-identical to that of a fresh PNGStream.
// A PNGStream is not safe for concurrent use; use one per frame source.
type PNGStream struct {
	// Encoder supplies level and concurrency; nil means the defaults.
	Encoder *PNGEncoder

	width, height, level int
	bands                []pngBand
}

type pngBand struct {
	valid bool
	key   [16]byte
	enc   pngStripe // its buf holds the band's deflate output
}

// Reset forgets the cached bands.
func (s *PNGStream) Reset() { s.bands = s.bands[:0] }

// Encode appends the PNG encoding of img to dst.
func (s *PNGStream) Encode(dst []byte, img Image) ([]byte, error) {
	e := s.Encoder
	if e == nil {
		e = &defaultPNG
	}
	level, workers, err := e.params(img)
	if err != nil {
		return dst, err
	}
	nb := (img.Height + streamBandRows - 1) / streamBandRows
	if img.Width != s.width || img.Height != s.height || level != s.level || len(s.bands) != nb {
		s.width, s.height, s.level = img.Width, img.Height, level
		s.bands = make([]pngBand, nb)
	}

	var next atomic.Int32
	work := func() {
		for {
			i := int(next.Add(1)) - 1
			if i >= nb {
				return
			}
			b := &s.bands[i]
			y0, y1 := i*streamBandRows, min((i+1)*streamBandRows, img.Height)
			// img was validated, so the band cannot fail to hash.
			key, _ := Hash128(img.SubImage(image.Rect(0, max(y0-1, 0), img.Width, y1)))
			if b.valid && b.key == key {
				continue
			}
			st := &b.enc
			st.y0, st.y1, st.last = y0, y1, i == nb-1
			st.buf.Reset()
			st.err = nil
			e.encodeStripe(img, st, level)
			b.key, b.valid = key, st.err == nil
		}
	}
	if workers = min(workers, nb); workers <= 1 {
		work()
	} else {
		var wg sync.WaitGroup
		wg.Add(workers - 1)
		for w := 1; w < workers; w++ {
			go func() { defer wg.Done(); work() }()
		}
		work()
		wg.Wait()
	}
	parts := make([]pngPart, nb)
	for i := range s.bands {
		b := &s.bands[i]
		if b.enc.err != nil {
			err := b.enc.err
			s.Reset()
			return dst, fmt.Errorf("encode: png deflate: %w", err)
		}
		parts[i] = pngPart{b.enc.buf.Bytes(), b.enc.adler, b.enc.n}
	}
	return assemblePNG(dst, img.Width, img.Height, parts)
}
