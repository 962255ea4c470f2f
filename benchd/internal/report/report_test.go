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

// Check passes on a fresh render and names what is off once the report, a
// chart or the results change.
func TestCheck(t *testing.T) {
	root := t.TempDir()
	t0 := time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)
	write(t, root, mk("action", t0, row("action.ping", "ms", nil, 0.1, 0.2), row("action.bytes", "bytes", nil, 84)))
	out := filepath.Join(t.TempDir(), "benchmarks.md")
	load := func() []Loaded {
		ls, _, err := Latest(root, nil)
		if err != nil {
			t.Fatal(err)
		}
		return ls
	}
	if err := Check(load(), out); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("nothing rendered yet: %v", err)
	}
	if err := Render(load(), out); err != nil {
		t.Fatal(err)
	}
	if err := Check(load(), out); err != nil {
		t.Fatalf("fresh render: %v", err)
	}
	// A stale chart from an earlier render is removed by Render and named
	// by Check.
	stale := filepath.Join(filepath.Dir(out), "benchmarks-charts", "old-1.svg")
	os.WriteFile(stale, []byte("<svg/>"), 0o644)
	if err := Check(load(), out); err == nil || !strings.Contains(err.Error(), "old-1.svg") {
		t.Fatalf("stale chart: %v", err)
	}
	if err := Render(load(), out); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("Render kept a stale chart: %v", err)
	}
	// A newer result makes the committed report out of date.
	write(t, root, mk("action", t0.Add(time.Hour), row("action.ping", "ms", nil, 0.3)))
	if err := Check(load(), out); err == nil || !strings.Contains(err.Error(), "benchmarks.md: differs") {
		t.Fatalf("newer result: %v", err)
	}
}

// Bars three orders of magnitude apart get a log axis with decade ticks;
// long labels are kept whole and the chart is wide enough for them.
func TestBarChartLogAxisAndLabels(t *testing.T) {
	long := "fork.fanout.wall n=8 tier=memory via=podman-restore-import-with-a-long-suffix"
	svg := BarChart("fork: p50 in ms", "ms", []Bar{
		{Label: "ours", Value: 0.25, P90: 0.3},
		{Label: long, Value: 250, P90: 300, Baseline: true},
	})
	if !strings.Contains(svg, "log scale") {
		t.Fatal("no log axis for a 1000x spread")
	}
	for _, tick := range []string{">0.1<", ">1<", ">10<", ">100<", ">1000<"} {
		if !strings.Contains(svg, tick) {
			t.Errorf("decade tick %s missing", tick)
		}
	}
	if !strings.Contains(svg, long) || strings.Contains(svg, "…") {
		t.Fatal("label truncated")
	}
	var doc struct {
		Width int `xml:"width,attr"`
		Rects []struct {
			X     float64 `xml:"x,attr"`
			Width float64 `xml:"width,attr"`
		} `xml:"rect"`
	}
	if err := xml.Unmarshal([]byte(svg), &doc); err != nil {
		t.Fatal(err)
	}
	// The small bar is readable (not a 1 px sliver) and the label column
	// holds the long label.
	bars := doc.Rects[1:]
	if bars[0].Width < 40 {
		t.Errorf("smallest bar %.1f px wide", bars[0].Width)
	}
	if bars[0].X < float64(len(long))*6 {
		t.Errorf("label column %.0f px for a %d-character label", bars[0].X, len(long))
	}
	if doc.Width < int(bars[1].X+bars[1].Width) {
		t.Errorf("chart %d px narrower than its bars", doc.Width)
	}
	// Close values keep a linear axis from 0.
	if lin := BarChart("t", "ms", []Bar{{Label: "a", Value: 10}, {Label: "b", Value: 30}}); strings.Contains(lin, "log scale") {
		t.Error("log axis for a 3x spread")
	}
}

// A failed run newer than an ok one does not hide the ok one's numbers: the
// report shows the ok run and names the failed one.
func TestLatestOKOverLaterFailure(t *testing.T) {
	root := t.TempDir()
	t0 := time.Date(2026, 11, 30, 1, 0, 0, 0, time.UTC)
	write(t, root, mk("browser", t0, row("browser.checkpoint", "ms", nil, 700)))
	failed := mk("browser", t0.Add(time.Hour))
	failed.Status, failed.Reason = result.StatusFailed, "page never loaded"
	write(t, root, failed)
	ls, _, err := Latest(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 1 || ls[0].Status != result.StatusOK || len(ls[0].Later) != 1 {
		t.Fatalf("latest: %+v", ls)
	}
	out := filepath.Join(t.TempDir(), "benchmarks.md")
	if err := Render(ls, out); err != nil {
		t.Fatal(err)
	}
	md, _ := os.ReadFile(out)
	if !strings.Contains(string(md), "a later run failed: page never loaded") || !strings.Contains(string(md), "| browser.checkpoint |") {
		t.Fatalf("report:\n%s", md)
	}
}

// An A/B's pooled variant newer than the suite's own run does not replace it
// in the report: it is one side of a comparison (often an old build). A suite
// measured only in pools still shows the newest pool.
func TestLatestOwnRunOverLaterPool(t *testing.T) {
	root := t.TempDir()
	t0 := time.Date(2026, 12, 2, 7, 0, 0, 0, time.UTC)
	write(t, root, mk("fork", t0, row("fork.fanout.wall", "ms", nil, 130)))
	ab := mk("fork", t0.Add(time.Hour), row("fork.fanout.wall", "ms", nil, 160))
	ab.Config["pooled_from"] = []string{"rounds/before/r1/fork-1.json"}
	write(t, root, ab)
	only := mk("boot", t0.Add(time.Hour), row("boot.milestone", "ms", nil, 20))
	only.Config["pooled_from"] = []string{"rounds/after/r1/boot-1.json"}
	write(t, root, only)
	ls, _, err := Latest(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]time.Time{}
	for _, l := range ls {
		got[l.Suite] = l.StartedAt
	}
	if len(ls) != 2 || !got["fork"].Equal(t0) || !got["boot"].Equal(t0.Add(time.Hour)) {
		t.Fatalf("latest: %v", got)
	}
	for _, l := range ls {
		if len(l.Later) != 0 {
			t.Fatalf("%s: the pool is named as a later run that did not finish ok: %+v", l.Suite, l.Later)
		}
	}
}
