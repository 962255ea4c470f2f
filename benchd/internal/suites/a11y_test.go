//go:build linux

package suites

import (
	"testing"

	"github.com/forkfleet/forkfleet/benchd/internal/result"
)

// The a11y suite's ratio divides pyatspi's dump by the full desktop tree,
// never by another root's.
func TestA11yRatios(t *testing.T) {
	peer := result.Single("peer.pyatspi_tree", "ms", labels("root", "desktop", "peer", "pyatspi"), 2600)
	peer.Baseline = true
	rows := []result.Row{
		result.Single("a11y.tree", "ms", labels("root", "focused_window"), 100),
		result.Single("a11y.tree", "ms", labels("root", "desktop"), 650),
		peer,
	}
	got := a11yRatios(rows)
	if len(got) != 1 || got[0].Metric != "a11y.speedup_vs_pyatspi" || *got[0].P50 != 4 {
		t.Fatalf("ratios %+v", got)
	}
	if a11yRatios(rows[:2]) != nil {
		t.Error("a ratio without the peer")
	}
}
