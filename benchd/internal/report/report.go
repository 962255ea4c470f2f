// Package report renders the latest result of every suite as Markdown with
// SVG charts next to it, readable without running anything.
package report

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/forkfleet/forkfleet/benchd/internal/compare"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
)

// Loaded is a result with the file it came from.
type Loaded struct {
	Path string
	*result.Result
	// Later are runs of the same suite newer than this one that did not
	// finish ok (failed or skipped), newest first: Latest shows the newest
	// ok run and names these beside it.
	Later []Loaded
}

// Latest walks dir for result files and returns, per suite, the newest run
// (by started_at) that finished ok, or the newest run when none did, in suite
// order; newer runs that did not finish ok are kept in Later. A run pooled
// from others (benchd pool: an A/B's variant, a bisect's build) is picked
// only when the suite has no ok run of its own: it is one side of a
// comparison, often of an old or modified build, not the suite's latest
// measurement of the default configuration. Files that are not valid
// results are returned as errors alongside, never silently dropped.
func Latest(dir string, order []string) ([]Loaded, []error, error) {
	runs := map[string][]Loaded{}
	var bad []error
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || !strings.HasSuffix(p, ".json") || d.Name() == "schema.json" || strings.HasPrefix(d.Name(), ".") {
			return nil
		}
		r, err := result.ReadFile(p)
		if err != nil {
			bad = append(bad, err)
			return nil
		}
		runs[r.Suite] = append(runs[r.Suite], Loaded{Path: p, Result: r})
		return nil
	})
	if err != nil {
		return nil, bad, err
	}
	latest := map[string]Loaded{}
	for suite, rs := range runs {
		sort.SliceStable(rs, func(i, j int) bool { return rs[i].StartedAt.After(rs[j].StartedAt) })
		pick := slices.IndexFunc(rs, func(l Loaded) bool { return l.Status == result.StatusOK && !pooled(l.Result) })
		if pick < 0 {
			pick = slices.IndexFunc(rs, func(l Loaded) bool { return l.Status == result.StatusOK })
		}
		if pick < 0 {
			pick = 0
		}
		l := rs[pick]
		l.Later = slices.DeleteFunc(slices.Clone(rs[:pick]), func(l Loaded) bool { return l.Status == result.StatusOK })
		latest[suite] = l
	}
	rank := map[string]int{}
	for i, s := range order {
		rank[s] = i + 1
	}
	var out []Loaded
	for _, l := range latest {
		out = append(out, l)
	}
	sort.Slice(out, func(i, j int) bool {
		ri, rj := rank[out[i].Suite], rank[out[j].Suite]
		if ri == 0 {
			ri = 1 << 20
		}
		if rj == 0 {
			rj = 1 << 20
		}
		if ri != rj {
			return ri < rj
		}
		return out[i].Suite < out[j].Suite
	})
	return out, bad, nil
}

// pooled reports whether r was pooled from other runs (benchd pool).
func pooled(r *result.Result) bool {
	_, ok := r.Config["pooled_from"]
	return ok
}

