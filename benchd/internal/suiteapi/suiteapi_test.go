package suiteapi

import (
	"context"
	"errors"
	"testing"

	"github.com/forkfleet/forkfleet/benchd/internal/result"
)

func TestMeasureKeepsFailuresApart(t *testing.T) {
	s := result.NewSeries("m", "ms", nil)
	i := 0
	warmCalls := 0
	err := Measure(context.Background(), s, 2, 6, func(warm bool) (float64, error) {
		if warm {
			warmCalls++
			return 1000, nil // would skew the distribution if kept
		}
		i++
		switch i {
		case 2:
			return 0, errors.New("op failed")
		case 3:
			return 0, ErrUnverified
		}
		return float64(i), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	r := s.Row()
	if warmCalls != 2 || r.Warmup != 2 || r.N != 4 || r.Failed != 1 || r.Unverified != 1 || *r.Max != 6 {
		t.Fatalf("%+v", r)
	}
}

func TestSkip(t *testing.T) {
	reason, ok := IsSkip(Skipf("no %s", "controld"))
	if !ok || reason != "no controld" {
		t.Fatal(reason)
	}
	if _, ok := IsSkip(errors.New("x")); ok {
		t.Fatal("plain error is a skip")
	}
}
