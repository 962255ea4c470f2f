// Package stats summarizes latency and size samples the way every forkfleet
// report does: linear-interpolated quantiles (Hyndman-Fan type 7, the
// numpy/R default), and no p99 below 100 samples because a tail estimate from
// fewer points is noise.
package stats

import (
	"errors"
	"math"
	"sort"
)

// MinSamplesForP99 is the smallest sample count that reports a p99.
const MinSamplesForP99 = 100

// ErrNoSamples is returned when a summary is asked of an empty set.
var ErrNoSamples = errors.New("stats: no samples")

// Summary describes one distribution.
type Summary struct {
	N    int
	P50  float64
	P90  float64
	P99  *float64 // nil when N < MinSamplesForP99
	Min  float64
	Max  float64
	Mean float64
}

// Quantile returns the q-quantile (0 <= q <= 1) of sorted samples with linear
// interpolation between closest ranks. sorted must be ascending and non-empty.
func Quantile(sorted []float64, q float64) float64 {
	n := len(sorted)
	if n == 1 {
		return sorted[0]
	}
	if q <= 0 {
		return sorted[0]
	}
	if q >= 1 {
		return sorted[n-1]
	}
	h := q * float64(n-1)
	lo := math.Floor(h)
	i := int(lo)
	if i+1 >= n {
		return sorted[n-1]
	}
	return sorted[i] + (h-lo)*(sorted[i+1]-sorted[i])
}

// Summarize computes a Summary. It does not modify samples. NaN and Inf
// samples are rejected: they mean a broken measurement, never a value.
func Summarize(samples []float64) (Summary, error) {
	if len(samples) == 0 {
		return Summary{}, ErrNoSamples
	}
	s := make([]float64, len(samples))
	copy(s, samples)
	var sum float64
	for _, v := range s {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return Summary{}, errors.New("stats: NaN or Inf sample")
		}
		sum += v
	}
	sort.Float64s(s)
	out := Summary{
		N:    len(s),
		P50:  Quantile(s, 0.50),
		P90:  Quantile(s, 0.90),
		Min:  s[0],
		Max:  s[len(s)-1],
		Mean: sum / float64(len(s)),
	}
	if len(s) >= MinSamplesForP99 {
		p := Quantile(s, 0.99)
		out.P99 = &p
	}
	return out, nil
}
