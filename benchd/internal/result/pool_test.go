package result

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"
)

func poolRun(t *testing.T, start time.Time, load float64, boot []float64, failed int) *Result {
	t.Helper()
	b := NewSeries("boot.milestone", "ms", map[string]string{"milestone": "usable"})
	for _, v := range boot {
		b.Add(v)
	}
	for i := 0; i < failed; i++ {
		b.Fail()
	}
	wide := NewSeries("boot.wide", "ms", nil)
	wide.DropSamples = true
	wide.Add(1)
	return &Result{
		Schema: SchemaID, Suite: "boot", Status: StatusOK,
		StartedAt: start, FinishedAt: start.Add(time.Minute),
		Host:   Host{Hostname: "h", Cores: 2, HostEnv: map[string]string{}, LoadBefore: [3]float64{load}, LoadAfter: [3]float64{load + 1}},
		Config: map[string]any{"boot-n": "3"},
		Rows:   []Row{b.Row(), wide.Row()},
		Notes:  []string{"same note"},
	}
}

func TestPoolConcatenatesSamplesAndRecomputes(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	runs := []*Result{
		poolRun(t, t0, 3, []float64{10, 11, 12}, 1),
		poolRun(t, t0.Add(-time.Hour), 5, []float64{20, 21}, 0),
	}
	p, err := Pool(runs, []string{"r1/boot.json", "r2/boot.json"})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Rows) != 1 {
		t.Fatalf("rows %d, want the sampled row only", len(p.Rows))
	}
	r := p.Rows[0]
	if !slices.Equal(r.Samples, []float64{10, 11, 12, 20, 21}) || r.N != 5 || *r.P50 != 12 || r.Failed != 1 {
		t.Fatalf("pooled row %+v", r)
	}
	if !p.StartedAt.Equal(t0.Add(-time.Hour)) || !p.FinishedAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("span %v..%v", p.StartedAt, p.FinishedAt)
	}
	if p.Host.LoadBefore[0] != 3 || p.Host.LoadAfter[0] != 6 {
		t.Fatalf("loads %v %v", p.Host.LoadBefore, p.Host.LoadAfter)
	}
	if got := p.Config["pooled_from"].([]string); !slices.Equal(got, []string{"r1/boot.json", "r2/boot.json"}) {
		t.Fatalf("pooled_from %v", got)
	}
	if len(p.Notes) != 2 || !strings.Contains(p.Notes[1], "boot.wide not pooled") {
		t.Fatalf("notes %q", p.Notes)
	}
	// The pooled file is a valid result file (schema and types).
	doc, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if errs := schemaErrors(t, doc); len(errs) > 0 {
		t.Fatalf("schema: %v", errs)
	}
}

func TestPoolRefusesMixedOrFailedRuns(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	other := poolRun(t, t0, 1, []float64{1}, 0)
	other.Suite = "fork"
	if _, err := Pool([]*Result{poolRun(t, t0, 1, []float64{1}, 0), other}, []string{"a", "b"}); err == nil {
		t.Fatal("pooled two suites")
	}
	failed := poolRun(t, t0, 1, []float64{1}, 0)
	failed.Status, failed.Reason = StatusFailed, "boom"
	if _, err := Pool([]*Result{failed}, []string{"a"}); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("pooled a failed run: %v", err)
	}
	if _, err := Pool(nil, nil); err == nil {
		t.Fatal("pooled nothing")
	}
}
