package report

import (
	"fmt"
	"html"
	"math"
	"sort"
	"strconv"
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

// Text metrics of the sans-serif labels, generous so that no label is cut
// off in any common font: average advance per character at 11px and 10px.
const (
	labelCharW = 6.6
	valueCharW = 6.0
)

func textW(s string, charW float64) int { return int(math.Ceil(float64(len([]rune(s))) * charW)) }

// logRatio is the spread (largest / smallest positive value) from which a
// chart switches to a log axis: past two orders of magnitude the small bars
// of a linear axis are a pixel wide and unreadable.
const logRatio = 100

// axis maps values onto [0, span] pixels, linearly from 0 or by decades.
type axis struct {
	log    bool
	lo, hi float64 // log: decade bounds; linear: 0 and the maximum
	span   float64
}

func newAxis(values []float64, span float64, forceLog bool) axis {
	lo, hi := math.Inf(1), 0.0
	for _, v := range values {
		if v > 0 && !math.IsNaN(v) && !math.IsInf(v, 0) {
			lo, hi = math.Min(lo, v), math.Max(hi, v)
		}
	}
	if hi <= 0 {
		return axis{lo: 0, hi: 1, span: span}
	}
	if forceLog || hi/lo >= logRatio {
		return axis{log: true, lo: math.Pow(10, math.Floor(math.Log10(lo))), hi: math.Pow(10, math.Ceil(math.Log10(hi)+1e-9)), span: span}
	}
	return axis{lo: 0, hi: hi, span: span}
}

// at returns v's offset in pixels; a log axis puts values <= 0 at 0.
func (a axis) at(v float64) float64 {
	if a.log {
		if v <= 0 {
			return 0
		}
		return (math.Log10(v) - math.Log10(a.lo)) / (math.Log10(a.hi) - math.Log10(a.lo)) * a.span
	}
	return v / a.hi * a.span
}

// ticks are the values to label: every decade of a log axis, five even
// steps of a linear one.
func (a axis) ticks() []float64 {
	var out []float64
	if a.log {
		for k := math.Round(math.Log10(a.lo)); k <= math.Round(math.Log10(a.hi)); k++ {
			out = append(out, math.Pow(10, k))
		}
		return out
	}
	for i := 0; i <= 4; i++ {
		out = append(out, a.lo+float64(i)/4*(a.hi-a.lo))
	}
	return out
}

// tick formats a tick value: decades as plain numbers (0.01, 1, 1000).
func (a axis) tick(v float64) string {
	if a.log {
		return strconv.FormatFloat(v, 'g', -1, 64)
	}
	return compare.FormatNum(v)
}

// BarChart draws horizontal bars, peers in grey, ours in blue, on a log axis
// when the bars span two orders of magnitude or more. Labels are never
// truncated: the label column is as wide as the longest one.
func BarChart(title, unit string, bars []Bar) string {
	const (
		plotW = 420
		rowH  = 18
		top   = 40
	)
	labelW := 120
	valueW := 60
	var values []float64
	for _, b := range bars {
		labelW = max(labelW, textW(b.Label, labelCharW)+16)
		valueW = max(valueW, textW(compare.FormatNum(b.Value)+" "+unit, valueCharW)+12)
		values = append(values, b.Value, b.P90)
	}
	ax := newAxis(values, plotW, false)
	footer := "p50 bars, p90 whiskers; grey = peer baseline measured in the same run"
	if ax.log {
		footer += "; log scale"
	}
	axisRow := 0
	if ax.log {
		axisRow = 16 // decade labels under the plot
	}
	h := top + rowH*len(bars) + axisRow + 30
	w := max(labelW+plotW+valueW, textW(title, 8.5)+20, labelW+textW(footer, labelCharW)+10)
	var sb strings.Builder
	header(&sb, w, h, title)
	plotBottom := top + rowH*len(bars)
	if ax.log {
		for _, v := range ax.ticks() {
			x := float64(labelW) + ax.at(v)
			fmt.Fprintf(&sb, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#e4e4e4"/>`+"\n", x, x, top, plotBottom)
			fmt.Fprintf(&sb, `<text x="%.1f" y="%d" text-anchor="middle" class="v">%s</text>`+"\n", x, plotBottom+12, esc(ax.tick(v)))
		}
	}
	for i, b := range bars {
		y := top + i*rowH
		wv := ax.at(b.Value)
		color := oursColor
		if b.Baseline {
			color = baselineColor
		}
		fmt.Fprintf(&sb, `<text x="%d" y="%d" text-anchor="end" class="l">%s</text>`+"\n", labelW-6, y+13, esc(b.Label))
		fmt.Fprintf(&sb, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", labelW, y+3, math.Max(wv, 0.5), rowH-6, color)
		end := wv
		if b.P90 > b.Value {
			x1, x2 := float64(labelW)+wv, float64(labelW)+ax.at(b.P90)
			fmt.Fprintf(&sb, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#333" stroke-width="1"/>`+"\n", x1, x2, y+rowH/2, y+rowH/2)
			end = ax.at(b.P90)
		}
		fmt.Fprintf(&sb, `<text x="%.1f" y="%d" class="v">%s</text>`+"\n", float64(labelW)+end+4, y+13, esc(compare.FormatNum(b.Value)+" "+unit))
	}
	fmt.Fprintf(&sb, `<text x="%d" y="%d" class="l">%s</text>`+"\n", labelW, h-8, esc(footer))
	sb.WriteString("</svg>\n")
	return sb.String()
}

// Line is one series of a line chart; NaN values are gaps.
type Line struct {
	Name   string
	Values []float64
}

// LineChart plots series over categorical x positions, on a log y axis
// when logY is set or the values span two orders of magnitude or more.
func LineChart(title, xTitle, unit string, xs []string, lines []Line, logY bool) string {
	const (
		left, top, bottom = 70, 40, 50
		plotW, plotH      = 480, 260
	)
	right := 60
	var values []float64
	for _, l := range lines {
		right = max(right, textW(l.Name, labelCharW)+40)
		values = append(values, l.Values...)
	}
	ax := newAxis(values, plotH, logY)
	w, h := max(left+plotW+right, textW(title, 8.5)+20), top+plotH+bottom
	ymap := func(v float64) float64 { return float64(top+plotH) - ax.at(v) }
	xmap := func(i int) float64 {
		if len(xs) == 1 {
			return left + plotW/2
		}
		return left + float64(i)*plotW/float64(len(xs)-1)
	}
	var sb strings.Builder
	header(&sb, w, h, title)
	fmt.Fprintf(&sb, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#ccc"/>`+"\n", left, top, plotW, plotH)
	for _, v := range ax.ticks() {
		y := ymap(v)
		fmt.Fprintf(&sb, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", left, left+plotW, y, y)
		fmt.Fprintf(&sb, `<text x="%d" y="%.1f" text-anchor="end" class="v">%s</text>`+"\n", left-4, y+4, esc(ax.tick(v)))
	}
	for i, x := range xs {
		fmt.Fprintf(&sb, `<text x="%.1f" y="%d" text-anchor="middle" class="v">%s</text>`+"\n", xmap(i), top+plotH+16, esc(x))
	}
	fmt.Fprintf(&sb, `<text x="%d" y="%d" text-anchor="middle" class="l">%s</text>`+"\n", left+plotW/2, top+plotH+36, esc(xTitle))
	yl := unit
	if ax.log {
		yl += " (log)"
	}
	fmt.Fprintf(&sb, `<text x="14" y="%d" class="l" transform="rotate(-90 14 %d)" text-anchor="middle">%s</text>`+"\n", top+plotH/2, top+plotH/2, esc(yl))
	for li, l := range lines {
		c := palette[li%len(palette)]
		var pts []string
		for i, v := range l.Values {
			if i >= len(xs) || math.IsNaN(v) || (ax.log && v <= 0) {
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
		fmt.Fprintf(&sb, `<text x="%d" y="%d" class="l">%s</text>`+"\n", left+plotW+26, ly+1, esc(l.Name))
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
		plotW = 460
		rowH  = 22
		top   = 40
	)
	labelW := 120
	for _, p := range phases {
		labelW = max(labelW, textW(p.Label, labelCharW)+16)
	}
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
		fmt.Fprintf(&sb, `<text x="%d" y="%d" text-anchor="end" class="l">%s</text>`+"\n", labelW-6, y+15, esc(p.Label))
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
