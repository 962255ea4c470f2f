package stats

import (
	"math"
	"testing"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestQuantileLinear(t *testing.T) {
	s := []float64{1, 2, 3, 4}
	cases := map[float64]float64{0: 1, 0.5: 2.5, 0.9: 3.7, 1: 4, 0.25: 1.75}
	for q, want := range cases {
		if got := Quantile(s, q); !near(got, want) {
			t.Errorf("Quantile(%v) = %v, want %v", q, got, want)
		}
	}
	if got := Quantile([]float64{7}, 0.9); got != 7 {
		t.Errorf("single sample: %v", got)
	}
}

func TestSummarizeP99Threshold(t *testing.T) {
	s := make([]float64, 99)
	for i := range s {
		s[i] = float64(99 - i) // unsorted on purpose
	}
	sum, err := Summarize(s)
	if err != nil {
		t.Fatal(err)
	}
	if sum.P99 != nil {
		t.Fatalf("p99 reported for n=99")
	}
	if s[0] != 99 {
		t.Fatalf("Summarize modified its input")
	}
	if !near(sum.P50, 50) || sum.Min != 1 || sum.Max != 99 || !near(sum.Mean, 50) {
		t.Fatalf("bad summary %+v", sum)
	}
	s = append(s, 100)
	sum, err = Summarize(s)
	if err != nil {
		t.Fatal(err)
	}
	if sum.P99 == nil || !near(*sum.P99, 99.01) {
		t.Fatalf("p99 = %v, want 99.01", sum.P99)
	}
	if !near(sum.P90, 90.1) {
		t.Fatalf("p90 = %v", sum.P90)
	}
}

func TestSummarizeRejects(t *testing.T) {
	if _, err := Summarize(nil); err != ErrNoSamples {
		t.Fatalf("empty: %v", err)
	}
	if _, err := Summarize([]float64{1, math.NaN()}); err == nil {
		t.Fatal("NaN accepted")
	}
}
