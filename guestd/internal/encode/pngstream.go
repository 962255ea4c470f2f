package encode

import "image"

// streamBandRows is the height of the row bands PNGStream caches: small
// enough that a typical agent step (a typed word, a hovered button)
// invalidates one or two of the 13 bands of a 1280x800 frame, large enough
// that restarting the deflate dictionary per band costs little.
const streamBandRows = 64

// PNGStream encodes successive frames of one screen, reusing the deflate
// output of row bands whose pixels (and the row above them, which the
// filters read) did not change since the previous frame; unchanged bands
// are recognised by their 128-bit XXH3 hash. Its output is byte-identical
// to that of a fresh PNGStream. A PNGStream is not safe for concurrent use;
// use one per frame source.
type PNGStream struct {
	// Encoder supplies level and concurrency; nil means the defaults.
	Encoder *PNGEncoder

	width, height, level int
	bands                []pngBand
}

type pngBand struct {
	valid bool
	key   [16]byte
	data  []byte
	adler uint32
	n     int
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

	var dirty []*pngStripe
	var dirtyIdx []int
	for i := range s.bands {
		y0, y1 := i*streamBandRows, min((i+1)*streamBandRows, img.Height)
		key, err := Hash128(img.SubImage(image.Rect(0, max(y0-1, 0), img.Width, y1)))
		if err != nil {
			return dst, err
		}
		b := &s.bands[i]
		if b.valid && b.key == key {
			continue
		}
		b.valid, b.key = false, key
		dirty = append(dirty, newStripe(y0, y1, i == nb-1))
		dirtyIdx = append(dirtyIdx, i)
	}
	defer releaseStripes(dirty)
	if err := e.run(img, dirty, level, workers); err != nil {
		return dst, err
	}
	for k, st := range dirty {
		b := &s.bands[dirtyIdx[k]]
		b.data = append(b.data[:0], st.buf.Bytes()...)
		b.adler, b.n, b.valid = st.adler, st.n, true
	}
	parts := make([]pngPart, nb)
	for i, b := range s.bands {
		parts[i] = pngPart{b.data, b.adler, b.n}
	}
	return assemblePNG(dst, img.Width, img.Height, parts)
}
