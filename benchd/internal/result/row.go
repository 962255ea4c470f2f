package result

import "github.com/forkfleet/forkfleet/benchd/internal/stats"

// Series collects one metric's samples during a run. Failed and unverified
// samples and discarded warm-ups are counted apart and never enter the
// distribution.
type Series struct {
	Metric   string
	Unit     string
	Labels   map[string]string
	Baseline bool
	Better   string
	// DropSamples leaves raw samples out of the row (high-volume series).
	DropSamples bool

	ok         []float64
	failed     int
	unverified int
	warmup     int
}

// NewSeries starts a series. labels may be nil.
func NewSeries(metric, unit string, labels map[string]string) *Series {
	l := map[string]string{}
	for k, v := range labels {
		l[k] = v
	}
	return &Series{Metric: metric, Unit: unit, Labels: l}
}

// Add records a successful, verified sample.
func (s *Series) Add(v float64) { s.ok = append(s.ok, v) }

// Fail counts a sample whose operation failed.
func (s *Series) Fail() { s.failed++ }

// Unverified counts a sample whose result could not be verified.
func (s *Series) Unverified() { s.unverified++ }

// Warmup counts a discarded warm-up sample.
func (s *Series) Warmup() { s.warmup++ }

// Len is the number of successful samples so far.
func (s *Series) Len() int { return len(s.ok) }

// Values returns the successful samples (not a copy).
func (s *Series) Values() []float64 { return s.ok }

// Row summarizes the series.
func (s *Series) Row() Row {
	r := Row{
		Metric: s.Metric, Unit: s.Unit, Labels: s.Labels, Baseline: s.Baseline, Better: s.Better,
		Failed: s.failed, Unverified: s.unverified, Warmup: s.warmup,
	}
	if r.Labels == nil {
		r.Labels = map[string]string{}
	}
	sum, err := stats.Summarize(s.ok)
	if err != nil {
		return r
	}
	r.N = sum.N
	r.P50, r.P90, r.P99 = f(sum.P50), f(sum.P90), sum.P99
	r.Min, r.Max, r.Mean = f(sum.Min), f(sum.Max), f(sum.Mean)
	if !s.DropSamples {
		r.Samples = append([]float64(nil), s.ok...)
	}
	return r
}

// Single is a row of one measured value (a wall clock of a whole fan-out,
// a ratio computed from two distributions).
func Single(metric, unit string, labels map[string]string, v float64) Row {
	s := NewSeries(metric, unit, labels)
	s.Add(v)
	return s.Row()
}

func f(v float64) *float64 { return &v }
