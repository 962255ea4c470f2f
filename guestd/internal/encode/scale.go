package encode

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// ScaledSize is the size of a w x h frame whose long edge is limited to
// maxLongEdge, keeping the aspect ratio (each side at least 1). A
// maxLongEdge <= 0 or one not below the long edge leaves the size alone.
func ScaledSize(w, h, maxLongEdge int) (int, int) {
	long := max(w, h)
	if maxLongEdge <= 0 || long <= maxLongEdge {
		return w, h
	}
	sw := max(1, (w*maxLongEdge+long/2)/long)
	sh := max(1, (h*maxLongEdge+long/2)/long)
	return sw, sh
}

// Downscale shrinks src so its long edge is at most maxLongEdge with an
// area (box) filter: every destination pixel is the exact area-weighted
// mean of the source pixels it covers, which keeps thin text strokes as
// grey instead of dropping them. The result reuses dst when it is large
// enough. When src already fits, src itself is returned (no copy). Rows are
// processed in parallel.
func Downscale(dst []byte, src Image, maxLongEdge int) (Image, error) {
	if err := src.Validate(); err != nil {
		return Image{}, err
	}
	if maxLongEdge < 0 {
		return Image{}, fmt.Errorf("%w: max long edge %d", errdefs.ErrInvalidArgument, maxLongEdge)
	}
	dw, dh := ScaledSize(src.Width, src.Height, maxLongEdge)
	if dw == src.Width && dh == src.Height {
		return src, nil
	}
	out := Image{Pix: grow(dst, dw*dh*4), Stride: dw * 4, Width: dw, Height: dh}
	xt := areaTaps(src.Width, dw, hBits)
	yt := areaTaps(src.Height, dh, vBits)

	workers := min(runtime.GOMAXPROCS(0), dh)
	var wg sync.WaitGroup
	wg.Add(workers)
	for i := 0; i < workers; i++ {
		y0, y1 := dh*i/workers, dh*(i+1)/workers
		go func() {
			defer wg.Done()
			acc := make([]uint64, src.Width)
			for y := y0; y < y1; y++ {
				scaleRow(out.Row(y), acc, src, xt, yt.taps[yt.start[y]:yt.start[y+1]])
			}
		}()
	}
	wg.Wait()
	return out, nil
}

// The filter keeps B, G and R of a pixel in three 21-bit lanes of one
// uint64, so each tap costs one multiply-add per pixel. Vertical weights
// have vBits of precision (255<<vBits fits a lane); the vertical sums are
// then narrowed to midBits fractional bits and the horizontal pass uses
// hBits weights, which again fits a lane. Weights of each destination sum
// to exactly one, so flat areas stay exact.
const (
	laneBits = 21
	vBits    = 12
	midBits  = 4
	hBits    = 8
	laneMask = 1<<(vBits) - 1 // narrowed lane: 255<<midBits < 1<<vBits
	lanes3   = laneMask | laneMask<<laneBits | laneMask<<(2*laneBits)
	outShift = midBits + hBits
)

func spread(v uint32) uint64 {
	return uint64(v&0xff) | uint64(v>>8&0xff)<<laneBits | uint64(v>>16&0xff)<<(2*laneBits)
}

func perLane(v uint64) uint64 { return v | v<<laneBits | v<<(2*laneBits) }

type tap struct {
	src    int32
	weight uint32
}

// tapTable lists, per destination index i, taps[start[i]:start[i+1]].
type tapTable struct {
	start []int32
	taps  []tap
}

// areaTaps computes the area-filter taps mapping n source samples onto m
// (m < n) with weights of the given precision. Destination i covers
// source interval [i*n/m, (i+1)*n/m); each source sample gets its overlap
// length as weight, normalized so every destination's weights sum to
// exactly 1<<bits.
func areaTaps(n, m int, bits uint) tapTable {
	t := tapTable{start: make([]int32, m+1), taps: make([]tap, 0, m*(n/m+2))}
	for i := 0; i < m; i++ {
		// Work in units of 1/m source samples: the interval is [i*n, (i+1)*n).
		lo, hi := i*n, (i+1)*n
		first := len(t.taps)
		var sum uint32
		for s := lo / m; s*m < hi; s++ {
			a, b := max(lo, s*m), min(hi, (s+1)*m)
			wgt := uint32((uint64(b-a) << bits) / uint64(n))
			t.taps = append(t.taps, tap{src: int32(s), weight: wgt})
			sum += wgt
		}
		// Give the rounding remainder to the largest tap.
		big := first
		for k := first; k < len(t.taps); k++ {
			if t.taps[k].weight > t.taps[big].weight {
				big = k
			}
		}
		t.taps[big].weight += 1<<bits - sum
		t.start[i+1] = int32(len(t.taps))
	}
	return t
}

func scaleRow(dst []byte, acc []uint64, src Image, xt tapTable, ytaps []tap) {
	w := src.Width
	acc = acc[:w]
	clear(acc)
	for _, yt := range ytaps {
		row := src.Row(int(yt.src))
		_ = row[4*w-1]
		p := unsafe.Pointer(&row[0])
		wt := uint64(yt.weight)
		for x := range acc {
			acc[x] += spread(load32(p, 4*x)) * wt
		}
	}
	const narrowRound = 1 << (vBits - midBits - 1)
	for x, v := range acc {
		acc[x] = ((v + perLane(narrowRound)) >> (vBits - midBits)) & lanes3
	}
	const round = 1 << (outShift - 1)
	for x := 0; x+1 < len(xt.start); x++ {
		var sum uint64
		for _, t := range xt.taps[xt.start[x]:xt.start[x+1]] {
			sum += acc[t.src] * uint64(t.weight)
		}
		sum += perLane(round)
		o := dst[4*x : 4*x+4 : 4*x+4]
		o[0] = byte(sum >> outShift)
		o[1] = byte(sum >> (laneBits + outShift))
		o[2] = byte(sum >> (2*laneBits + outShift))
		o[3] = 0xff
	}
}
