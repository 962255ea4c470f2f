package encode

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/klauspost/compress/flate"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// PNG filter types (PNG spec 9.2).
const (
	ftNone  = 0
	ftSub   = 1
	ftUp    = 2
	ftPaeth = 4
)

// Paeth is considered for rows where more than 3/8 of the sampled Sub/Up
// residual bytes are non-zero (photographic or mixed content) and used when
// its own sampled cost is below paethNumerator/paethDenominator of theirs.
// On desktop and text rows Sub/Up win and Paeth's per-byte cost is wasted.
const (
	paethNumerator   = 3
	paethDenominator = 4
)

// minStripeRows keeps stripes large enough that the per-stripe compressor
// reset and sync-flush marker stay negligible.
const minStripeRows = 32

// PNGEncoder writes 8-bit RGB PNGs straight from BGRX frames. Rows are split
// into stripes that are filtered and deflated in parallel; each stripe but
// the last ends with a sync flush so the stripes' deflate streams
// concatenate into one valid zlib stream, whose Adler-32 is combined from
// the stripes'. The zero value is ready to use and safe for concurrent use.
type PNGEncoder struct {
	// Level is the flate level, 1 (fastest, default) to 9.
	Level int
	// Concurrency caps the number of goroutines; 0 means GOMAXPROCS.
	Concurrency int

	pools [10]sync.Pool // *flate.Writer per level
}

var defaultPNG PNGEncoder

// EncodePNG appends the PNG encoding of img to dst using the default
// encoder (flate level 1, GOMAXPROCS workers).
func EncodePNG(dst []byte, img Image) ([]byte, error) { return defaultPNG.Encode(dst, img) }

type pngStripe struct {
	y0, y1 int
	last   bool // ends the zlib stream (Close instead of a sync flush)
	buf    bytes.Buffer
	adler  uint32
	n      int // uncompressed bytes (filter bytes + RGB)
	err    error
}

var stripePool = sync.Pool{New: func() any { return new(pngStripe) }}

// rowBufs holds the per-worker filter scratch rows.
type rowBufs struct{ sub, up, paeth []byte }

var rowBufPool = sync.Pool{New: func() any { return new(rowBufs) }}

// params validates img and the encoder settings.
func (e *PNGEncoder) params(img Image) (level, workers int, err error) {
	if err := img.Validate(); err != nil {
		return 0, 0, err
	}
	if img.Width > 1<<24 || img.Height > 1<<24 {
		return 0, 0, fmt.Errorf("%w: image %dx%d too large for PNG", errdefs.ErrInvalidArgument, img.Width, img.Height)
	}
	level = e.Level
	if level == 0 {
		level = flate.BestSpeed
	}
	if level < 1 || level > 9 {
		return 0, 0, fmt.Errorf("%w: flate level %d not in 1..9", errdefs.ErrInvalidArgument, level)
	}
	workers = e.Concurrency
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	return level, workers, nil
}

// Encode appends the PNG encoding of img to dst.
func (e *PNGEncoder) Encode(dst []byte, img Image) ([]byte, error) {
	level, workers, err := e.params(img)
	if err != nil {
		return dst, err
	}
	// Twice as many stripes as workers balances uneven content (a text
	// window over an empty desktop) without shrinking stripes too far.
	nStripes := min(workers*2, img.Height/minStripeRows)
	nStripes = max(nStripes, 1)
	stripes := make([]*pngStripe, nStripes)
	for i := range stripes {
		stripes[i] = newStripe(img.Height*i/nStripes, img.Height*(i+1)/nStripes, i == nStripes-1)
	}
	defer releaseStripes(stripes)
	if err := e.run(img, stripes, level, workers); err != nil {
		return dst, err
	}
	parts := make([]pngPart, nStripes)
	for i, s := range stripes {
		parts[i] = pngPart{s.buf.Bytes(), s.adler, s.n}
	}
	return assemblePNG(dst, img.Width, img.Height, parts)
}

