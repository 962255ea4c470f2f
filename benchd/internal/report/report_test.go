package report

import (
	"encoding/xml"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/benchd/internal/result"
)

func mk(suite string, at time.Time, rows ...result.Row) *result.Result {
	return &result.Result{Schema: result.SchemaID, Suite: suite, Status: result.StatusOK, StartedAt: at, FinishedAt: at.Add(time.Second),
		Host: result.Host{Cores: 2, CPUModel: "cpu", HostEnv: map[string]string{}}, Build: result.Build{Commit: "none"},
		Config: map[string]any{"n": 10}, Rows: rows}
}

func row(metric, unit string, labels map[string]string, vals ...float64) result.Row {
	s := result.NewSeries(metric, unit, labels)
	for _, v := range vals {
		s.Add(v)
	}
	return s.Row()
}

func write(t *testing.T, root string, r *result.Result) {
	t.Helper()
	loc, err := result.Reserve(root, r.Suite, r.StartedAt)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := result.Write(loc, r); err != nil {
		t.Fatal(err)
	}
}

func TestRenderLatestWithCharts(t *testing.T) {
	root := t.TempDir()
	t0 := time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)
	write(t, root, mk("action", t0, row("action.ping", "ms", nil, 9)))
	peer := row("action.move", "ms", map[string]string{"via": "xdotool"}, 5, 6, 7)
	peer.Baseline = true
	write(t, root, mk("action", t0.Add(time.Hour), row("action.ping", "ms", nil, 0.1, 0.2, 0.3), peer))
	write(t, root, mk("boot", t0,
		row("boot.milestone", "ms", map[string]string{"milestone": "task started"}, 40, 50),
		row("boot.milestone", "ms", map[string]string{"milestone": "guestd ready"}, 90, 120)))
	var codec []result.Row
	for _, e := range []string{"native", "1024", "512"} {
		codec = append(codec, row("codec.bytes", "bytes", map[string]string{"content": "dense", "codec": "png", "edge": e}, 1000))
		codec = append(codec, row("codec.bytes", "bytes", map[string]string{"content": "dense", "codec": "jpeg-q80", "edge": e}, 500))
	}
	write(t, root, mk("codec", t0, codec...))
	write(t, root, mk("step", t0,
		row("step.latency", "ms", map[string]string{"rtt_ms": "0", "series": "seq k=3"}, 5),
		row("step.latency", "ms", map[string]string{"rtt_ms": "50", "series": "seq k=3"}, 205)))
	skipped := mk("fork", t0)
	skipped.Status, skipped.Reason = result.StatusSkipped, "controld socket absent"
	write(t, root, skipped)
	os.WriteFile(filepath.Join(root, "junk.json"), []byte("{}"), 0o644)

	got, bad, err := Latest(root, []string{"action", "boot", "codec", "step", "fork"})
	if err != nil {
		t.Fatal(err)
	}
	if len(bad) != 1 {
		t.Fatalf("invalid file not reported: %v", bad)
	}
	if len(got) != 5 || got[0].Suite != "action" || len(got[0].Rows) != 2 {
		t.Fatalf("latest: %+v", got)
	}
	out := filepath.Join(t.TempDir(), "docs", "benchmarks.md")
	os.MkdirAll(filepath.Dir(out), 0o755)
	if err := Render(got, out); err != nil {
		t.Fatal(err)
	}
	md, _ := os.ReadFile(out)
	for _, want := range []string{"## action", "action.move *(peer)*", "controld socket absent", "benchmarks-charts/boot-1.svg", "| p50 |"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("markdown lacks %q", want)
		}
	}
	svgs, _ := filepath.Glob(filepath.Join(filepath.Dir(out), "benchmarks-charts", "*.svg"))
	if len(svgs) < 5 {
		t.Fatalf("charts: %v", svgs)
	}
	for _, p := range svgs {
		data, _ := os.ReadFile(p)
		if err := xml.Unmarshal(data, new(struct{})); err != nil {
			t.Errorf("%s is not well-formed XML: %v", p, err)
		}
		if !strings.HasPrefix(string(data), "<svg") {
			t.Errorf("%s does not start with <svg", p)
		}
	}
	boot, _ := os.ReadFile(filepath.Join(filepath.Dir(out), "benchmarks-charts", "boot-1.svg"))
	if !strings.Contains(string(boot), "guestd ready") {
		t.Error("waterfall lacks milestone")
	}
}

func TestSortedKeys(t *testing.T) {
	got := sortedKeys(map[string]bool{"512": true, "native": true, "1024": true, "768": true})
	if strings.Join(got, ",") != "native,1024,768,512" {
		t.Fatalf("%v", got)
	}
}
