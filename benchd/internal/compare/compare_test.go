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

func TestHostDifferences(t *testing.T) {
	side := func(hv, cpu string, touch float64) []*result.Result {
		return []*result.Result{{Suite: "s", Host: result.Host{Hypervisor: hv, CPUModel: cpu, PageTouchNs: touch},
			Rows: []result.Row{one("m", "ms", 10)}}}
	}
	for _, c := range []struct {
		name     string
		old, new []*result.Result
		want     []string
	}{
		{"same host, load noise", side("KVM", "x", 400), side("KVM", "x", 900), nil},
		{"unprobed", side("", "x", 0), side("PVM", "x", 14000), nil},
		{"shadow paging", side("KVM", "x", 400), side("PVM", "x", 14000),
			[]string{"hypervisor KVM vs PVM", "first write to a 4 KiB page 0.4 vs 14.0 us"}},
		{"other CPU", side("", "Intel", 0), side("", "AMD", 0), []string{`CPU "Intel" vs "AMD"`}},
	} {
		rep := Compare(c.old, c.new, 15)
		if strings.Join(rep.Hosts, "|") != strings.Join(c.want, "|") {
			t.Errorf("%s: %q, want %q", c.name, rep.Hosts, c.want)
		}
		var out bytes.Buffer
		rep.Print(&out)
		if got := strings.HasPrefix(out.String(), "note: the hosts differ"); got != (len(c.want) > 0) {
			t.Errorf("%s: printed %q", c.name, out.String())
		}
	}
}