func newStripe(y0, y1 int, last bool) *pngStripe {
	s := stripePool.Get().(*pngStripe)
	s.y0, s.y1, s.last = y0, y1, last
	s.buf.Reset()
	s.err = nil
	return s
}

func releaseStripes(stripes []*pngStripe) {
	for _, s := range stripes {
		if s.buf.Cap() <= 8<<20 {
			stripePool.Put(s)
		}
	}
}

// run filters and deflates the stripes on up to workers goroutines.
func (e *PNGEncoder) run(img Image, stripes []*pngStripe, level, workers int) error {
	workers = min(workers, len(stripes))
	if workers <= 1 {
		for _, s := range stripes {
			e.encodeStripe(img, s, level)
		}
	} else {
		var next atomic.Int32
		var wg sync.WaitGroup
		work := func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(stripes) {
					return
				}
				e.encodeStripe(img, stripes[i], level)
			}
		}
		wg.Add(workers)
		for w := 1; w < workers; w++ {
			go work()
		}
		work()
		wg.Wait()
	}
	for _, s := range stripes {
		if s.err != nil {
			return fmt.Errorf("encode: png deflate: %w", s.err)
		}
	}
	return nil
}

// pngPart is one stripe's deflate output with the Adler-32 and length of
// its uncompressed (filtered) bytes.
type pngPart struct {
	data  []byte
	adler uint32
	n     int
}

// assemblePNG appends signature, IHDR, one IDAT holding the zlib stream
// made of the parts, and IEND.
func assemblePNG(dst []byte, w, h int, parts []pngPart) ([]byte, error) {
	idatLen := 2 + 4 // zlib header + adler32
	adler := uint32(1)
	for _, p := range parts {
		idatLen += len(p.data)
		adler = adler32Combine(adler, p.adler, p.n)
	}
	if idatLen > 1<<31-1 {
		return dst, fmt.Errorf("%w: compressed image exceeds the PNG chunk limit", errdefs.ErrInvalidArgument)
	}

	total := 8 + (12 + 13) + (12 + idatLen) + 12
	if cap(dst)-len(dst) < total {
		nd := make([]byte, len(dst), len(dst)+total)
		copy(nd, dst)
		dst = nd
	}
	dst = append(dst, "\x89PNG\r\n\x1a\n"...)

	var ihdr [13]byte
	binary.BigEndian.PutUint32(ihdr[0:], uint32(w))
	binary.BigEndian.PutUint32(ihdr[4:], uint32(h))
	ihdr[8] = 8  // bit depth
	ihdr[9] = 2  // colour type RGB
	ihdr[10] = 0 // deflate
	ihdr[11] = 0 // adaptive filtering
	ihdr[12] = 0 // no interlace
	dst = appendChunk(dst, "IHDR", ihdr[:])

	dst = binary.BigEndian.AppendUint32(dst, uint32(idatLen))
	start := len(dst)
	dst = append(dst, "IDAT"...)
	// zlib header: CM=8 (deflate), CINFO=7 (32K window), FLEVEL=0 (fastest),
	// FCHECK so that the 16-bit value is a multiple of 31.
	dst = append(dst, 0x78, 0x01)
	for _, p := range parts {
		dst = append(dst, p.data...)
	}
	dst = binary.BigEndian.AppendUint32(dst, adler)
	dst = binary.BigEndian.AppendUint32(dst, crc32.ChecksumIEEE(dst[start:]))

	dst = appendChunk(dst, "IEND", nil)
	return dst, nil
}

func appendChunk(dst []byte, typ string, data []byte) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(data)))
	start := len(dst)
	dst = append(dst, typ...)
	dst = append(dst, data...)
	return binary.BigEndian.AppendUint32(dst, crc32.ChecksumIEEE(dst[start:]))
}