// Render writes outPath (Markdown) and its SVG charts into
// <dir of outPath>/<name>-charts/. Chart files are rewritten on every render
// and charts no longer rendered are removed: they are derived views; the
// result files are the record.
func Render(results []Loaded, outPath string) error {
	files, err := Build(results, outPath)
	if err != nil {
		return err
	}
	chartDir := chartDirOf(outPath)
	if err := os.MkdirAll(chartDir, 0o755); err != nil {
		return err
	}
	old, _ := filepath.Glob(filepath.Join(chartDir, "*.svg"))
	for _, p := range old {
		if _, keep := files[p]; !keep {
			if err := os.Remove(p); err != nil {
				return err
			}
		}
	}
	for p, b := range files {
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// Check renders the report in memory and compares it with what is on disk
// at outPath: the Markdown and every chart byte for byte, and no chart on
// disk that the render would not write. A nil error means the committed
// report is exactly what `benchd report` would write from these results.
func Check(results []Loaded, outPath string) error {
	files, err := Build(results, outPath)
	if err != nil {
		return err
	}
	var problems []string
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		have, err := os.ReadFile(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			problems = append(problems, p+": missing")
		case err != nil:
			return err
		case string(have) != string(files[p]):
			problems = append(problems, p+": differs from the render of the results")
		}
	}
	onDisk, _ := filepath.Glob(filepath.Join(chartDirOf(outPath), "*.svg"))
	for _, p := range onDisk {
		if _, ok := files[p]; !ok {
			problems = append(problems, p+": not rendered from any result (stale)")
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("the report is out of date with the results (run `benchd report` and commit it):\n  %s",
			strings.Join(problems, "\n  "))
	}
	return nil
}

func chartDirOf(outPath string) string {
	return filepath.Join(filepath.Dir(outPath), chartDirName(outPath))
}

func chartDirName(outPath string) string {
	return strings.TrimSuffix(filepath.Base(outPath), filepath.Ext(outPath)) + "-charts"
}

// Build renders the report without writing it: file path (outPath, and
// each chart under <dir of outPath>/<name>-charts/) to content.
func Build(results []Loaded, outPath string) (map[string][]byte, error) {
	if len(results) == 0 {
		return nil, errors.New("no results to render")
	}
	outDir := filepath.Dir(outPath)
	chartDir := chartDirOf(outPath)
	files := map[string][]byte{}
	var md strings.Builder
	md.WriteString("# forkfleet benchmarks\n\n")
	md.WriteString("Generated by `benchd report` from the latest result file of each suite. Every number below is ")
	md.WriteString("reproducible with `benchd run --suite NAME`; rows marked *peer* were measured in the same run on ")
	md.WriteString("the same host as ours. p50/p90 interpolate linearly; p99 appears only where n >= 100. Failed and ")
	md.WriteString("unverified samples are counted apart and never enter a distribution. `make check` fails when this ")
	md.WriteString("file or its charts differ from what `benchd report` renders from the committed results.\n\n")
	md.WriteString("| suite | status | measured | host | result file |\n|---|---|---|---|---|\n")
	for _, r := range results {
		status := statusText(r.Result)
		for _, l := range r.Later {
			status += fmt.Sprintf("; a later run %s: %s ([%s](%s))", l.Status, l.Reason, filepath.Base(l.Path), rel(outDir, l.Path))
		}
		fmt.Fprintf(&md, "| [%s](#%s) | %s | %s | %s | [%s](%s) |\n", r.Suite, r.Suite, cell(status),
			r.StartedAt.Format("2006-01-02 15:04Z"), cell(hostShort(r.Host)), filepath.Base(r.Path), rel(outDir, r.Path))
	}
	md.WriteString("\n")
	for _, r := range results {
		if err := renderSuite(&md, files, r, outDir, chartDir, chartDirName(outPath)); err != nil {
			return nil, fmt.Errorf("%s: %w", r.Suite, err)
		}
	}
	files[outPath] = []byte(md.String())
	return files, nil
}

func renderSuite(md *strings.Builder, files map[string][]byte, r Loaded, outDir, chartDir, chartDirName string) error {
	fmt.Fprintf(md, "## %s\n\n", r.Suite)
	fmt.Fprintf(md, "Status **%s**", r.Status)
	if r.Reason != "" {
		fmt.Fprintf(md, " (%s)", r.Reason)
	}
	fmt.Fprintf(md, ". Result: [%s](%s). Run %s to %s.\n\n", filepath.Base(r.Path), rel(outDir, r.Path),
		r.StartedAt.Format("2006-01-02 15:04:05Z"), r.FinishedAt.Format("15:04:05Z"))
	for _, l := range r.Later {
		fmt.Fprintf(md, "A later run, [%s](%s) (%s), did not finish ok: %s.\n\n", filepath.Base(l.Path), rel(outDir, l.Path),
			l.StartedAt.Format("2006-01-02 15:04:05Z"), statusText(l.Result))
	}
	h := r.Host
	md.WriteString("| host | |\n|---|---|\n")
	fmt.Fprintf(md, "| CPU | %s, %d cores, %.0f MHz |\n", cell(h.CPUModel), h.Cores, h.MHz)
	fmt.Fprintf(md, "| memory | %.1f GiB |\n", float64(h.MemoryBytes)/(1<<30))
	if h.Hypervisor != "" || h.PageTouchNs > 0 {
		fmt.Fprintf(md, "| hypervisor / first write to a 4 KiB page | %s / %s |\n", cell(orDash(h.Hypervisor)), pageTouch(h))
	}
	fmt.Fprintf(md, "| kernel / Debian | %s / %s |\n", cell(h.Kernel), cell(h.DebianVersion))
	fmt.Fprintf(md, "| containerd / runc / CRIU | %s / %s / %s |\n", cell(orDash(h.ContainerdVersion)), cell(orDash(h.RuncVersion)), cell(orDash(h.CRIUVersion)))
	fmt.Fprintf(md, "| load before / after | %.2f %.2f %.2f / %.2f %.2f %.2f |\n", h.LoadBefore[0], h.LoadBefore[1], h.LoadBefore[2], h.LoadAfter[0], h.LoadAfter[1], h.LoadAfter[2])
	dirty := ""
	if r.Build.Dirty {
		dirty = " (dirty tree)"
	}
	fmt.Fprintf(md, "| build | %s%s, %s |\n", cell(r.Build.Commit), dirty, r.Build.GoVersion)
	if len(r.Config) > 0 {
		keys := make([]string, 0, len(r.Config))
		for k := range r.Config {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var parts []string
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("`--%s=%v`", k, r.Config[k]))
		}
		fmt.Fprintf(md, "| config | %s |\n", strings.Join(parts, " "))
	}
	md.WriteString("\n")
	for _, n := range r.Notes {
		fmt.Fprintf(md, "- Note: %s\n", n)
	}
	if len(r.Notes) > 0 {
		md.WriteString("\n")
	}
	if len(r.Rows) == 0 {
		return nil
	}
	charts := Charts(r.Result)
	for i, c := range charts {
		name := fmt.Sprintf("%s-%d.svg", r.Suite, i+1)
		files[filepath.Join(chartDir, name)] = []byte(c.SVG)
		fmt.Fprintf(md, "![%s](%s/%s)\n\n", c.Title, chartDirName, name)
	}
	md.WriteString("| metric | labels | unit | n | p50 | p90 | p99 | min | max | failed | unverified | warm-up |\n")
	md.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, row := range r.Rows {
		metric := row.Metric
		if row.Baseline {
			metric += " *(peer)*"
		}
		fmt.Fprintf(md, "| %s | %s | %s | %d | %s | %s | %s | %s | %s | %d | %d | %d |\n", cell(metric), cell(labelString(row.Labels)),
			row.Unit, row.N, num(row.P50), num(row.P90), num(row.P99), num(row.Min), num(row.Max), row.Failed, row.Unverified, row.Warmup)
	}
	md.WriteString("\n")
	return nil
}

// Chart is one rendered SVG.
type Chart struct {
	Title string
	SVG   string
}

// Charts picks the charts for a suite: the specialised ones where the rows
// have their shape, plus a generic bar chart per unit.
func Charts(r *result.Result) []Chart {
	var out []Chart
	switch r.Suite {
	case "boot":
		if c, ok := bootWaterfall(r); ok {
			out = append(out, c)
		}
	case "fork":
		out = append(out, lineBy(r, "fork.fanout.wall", "n", "tier", "fork fan-out: wall clock to N verified replicas", "replicas N", false)...)
	case "codec":
		out = append(out, codecLadder(r)...)
	case "step":
		out = append(out, lineBy(r, "step.latency", "rtt_ms", "series", "step latency vs added RTT (p50)", "added RTT (ms)", false)...)
	}
	out = append(out, genericBars(r)...)
	return out
}

func bootWaterfall(r *result.Result) (Chart, bool) {
	var phases []Phase
	for _, row := range r.Rows {
		// Cold boots (files from before the start label have only those).
		if row.Metric != "boot.milestone" || row.P50 == nil || row.Baseline || (row.Labels["start"] != "" && row.Labels["start"] != "cold") {
			continue
		}
		phases = append(phases, Phase{Label: row.Labels["milestone"], End: *row.P50, EndP90: *row.P90})
	}
	if len(phases) == 0 {
		return Chart{}, false
	}
	sort.SliceStable(phases, func(i, j int) bool { return phases[i].End < phases[j].End })
	for i := 1; i < len(phases); i++ {
		phases[i].Start = phases[i-1].End
	}
	t := "boot waterfall (ms since CreateSandbox)"
	return Chart{Title: t, SVG: Waterfall(t, phases)}, true
}

func codecLadder(r *result.Result) []Chart {
	contents := map[string]bool{}
	for _, row := range r.Rows {
		if row.Metric == "codec.bytes" {
			contents[row.Labels["content"]] = true
		}
	}
	var names []string
	for c := range contents {
		names = append(names, c)
	}
	sort.Strings(names)
	var out []Chart
	for _, c := range names {
		sub := &result.Result{Suite: r.Suite}
		for _, row := range r.Rows {
			if row.Metric == "codec.bytes" && row.Labels["content"] == c {
				sub.Rows = append(sub.Rows, row)
			}
		}
		out = append(out, lineBy(sub, "codec.bytes", "edge", "codec", "codec ladder, "+c+": bytes per frame (p50)", "max_long_edge", true)...)
	}
	return out
}

// lineBy draws one line per distinct series label over the x label.
func lineBy(r *result.Result, metric, xKey, seriesKey, title, xTitle string, logY bool) []Chart {
	type pt struct{ x, s string }
	vals := map[pt]float64{}
	xset, sset := map[string]bool{}, map[string]bool{}
	unit := ""
	for _, row := range r.Rows {
		if row.Metric != metric || row.P50 == nil {
			continue
		}
		x, s := row.Labels[xKey], row.Labels[seriesKey]
		if row.Baseline {
			s += " (peer)"
		}
		vals[pt{x, s}] = *row.P50
		xset[x], sset[s] = true, true
		unit = row.Unit
	}
	if len(vals) == 0 {
		return nil
	}
	xs := sortedKeys(xset)
	ss := sortedKeys(sset)
	var lines []Line
	for _, s := range ss {
		l := Line{Name: s}
		for _, x := range xs {
			v, ok := vals[pt{x, s}]
			if !ok {
				v = math.NaN()
			}
			l.Values = append(l.Values, v)
		}
		lines = append(lines, l)
	}
	return []Chart{{Title: title, SVG: LineChart(title, xTitle, unit, xs, lines, logY)}}
}

// sortedKeys orders numerically when every key is a number ("native" sorts
// first, as the largest size), else lexically.
func sortedKeys(m map[string]bool) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	num := func(s string) (float64, bool) {
		if s == "native" {
			return math.Inf(1), true
		}
		v, err := strconv.ParseFloat(s, 64)
		return v, err == nil
	}
	allNum := true
	for _, k := range ks {
		if _, ok := num(k); !ok {
			allNum = false
		}
	}
	sort.Slice(ks, func(i, j int) bool {
		if allNum {
			a, _ := num(ks[i])
			b, _ := num(ks[j])
			if m["native"] {
				return a > b // an image-size ladder: native first, then smaller
			}
			return a < b
		}
		return ks[i] < ks[j]
	})
	return ks
}

