package result

import (
	"errors"
	"fmt"
	"slices"
)

// Pool merges runs of one suite into one result, as an interleaved A/B
// (benchd/ab.sh) keeps them: each row's raw samples are concatenated in
// the order of runs and summarized again, failed, unverified and warm-up
// counts add up, and config.pooled_from names the runs (sources, in
// order). The host is the first run's, its load_before the first run's
// and load_after the last's; config.loads keeps every run's pair, so a
// noisy round stays visible. A row that dropped its samples (a
// high-volume series) cannot be pooled: it is left out and a note says so.
func Pool(runs []*Result, sources []string) (*Result, error) {
	if len(runs) == 0 {
		return nil, errors.New("pool: no runs")
	}
	if len(sources) != len(runs) {
		return nil, fmt.Errorf("pool: %d sources for %d runs", len(sources), len(runs))
	}
	first, last := runs[0], runs[len(runs)-1]
	out := &Result{
		Schema: SchemaID, Suite: first.Suite, Status: StatusOK,
		StartedAt: first.StartedAt, FinishedAt: first.FinishedAt,
		Host: first.Host, Build: first.Build, Config: map[string]any{},
	}
	out.Host.LoadAfter = last.Host.LoadAfter
	for k, v := range first.Config {
		out.Config[k] = v
	}
	out.Config["pooled_from"] = sources
	loads := make([][2][3]float64, 0, len(runs))

	type acc struct {
		row     Row
		samples []float64
		dropped bool
	}
	var order []string
	rows := map[string]*acc{}
	for i, r := range runs {
		if r.Suite != first.Suite {
			return nil, fmt.Errorf("pool: %s is suite %s, %s is %s", sources[i], r.Suite, sources[0], first.Suite)
		}
		if r.Status != StatusOK {
			return nil, fmt.Errorf("pool: %s: status %s (%s)", sources[i], r.Status, r.Reason)
		}
		if r.StartedAt.Before(out.StartedAt) {
			out.StartedAt = r.StartedAt
		}
		if r.FinishedAt.After(out.FinishedAt) {
			out.FinishedAt = r.FinishedAt
		}
		loads = append(loads, [2][3]float64{r.Host.LoadBefore, r.Host.LoadAfter})
		for _, n := range r.Notes {
			if !slices.Contains(out.Notes, n) {
				out.Notes = append(out.Notes, n)
			}
		}
		for _, row := range r.Rows {
			k := row.Key()
			if row.Baseline {
				k += " [baseline]"
			}
			a, ok := rows[k]
			if !ok {
				a = &acc{row: row}
				rows[k] = a
				order = append(order, k)
			} else {
				a.row.Failed += row.Failed
				a.row.Unverified += row.Unverified
				a.row.Warmup += row.Warmup
			}
			if row.N > 0 && row.Samples == nil {
				a.dropped = true
			}
			a.samples = append(a.samples, row.Samples...)
		}
	}
	out.Config["loads"] = loads
	for _, k := range order {
		a := rows[k]
		if a.dropped {
			out.Notes = append(out.Notes, fmt.Sprintf("row %s not pooled: a run kept no raw samples of it", k))
			continue
		}
		s := NewSeries(a.row.Metric, a.row.Unit, a.row.Labels)
		s.Baseline, s.Better = a.row.Baseline, a.row.Better
		for _, v := range a.samples {
			s.Add(v)
		}
		s.failed, s.unverified, s.warmup = a.row.Failed, a.row.Unverified, a.row.Warmup
		out.Rows = append(out.Rows, s.Row())
	}
	if err := out.Validate(); err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	return out, nil
}
