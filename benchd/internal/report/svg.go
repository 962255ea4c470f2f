package report

import (
	"fmt"
	"html"
	"math"
	"sort"
	"strings"

	"github.com/forkfleet/forkfleet/benchd/internal/compare"
)

// Hand-written SVG: no dependencies, readable in any browser or on GitHub.

var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

const (
	oursColor     = "#1f77b4"
	baselineColor = "#9a9a9a"
)

// Bar is one bar of a horizontal bar chart.
type Bar struct {
	Label    string
	Value    float64 // p50
	P90      float64 // drawn as a whisker when > Value
	Baseline bool
}

// BarChart draws horizontal bars, peers in grey, ours in blue.
func BarChart(title, unit string, bars []Bar) string {
	const (
		labelW = 330
		plotW  = 420
		rowH   = 18
		top    = 40
	)
	h := top + rowH*len(bars) + 30
	maxV := 0.0
	for _, b := range bars {
		maxV = math.Max(maxV, math.Max(b.Value, b.P90))
	}
	if maxV <= 0 {
		maxV = 1
	}
	var sb strings.Builder
	header(&sb, labelW+plotW+90, h, title)
	for i, b := range bars {
		y := top + i*rowH
		w := b.Value / maxV * plotW
		color := oursColor
		if b.Baseline {
			color = baselineColor
		}
		fmt.Fprintf(&sb, `<text x="%d" y="%d" text-anchor="end" class="l">%s</text>`+"\n", labelW-6, y+13, esc(trunc(b.Label, 52)))
		fmt.Fprintf(&sb, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", labelW, y+3, math.Max(w, 0.5), rowH-6, color)
		if b.P90 > b.Value {
			x1, x2 := float64(labelW)+w, float64(labelW)+b.P90/maxV*plotW
			fmt.Fprintf(&sb, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#333" stroke-width="1"/>`+"\n", x1, x2, y+rowH/2, y+rowH/2)
		}
		fmt.Fprintf(&sb, `<text x="%.1f" y="%d" class="v">%s</text>`+"\n", float64(labelW)+math.Max(w, b.P90/maxV*plotW)+4, y+13, esc(compare.FormatNum(b.Value)+" "+unit))
	}
	fmt.Fprintf(&sb, `<text x="%d" y="%d" class="l">p50 bars, p90 whiskers; grey = peer baseline measured in the same run</text>`+"\n", labelW, h-8)
	sb.WriteString("</svg>\n")
	return sb.String()
}

// Line is one series of a line chart; NaN values are gaps.
type Line struct {
	Name   string
	Values []float64
}

// LineChart plots series over categorical x positions.
func LineChart(title, xTitle, unit string, xs []string, lines []Line, logY bool) string {
	const (
		left, right, top, bottom = 70, 200, 40, 50
		plotW, plotH             = 480, 260
	)
	w, h := left+plotW+right, top+plotH+bottom
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, l := range lines {
		for _, v := range l.Values {
			if math.IsNaN(v) || (logY && v <= 0) {
				continue
			}
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
	}
	if math.IsInf(lo, 1) {
		lo, hi = 0, 1
	}
	if !logY {
		lo = 0
	}
	if hi <= lo {
		hi = lo + 1
	}
	ymap := func(v float64) float64 {
		if logY {
			return float64(top+plotH) - (math.Log10(v)-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo)+1e-12)*plotH
		}
		return float64(top+plotH) - (v-lo)/(hi-lo)*plotH
	}
	xmap := func(i int) float64 {
		if len(xs) == 1 {
			return left + plotW/2
		}
		return left + float64(i)*plotW/float64(len(xs)-1)
	}
	var sb strings.Builder
	header(&sb, w, h, title)
	fmt.Fprintf(&sb, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#ccc"/>`+"\n", left, top, plotW, plotH)
	// y ticks: 5 levels (log: decades or 5 evenly spaced in log space).
	for i := 0; i <= 4; i++ {
		var v float64
		if logY {
			v = math.Pow(10, math.Log10(lo)+float64(i)/4*(math.Log10(hi)-math.Log10(lo)))
		} else {
			v = lo + float64(i)/4*(hi-lo)
		}
		y := ymap(v)
		fmt.Fprintf(&sb, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", left, left+plotW, y, y)
		fmt.Fprintf(&sb, `<text x="%d" y="%.1f" text-anchor="end" class="v">%s</text>`+"\n", left-4, y+4, esc(compare.FormatNum(v)))
	}
	for i, x := range xs {
		fmt.Fprintf(&sb, `<text x="%.1f" y="%d" text-anchor="middle" class="v">%s</text>`+"\n", xmap(i), top+plotH+16, esc(x))
	}
	fmt.Fprintf(&sb, `<text x="%d" y="%d" text-anchor="middle" class="l">%s</text>`+"\n", left+plotW/2, top+plotH+36, esc(xTitle))
	yl := unit
	if logY {
		yl += " (log)"
	}
	fmt.Fprintf(&sb, `<text x="14" y="%d" class="l" transform="rotate(-90 14 %d)" text-anchor="middle">%s</text>`+"\n", top+plotH/2, top+plotH/2, esc(yl))
	for li, l := range lines {
		c := palette[li%len(palette)]
		var pts []string
		for i, v := range l.Values {
			if i >= len(xs) || math.IsNaN(v) || (logY && v <= 0) {
				continue
			}
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", xmap(i), ymap(v)))
			fmt.Fprintf(&sb, `<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s"/>`+"\n", xmap(i), ymap(v), c)
		}
		if len(pts) > 1 {
			fmt.Fprintf(&sb, `<polyline points="%s" fill="none" stroke="%s" stroke-width="1.5"/>`+"\n", strings.Join(pts, " "), c)
		}
		ly := top + 10 + li*16
		fmt.Fprintf(&sb, `<rect x="%d" y="%d" width="10" height="10" fill="%s"/>`+"\n", left+plotW+12, ly-8, c)
		fmt.Fprintf(&sb, `<text x="%d" y="%d" class="l">%s</text>`+"\n", left+plotW+26, ly+1, esc(trunc(l.Name, 26)))
	}
	sb.WriteString("</svg>\n")
	return sb.String()
}

// Phase is one milestone of a waterfall, in milliseconds since the start.
type Phase struct {
	Label      string
	Start, End float64 // p50 of the previous milestone and of this one
	EndP90     float64
}

// Waterfall draws a boot waterfall: each milestone a bar from the previous
// milestone's p50 to its own, with a p90 whisker.
func Waterfall(title string, phases []Phase) string {
	const (
		labelW = 260
		plotW  = 460
		rowH   = 22
		top    = 40
	)
	sort.SliceStable(phases, func(i, j int) bool { return phases[i].End < phases[j].End })
	h := top + rowH*len(phases) + 40
	maxV := 1.0
	for _, p := range phases {
		maxV = math.Max(maxV, math.Max(p.End, p.EndP90))
	}
	var sb strings.Builder
	header(&sb, labelW+plotW+110, h, title)
	for i, p := range phases {
		y := top + i*rowH
		x0 := float64(labelW) + p.Start/maxV*plotW
		x1 := float64(labelW) + p.End/maxV*plotW
		fmt.Fprintf(&sb, `<text x="%d" y="%d" text-anchor="end" class="l">%s</text>`+"\n", labelW-6, y+15, esc(trunc(p.Label, 40)))
		fmt.Fprintf(&sb, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", x0, y+4, math.Max(x1-x0, 1), rowH-8, palette[i%len(palette)])
		if p.EndP90 > p.End {
			x2 := float64(labelW) + p.EndP90/maxV*plotW
			fmt.Fprintf(&sb, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#333"/>`+"\n", x1, x2, y+rowH/2, y+rowH/2)
		}
		fmt.Fprintf(&sb, `<text x="%.1f" y="%d" class="v">%s ms</text>`+"\n", math.Max(x1, float64(labelW)+p.EndP90/maxV*plotW)+4, y+15, esc(compare.FormatNum(p.End)))
	}
	fmt.Fprintf(&sb, `<text x="%d" y="%d" class="l">cumulative p50 per milestone (bar from the previous milestone), p90 whisker</text>`+"\n", labelW, h-10)
	sb.WriteString("</svg>\n")
	return sb.String()
}

func header(sb *strings.Builder, w, h int, title string) {
	fmt.Fprintf(sb, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif">`+"\n", w, h, w, h)
	sb.WriteString(`<style>.t{font-size:14px;font-weight:bold}.l{font-size:11px;fill:#222}.v{font-size:10px;fill:#444}</style>` + "\n")
	fmt.Fprintf(sb, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(sb, `<text x="10" y="22" class="t">%s</text>`+"\n", esc(title))
}

func esc(s string) string { return html.EscapeString(s) }

func trunc(s string, n int) string {
	if len([]rune(s)) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}