func (e *PNGEncoder) encodeStripe(img Image, s *pngStripe, level int) {
	var zw *flate.Writer
	if v := e.pools[level].Get(); v != nil {
		zw = v.(*flate.Writer)
		zw.Reset(&s.buf)
	} else {
		var err error
		if zw, err = flate.NewWriter(&s.buf, level); err != nil {
			s.err = err
			return
		}
	}
	defer e.pools[level].Put(zw)

	rb := rowBufPool.Get().(*rowBufs)
	defer rowBufPool.Put(rb)
	n := 1 + img.Width*3
	rb.sub = grow(rb.sub, n+1)
	rb.up = grow(rb.up, n)

	adler := uint32(1)
	for y := s.y0; y < s.y1; y++ {
		row := filterRow(img, y, rb)
		if row == nil {
			// An unchanged row filters to Up with all-zero residuals: skip
			// the filter and checksum passes entirely.
			row = rb.up[:n]
			clear(row[1:])
			row[0] = ftUp
			adler = adler32Zeros(adler32Update(adler, row[:1]), n-1)
		} else {
			adler = adler32Update(adler, row)
		}
		if _, err := zw.Write(row); err != nil {
			s.err = err
			return
		}
	}
	var err error
	if s.last {
		err = zw.Close()
	} else {
		err = zw.Flush()
	}
	s.err = err
	s.adler = adler
	s.n = (s.y1 - s.y0) * n
}

// filterRow returns the filtered row (filter byte first) for image row y,
// or nil when the row equals the one above (Up filter, all zero).
func filterRow(img Image, y int, rb *rowBufs) []byte {
	w := img.Width
	cur := img.Row(y)
	if y == 0 {
		filterSub(rb.sub[1:], cur, w)
		rb.sub[0] = ftSub
		return rb.sub[:1+3*w]
	}
	prev := img.Row(y - 1)
	if bytes.Equal(cur, prev) {
		return nil
	}
	subCost, upCost, samples := sampleCosts(cur, prev, w)
	ft, cost := byte(ftSub), subCost
	if upCost < subCost {
		ft, cost = ftUp, upCost
	}
	if 8*cost > 3*samples {
		// Mostly non-zero residuals: photographic content, where Paeth may
		// leave smaller residuals. Check it on a sample before paying for
		// its per-byte predictor (costs compared as fractions).
		if pc, ps := samplePaeth(cur, prev, w); pc*samples*paethDenominator < cost*ps*paethNumerator {
			ft = ftPaeth
		}
	}
	var best []byte
	switch ft {
	case ftSub:
		best = rb.sub
		filterSub(best[1:], cur, w)
	case ftUp:
		best = rb.sub
		filterUp(best[1:], cur, prev, w)
	default:
		rb.paeth = grow(rb.paeth, 1+3*w)
		best = rb.paeth
		filterPaeth(best[1:], cur, prev, w)
	}
	best[0] = ft
	return best[:1+3*w]
}

// filterSub writes the Sub residuals of cur; out needs one byte of slack
// past 3*w (see filterSubUp).
func filterSub(out, cur []byte, w int) {
	_ = out[3*w] // bounds proven once for the unchecked loop below
	_ = cur[4*w-1]
	po, pc := unsafe.Pointer(&out[0]), unsafe.Pointer(&cur[0])
	var left uint32
	for x := 0; x < w; x++ {
		c := load32(pc, 4*x)
		store32(po, 3*x, toRGB(subBytes(c, left)))
		left = c
	}
}

// SWAR helpers: a BGRX pixel loaded little-endian is B | G<<8 | R<<16 | X<<24.
const (
	swarHi  = 0x80808080
	swarLo7 = 0x7f7f7f7f
	rgbMask = 0x00808080 // high bits of the B, G and R lanes
)

// subBytes is the lane-wise a-b mod 256 of four bytes at once.
func subBytes(a, b uint32) uint32 { return ((a | swarHi) - (b &^ swarHi)) ^ ((a ^ ^b) & swarHi) }

// nonZeroRGB counts the non-zero B, G, R lanes of d.
func nonZeroRGB(d uint32) int { return bits.OnesCount32((((d & swarLo7) + swarLo7) | d) & rgbMask) }

// toRGB reorders the B, G, R lanes of d into R, G, B in the low three bytes.
func toRGB(d uint32) uint32 { return bits.ReverseBytes32(d) >> 8 }

