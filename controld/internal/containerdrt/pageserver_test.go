//go:build linux

package containerdrt

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/forkfleet/forkfleet/controld/internal/lazypages"
)

// The page server's hot set reads and writes are counted by result, every
// series present from the start, and the runtime collects them; the names
// pass Prometheus' lint.
func TestHotSetMetrics(t *testing.T) {
	m := newHotSetMetrics()
	r := &Runtime{hotMetrics: m}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(r)
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 12 {
		t.Fatalf("%d series before any read (%v), want 10 reads and 2 writes at 0", n, err)
	}

	m.read(0, nil)  // no file
	m.read(42, nil) // a set loaded
	m.read(7, nil)
	m.read(0, &lazypages.HotSetError{Path: "p", Reason: lazypages.HotSetChecksum})
	m.read(0, fmt.Errorf("wrapped: %w", &lazypages.HotSetError{Path: "p", Reason: lazypages.HotSetTruncated}))
	m.read(0, errors.New("not a HotSetError"))
	m.wrote(nil)
	m.wrote(nil)
	m.wrote(errors.New("disk full"))
	for result, want := range map[string]float64{"absent": 1, "loaded": 2, "checksum": 1, "truncated": 1, "unknown": 1, "stray_pages": 0} {
		if got := testutil.ToFloat64(m.reads.WithLabelValues(result)); got != want {
			t.Errorf("reads{result=%q} = %v, want %v", result, got, want)
		}
	}
	for result, want := range map[string]float64{"written": 2, "failed": 1} {
		if got := testutil.ToFloat64(m.writes.WithLabelValues(result)); got != want {
			t.Errorf("writes{result=%q} = %v, want %v", result, got, want)
		}
	}
	want := `
# HELP forkfleet_controld_lazy_hot_set_writes_total Writes of a checkpoint's persisted lazy restore working set (hot set), by result: written, failed (kept in memory, written again at its next change).
# TYPE forkfleet_controld_lazy_hot_set_writes_total counter
forkfleet_controld_lazy_hot_set_writes_total{result="failed"} 1
forkfleet_controld_lazy_hot_set_writes_total{result="written"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "forkfleet_controld_lazy_hot_set_writes_total"); err != nil {
		t.Error(err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}

	// A runtime without them (another page server's tests) collects
	// nothing, and nil metrics count nothing.
	var none *hotSetMetrics
	none.read(1, nil)
	none.wrote(nil)
	if n := testutil.CollectAndCount(&Runtime{}); n != 0 {
		t.Errorf("a runtime without hot set metrics collected %d series", n)
	}
}
