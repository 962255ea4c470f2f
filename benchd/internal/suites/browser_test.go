//go:build linux

package suites

import (
	"testing"

	"github.com/forkfleet/forkfleet/benchd/internal/result"
)

// The browser suite's ratios compare its own rows with podman's of the same
// shape, never the bare desktop's.
func TestBrowserRatios(t *testing.T) {
	row := func(metric string, baseline bool, p50 float64, kv ...string) result.Row {
		r := result.Single(metric, "ms", labels(kv...), p50)
		r.Baseline = baseline
		return r
	}
	rows := []result.Row{
		row("checkpoint.client_total", false, 800, "shape", browserShape),
		row("checkpoint.client_total", false, 90, "shape", "bare-desktop"),
		row("peer.podman_checkpoint_leave_running", true, 2400, "shape", browserShape, "compress", "none"),
		row("peer.podman_checkpoint_leave_running", true, 250, "shape", "bare-desktop", "compress", "none"),
		row("fork.fanout.wall", false, 700, "tier", "memory", "n", "1", "shape", browserShape),
		row("peer.podman_restore.wall", true, 3500, "n", "1", "shape", browserShape),
	}
	got := map[string]float64{}
	for _, r := range browserRatios(rows) {
		if r.Labels["shape"] != browserShape {
			t.Errorf("ratio %s without the browser shape: %v", r.Metric, r.Labels)
		}
		got[r.Metric] = *r.P50
	}
	if got["checkpoint.speedup_vs_podman"] != 3 || got["fork.speedup_vs_podman"] != 5 {
		t.Fatalf("ratios %v, want checkpoint 3x and fork 5x", got)
	}
}

// The fork suite's ratios take its bare rows against podman's bare-desktop
// restore; the reference shape's rows (no peer of that shape) get none.
func TestForkRatiosSameShape(t *testing.T) {
	row := func(metric string, baseline bool, p50 float64, kv ...string) result.Row {
		r := result.Single(metric, "ms", labels(kv...), p50)
		r.Baseline = baseline
		return r
	}
	rows := []result.Row{
		row("fork.fanout.wall", false, 100, "tier", "memory", "n", "1"),
		row("fork.fanout.wall", false, 900, "tier", "memory", "n", "1", "shape", "ram-300MB+disk-100MB"),
		row("peer.podman_restore.wall", true, 400, "n", "1", "shape", "bare-desktop"),
	}
	got := forkRatios(rows)
	if len(got) != 1 || *got[0].P50 != 4 {
		t.Fatalf("ratios %+v, want one of 4x", got)
	}
}