// sampleStep is the pixel step of the filter-choice sample: estimating the
// costs on a third of the pixels and filtering the row once is much cheaper
// than filtering it every way.
const (
	sampleStep      = 3
	paethSampleStep = 16
)

// sampleCosts estimates the Sub, Up and (when withPaeth) Paeth costs of a
// row as the count of non-zero residual bytes on sampled pixels. That count
// tracks what deflate pays on desktop and text content and is far cheaper
// than the classic sum of absolute values.
func sampleCosts(cur, prev []byte, w int) (sub, up, samples int) {
	_ = cur[4*w-1]
	_ = prev[4*w-1]
	pc, pp := unsafe.Pointer(&cur[0]), unsafe.Pointer(&prev[0])
	for x := 1; x < w; x += sampleStep {
		c := load32(pc, 4*x)
		sub += nonZeroRGB(subBytes(c, load32(pc, 4*x-4)))
		up += nonZeroRGB(subBytes(c, load32(pp, 4*x)))
		samples += 3
	}
	return sub, up, samples
}

// samplePaeth estimates the Paeth cost like sampleCosts, on a sparser
// sample since its predictor is several times dearer.
func samplePaeth(cur, prev []byte, w int) (cost, samples int) {
	_ = cur[4*w-1]
	_ = prev[4*w-1]
	pc, pp := unsafe.Pointer(&cur[0]), unsafe.Pointer(&prev[0])
	for x := 1; x < w; x += paethSampleStep {
		c, l := load32(pc, 4*x), load32(pc, 4*x-4)
		p, ul := load32(pp, 4*x), load32(pp, 4*x-4)
		pred := uint32(paeth(byte(l), byte(p), byte(ul))) |
			uint32(paeth(byte(l>>8), byte(p>>8), byte(ul>>8)))<<8 |
			uint32(paeth(byte(l>>16), byte(p>>16), byte(ul>>16)))<<16
		cost += nonZeroRGB(subBytes(c, pred))
		samples += 3
	}
	return cost, samples
}

// filterUp writes the Up residuals of cur; out needs one byte of slack past
// 3*w (see filterSub).
func filterUp(out, cur, prev []byte, w int) {
	_ = out[3*w]
	_ = cur[4*w-1]
	_ = prev[4*w-1]
	po, pc, pp := unsafe.Pointer(&out[0]), unsafe.Pointer(&cur[0]), unsafe.Pointer(&prev[0])
	for x := 0; x < w; x++ {
		store32(po, 3*x, toRGB(subBytes(load32(pc, 4*x), load32(pp, 4*x))))
	}
}

func paeth(a, b, c byte) byte {
	// Branch-light form of the PNG Paeth predictor.
	pc := int32(c)
	pa := int32(b) - pc
	pb := int32(a) - pc
	pcv := pa + pb
	pa = (pa ^ (pa >> 31)) - (pa >> 31)
	pb = (pb ^ (pb >> 31)) - (pb >> 31)
	pcv = (pcv ^ (pcv >> 31)) - (pcv >> 31)
	if pa <= pb && pa <= pcv {
		return a
	}
	if pb <= pcv {
		return b
	}
	return c
}

func filterPaeth(out, cur, prev []byte, w int) {
	out = out[:3*w]
	cur = cur[:4*w]
	prev = prev[:4*w]
	var lr, lg, lb, ulr, ulg, ulb byte
	for x := 0; x < w; x++ {
		s := cur[4*x : 4*x+4 : 4*x+4]
		p := prev[4*x : 4*x+4 : 4*x+4]
		o := out[3*x : 3*x+3 : 3*x+3]
		r, g, b := s[2], s[1], s[0]
		ur, ug, ub := p[2], p[1], p[0]
		vr := r - paeth(lr, ur, ulr)
		vg := g - paeth(lg, ug, ulg)
		vb := b - paeth(lb, ub, ulb)
		o[0], o[1], o[2] = vr, vg, vb
		lr, lg, lb = r, g, b
		ulr, ulg, ulb = ur, ug, ub
	}
}