const maxBarsPerChart = 40

func genericBars(r *result.Result) []Chart {
	byUnit := map[string][]Bar{}
	var units []string
	for _, row := range r.Rows {
		if row.P50 == nil {
			continue
		}
		if _, ok := byUnit[row.Unit]; !ok {
			units = append(units, row.Unit)
		}
		label := row.Metric
		if l := labelString(row.Labels); l != "" {
			label += " " + l
		}
		byUnit[row.Unit] = append(byUnit[row.Unit], Bar{Label: label, Value: *row.P50, P90: *row.P90, Baseline: row.Baseline})
	}
	var out []Chart
	for _, u := range units {
		bars := byUnit[u]
		for start := 0; start < len(bars); start += maxBarsPerChart {
			end := min(start+maxBarsPerChart, len(bars))
			t := fmt.Sprintf("%s: p50 in %s", r.Suite, u)
			if len(bars) > maxBarsPerChart {
				t += fmt.Sprintf(" (%d-%d of %d)", start+1, end, len(bars))
			}
			out = append(out, Chart{Title: t, SVG: BarChart(t, u, bars[start:end])})
		}
	}
	return out
}

func labelString(l map[string]string) string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, k+"="+l[k])
	}
	return strings.Join(parts, " ")
}

func statusText(r *result.Result) string {
	if r.Reason != "" {
		return r.Status + ": " + r.Reason
	}
	return r.Status
}

func hostShort(h result.Host) string {
	s := fmt.Sprintf("%d x %s, kernel %s", h.Cores, h.CPUModel, h.Kernel)
	if h.Hypervisor != "" {
		s += ", " + h.Hypervisor
	}
	if h.PageTouchNs > 0 {
		s += ", page touch " + pageTouch(h)
	}
	return s
}

func pageTouch(h result.Host) string {
	if h.PageTouchNs <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f us", h.PageTouchNs/1000)
}

func num(p *float64) string {
	if p == nil {
		return "-"
	}
	return compare.FormatNum(*p)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func cell(s string) string { return strings.ReplaceAll(strings.ReplaceAll(s, "|", `\|`), "\n", " ") }

func rel(base, target string) string {
	absB, err1 := filepath.Abs(base)
	absT, err2 := filepath.Abs(target)
	if err1 != nil || err2 != nil {
		return target
	}
	r, err := filepath.Rel(absB, absT)
	if err != nil {
		return target
	}
	return filepath.ToSlash(r)
}
