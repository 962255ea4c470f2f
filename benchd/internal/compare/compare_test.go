package compare

import (
	"bytes"
	"strings"
	"testing"

	"github.com/forkfleet/forkfleet/benchd/internal/result"
)

func res(rows ...result.Row) []*result.Result {
	return []*result.Result{{Suite: "s", Rows: rows}}
}

func one(metric, unit string, v float64) result.Row {
	return result.Single(metric, unit, map[string]string{"k": "v"}, v)
}

func TestDirectionAware(t *testing.T) {
	cases := []struct {
		unit     string
		old, new float64
		want     Verdict
	}{
		{"ms", 10, 12, Regressed},        // +20% latency
		{"ms", 10, 11, Same},             // +10% within 15%
		{"ms", 10, 7, Improved},          // faster
		{"bytes", 1000, 1200, Regressed}, // bigger
		{"frames/s", 1000, 800, Regressed},
		{"frames/s", 1000, 1300, Improved},
		{"frames/s", 1000, 900, Same},
		{"percent", 2, 3, Regressed}, // CPU percent lower is better
	}
	for _, c := range cases {
		rep := Compare(res(one("m", c.unit, c.old)), res(one("m", c.unit, c.new)), 15)
		if got := rep.Lines[0].Verdict; got != c.want {
			t.Errorf("%s %v->%v: %s, want %s", c.unit, c.old, c.new, got, c.want)
		}
	}
}

func TestBetterOverride(t *testing.T) {
	o, n := one("hit", "percent", 90), one("hit", "percent", 50)
	o.Better, n.Better = result.BetterHigher, result.BetterHigher
	if v := Compare(res(o), res(n), 15).Lines[0].Verdict; v != Regressed {
		t.Fatalf("hit rate drop: %s", v)
	}
}

func TestMatchingAndFailures(t *testing.T) {
	base := one("m", "ms", 10)
	base.Baseline = true
	ours := one("m", "ms", 10)
	failed := result.NewSeries("f", "ms", nil)
	failed.Fail()
	okf := result.NewSeries("f", "ms", nil)
	okf.Add(1)
	rep := Compare(res(base, ours, okf.Row(), one("gone", "ms", 1)),
		res(ours, one("m", "ms", 30), failed.Row(), one("new", "ms", 1)), 15)
	// "m" with labels k=v appears twice in new (last wins) and the baseline
	// row is matched separately from ours.
	got := map[string]Verdict{}
	for _, l := range rep.Lines {
		got[l.Key] = l.Verdict
	}
	if got["m k=v"] != Regressed || got["m k=v [baseline]"] != Removed || got["f"] != NewFailure ||
		got["gone k=v"] != Removed || got["new k=v"] != Added {
		t.Fatalf("%v", got)
	}
	if rep.Regressions() != 2 {
		t.Fatalf("regressions %d", rep.Regressions())
	}
	var buf bytes.Buffer
	rep.Print(&buf)
	if !strings.Contains(buf.String(), "REGRESSED") || !strings.Contains(buf.String(), "2 regression(s)") {
		t.Fatal(buf.String())
	}
}
