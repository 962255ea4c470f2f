// Package compare diffs two sets of benchmark rows and flags regressions,
// direction-aware: time, size and CPU regress upward, throughput downward.
package compare

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/forkfleet/forkfleet/benchd/internal/result"
)

// Verdict of one matched row.
type Verdict string

const (
	Same       Verdict = "ok"
	Improved   Verdict = "improved"
	Regressed  Verdict = "REGRESSED"
	NewFailure Verdict = "FAILURES"
	Added      Verdict = "added"
	Removed    Verdict = "removed"
)

// Line is one row of the comparison.
type Line struct {
	Suite    string
	Key      string
	Unit     string
	Better   string
	Old, New *float64 // p50
	DeltaPct float64  // (new-old)/old*100; NaN when undefined
	Verdict  Verdict
	Note     string
}

// Report is a full comparison.
type Report struct {
	Threshold float64
	Lines     []Line
	// Hosts says how the two sides' machines differ where that makes
	// absolute numbers incomparable (hypervisor, price of a page); empty
	// when they do not, or when the results do not say.
	Hosts []string
}

// pageTouchRatio is how far apart two sides' page-touch probes may be before
// the comparison says the hosts differ: the probe varies with load by up to
// about 2x on one host, and a hypervisor that shadows page tables costs 10x
// or more.
const pageTouchRatio = 3

// Regressions counts lines that fail the comparison.
func (r Report) Regressions() int {
	n := 0
	for _, l := range r.Lines {
		if l.Verdict == Regressed || l.Verdict == NewFailure {
			n++
		}
	}
	return n
}

func rowKey(suite string, row result.Row) string {
	k := suite + ": " + row.Key()
	if row.Baseline {
		k += " [baseline]"
	}
	return k
}

// Compare matches rows of old and new by (suite, metric, labels, baseline)
// and judges each p50 against thresholdPct.
func Compare(old, new []*result.Result, thresholdPct float64) Report {
	type entry struct {
		suite string
		row   result.Row
	}
	index := func(rs []*result.Result) (map[string]entry, []string) {
		m := map[string]entry{}
		var order []string
		for _, r := range rs {
			for _, row := range r.Rows {
				k := rowKey(r.Suite, row)
				if _, dup := m[k]; !dup {
					order = append(order, k)
				}
				m[k] = entry{r.Suite, row}
			}
		}
		return m, order
	}
	om, oorder := index(old)
	nm, norder := index(new)
	rep := Report{Threshold: thresholdPct, Hosts: hostDifferences(old, new)}
	for _, k := range norder {
		n := nm[k]
		o, ok := om[k]
		l := Line{Suite: n.suite, Key: strings.TrimPrefix(k, n.suite+": "), Unit: n.row.Unit, Better: n.row.Direction(),
			New: n.row.P50, DeltaPct: math.NaN()}
		if !ok {
			l.Verdict = Added
			rep.Lines = append(rep.Lines, l)
			continue
		}
		l.Old = o.row.P50
		l.Verdict = judge(o.row, n.row, thresholdPct, &l)
		rep.Lines = append(rep.Lines, l)
	}
	for _, k := range oorder {
		if _, ok := nm[k]; ok {
			continue
		}
		o := om[k]
		rep.Lines = append(rep.Lines, Line{Suite: o.suite, Key: strings.TrimPrefix(k, o.suite+": "), Unit: o.row.Unit,
			Better: o.row.Direction(), Old: o.row.P50, DeltaPct: math.NaN(), Verdict: Removed})
	}
	sort.SliceStable(rep.Lines, func(i, j int) bool { return rep.Lines[i].Suite < rep.Lines[j].Suite })
	return rep
}

// hostDifferences compares the first result of each side's host fingerprint.
func hostDifferences(old, new []*result.Result) []string {
	if len(old) == 0 || len(new) == 0 {
		return nil
	}
	o, n := old[0].Host, new[0].Host
	var out []string
	if o.Hypervisor != "" && n.Hypervisor != "" && o.Hypervisor != n.Hypervisor {
		out = append(out, fmt.Sprintf("hypervisor %s vs %s", o.Hypervisor, n.Hypervisor))
	}
	if o.PageTouchNs > 0 && n.PageTouchNs > 0 {
		r := n.PageTouchNs / o.PageTouchNs
		if r > pageTouchRatio || r < 1/float64(pageTouchRatio) {
			out = append(out, fmt.Sprintf("first write to a 4 KiB page %.1f vs %.1f us", o.PageTouchNs/1000, n.PageTouchNs/1000))
		}
	}
	if o.CPUModel != "" && n.CPUModel != "" && o.CPUModel != n.CPUModel {
		out = append(out, fmt.Sprintf("CPU %q vs %q", o.CPUModel, n.CPUModel))
	}
	return out
}

func judge(o, n result.Row, th float64, l *Line) Verdict {
	if o.N > 0 && n.N == 0 {
		l.Note = fmt.Sprintf("no successful samples (failed %d)", n.Failed)
		return NewFailure
	}
	if n.Failed > 0 && o.Failed == 0 {
		l.Note = fmt.Sprintf("%d failed samples, none before", n.Failed)
		return NewFailure
	}
	if o.P50 == nil || n.P50 == nil {
		return Same
	}
	ov, nv := *o.P50, *n.P50
	if ov == 0 {
		if nv == 0 {
			l.DeltaPct = 0
			return Same
		}
		// A zero baseline gives no ratio; any move in the bad direction is
		// a regression worth a look.
		if (n.Direction() == result.BetterLower) == (nv > 0) {
			l.Note = "from zero"
			return Regressed
		}
		return Improved
	}
	d := (nv - ov) / math.Abs(ov) * 100
	l.DeltaPct = d
	worse := d
	if n.Direction() == result.BetterHigher {
		worse = -d
	}
	switch {
	case worse > th:
		return Regressed
	case worse < -th:
		return Improved
	}
	return Same
}

// Print writes the comparison as an aligned table.
func (r Report) Print(w io.Writer) {
	if len(r.Hosts) > 0 {
		fmt.Fprintf(w, "note: the hosts differ (%s): absolute rows compare machines, not builds\n", strings.Join(r.Hosts, "; "))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "suite\trow\tunit\tbetter\told p50\tnew p50\tdelta\tverdict\n")
	for _, l := range r.Lines {
		delta := "-"
		if !math.IsNaN(l.DeltaPct) {
			delta = fmt.Sprintf("%+.1f%%", l.DeltaPct)
		}
		v := string(l.Verdict)
		if l.Note != "" {
			v += " (" + l.Note + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", l.Suite, l.Key, l.Unit, l.Better, fmtp(l.Old), fmtp(l.New), delta, v)
	}
	tw.Flush()
	fmt.Fprintf(w, "%d regression(s) beyond %.1f%%\n", r.Regressions(), r.Threshold)
}

func fmtp(p *float64) string {
	if p == nil {
		return "-"
	}
	return FormatNum(*p)
}

// FormatNum prints a value with precision that suits its magnitude.
func FormatNum(v float64) string {
	a := math.Abs(v)
	switch {
	case a == 0:
		return "0"
	case a >= 1000:
		return fmt.Sprintf("%.0f", v)
	case a >= 100:
		return fmt.Sprintf("%.1f", v)
	case a >= 1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}
