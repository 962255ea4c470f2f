//go:build linux

package suites

import (
	"context"
	"flag"
	"image"
	"image/color"
	"io"
	"os"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace/noop"

	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
)

func TestEditDistance(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"", "", 0}, {"abc", "", 3}, {"", "abc", 3}, {"kitten", "sitting", 3},
		{"flaw", "lawn", 2}, {"quartz", "quartz", 0}, {"héllo", "hello", 1},
	} {
		if got := editDistance(c.a, c.b); got != c.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}

func TestParseTesseractTSV(t *testing.T) {
	tsv := "level\tpage_num\tblock_num\tpar_num\tline_num\tword_num\tleft\ttop\twidth\theight\tconf\ttext\n" +
		"1\t1\t0\t0\t0\t0\t0\t0\t300\t100\t-1\t\n" +
		"5\t1\t1\t1\t1\t1\t10\t10\t40\t12\t95\tquartz\n" +
		"5\t1\t1\t1\t1\t2\t55\t10\t40\t12\t91\tbench\n" +
		"5\t1\t1\t1\t2\t1\t10\t40\t40\t12\t90\tkq7tz\n" +
		"5\t1\t1\t1\t2\t2\t60\t40\t40\t12\t90\t \n"
	lines, err := parseTesseractTSV([]byte(tsv))
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) != 2 || lines[0].text() != "quartz bench" || lines[1].text() != "kq7tz" {
		t.Fatalf("lines %+v", lines)
	}
	if lines[0].Box != image.Rect(10, 10, 95, 22) {
		t.Errorf("line box %v", lines[0].Box)
	}
	for _, bad := range []string{"", "nonsense\n", "level\tx\n5\t1\n", "level\n5\t1\t1\t1\t1\t1\tx\t10\t40\t12\t95\tq\n"} {
		if _, err := parseTesseractTSV([]byte(bad)); err == nil {
			t.Errorf("parseTesseractTSV(%q): no error", bad)
		}
	}
}

func TestScoreElementsAndJudgeCell(t *testing.T) {
	els := []legElement{
		{Source: "browser", SizePx: 16, Text: "falcon ribbon quiver 16px gm6sw", Token: "gm6sw", Box: image.Rect(100, 100, 400, 120)},
		{Source: "browser", SizePx: 9, Text: "quartz bench vixen 9px kq7tz", Token: "kq7tz", Box: image.Rect(100, 200, 300, 210)},
		{Source: "browser", SizePx: 13, Text: "candle vector plume 13px zd5qa", Token: "zd5qa", Box: image.Rect(100, 300, 350, 315)},
	}
	// OCR pixels are 2x the screen, cropped at screen (50, 50).
	w := func(s string, x, y int) ocrWord { return ocrWord{Text: s, Box: image.Rect(x, y, x+40, y+20)} }
	line := func(ws ...ocrWord) ocrLine {
		l := ocrLine{Words: ws, Box: ws[0].Box}
		for _, w := range ws {
			l.Box = l.Box.Union(w.Box)
		}
		return l
	}
	lines := []ocrLine{
		// Element 0, one edit off, token with trailing punctuation.
		line(w("Falcon", 110, 100), w("ribbon", 160, 100), w("quiver", 210, 100), w("16px", 260, 100), w("gm6sw.", 310, 100)),
		// Element 1: garbled beyond the distance, token unreadable.
		line(w("qu@rt2", 110, 300), w("bnch", 160, 300), w("kq7", 210, 300)),
		// Element 2's text, but drawn where element 0 is not: elsewhere on
		// the screen (y 600 in screen terms), so neither read nor located.
		line(w("candle", 110, 1100), w("vector", 160, 1100), w("plume", 210, 1100), w("13px", 260, 1100), w("zd5qa", 310, 1100)),
	}
	got := scoreElements(els, lines, 2, image.Pt(50, 50), 4)
	if !got[0].Read || !got[0].Located {
		t.Errorf("element 0: %+v", got[0])
	}
	if got[1].Read || got[1].Located {
		t.Errorf("element 1: %+v", got[1])
	}
	if got[2].Read || got[2].Located {
		t.Errorf("element 2: %+v", got[2])
	}
	if v := judgeCell(got, 11); v.TextSafe || v.Read != 1 || v.Located != 1 || v.Elements != 3 || len(v.Missed) != 1 {
		t.Errorf("judgeCell min 11: %+v", v)
	}
	// Only element 0 is at or above 14 px: safe.
	if v := judgeCell(got, 14); !v.TextSafe {
		t.Errorf("judgeCell min 14: %+v", v)
	}
	if v := judgeCell(nil, 0); v.TextSafe {
		t.Error("a cell without elements is text-safe")
	}
	if readWithin("abc") != 1 || readWithin("falcon ribbon quiver 16px gm6sw") != 3 {
		t.Error("readWithin")
	}
}

func TestUpscale(t *testing.T) {
	src := image.NewGray(image.Rect(0, 0, 2, 1))
	src.Pix[0], src.Pix[1] = 0, 200
	out := upscale(src, 3)
	if out.Bounds() != image.Rect(0, 0, 6, 3) {
		t.Fatalf("bounds %v", out.Bounds())
	}
	if out.GrayAt(0, 0) != (color.Gray{0}) || out.GrayAt(5, 2) != (color.Gray{200}) {
		t.Errorf("edges %v %v", out.GrayAt(0, 0), out.GrayAt(5, 2))
	}
	if v := out.GrayAt(3, 1).Y; v <= 0 || v >= 200 {
		t.Errorf("middle %d not interpolated", v)
	}
}

// TestLegibilitySuiteSmoke runs a cut-down legibility suite (native PNG and
// JPEG q95, one xterm size) against the host's controld and the web desktop
// image, and checks that a native PNG reads every element of 11 px or more.
func TestLegibilitySuiteSmoke(t *testing.T) {
	integration(t)
	sock := os.Getenv("FORKFLEET_CONTROLD_SOCKET")
	if sock == "" {
		sock = "/run/forkfleet/controld.sock"
	}
	env := &suiteapi.Env{ControldSocket: sock, WorkDir: t.TempDir(), Tracer: noop.NewTracerProvider().Tracer("test"), Log: io.Discard, Warmup: -1}
	l := &legibilitySuite{}
	fs := flag.NewFlagSet("legibility", flag.ContinueOnError)
	l.Flags(fs)
	if err := fs.Parse([]string{"--legibility-edges", "0,512", "--legibility-qualities", "95", "--legibility-term-px", "16"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := l.Check(ctx, env); err != nil {
		// A skip here would hide a missing controld or tesseract on a
		// machine that asked for the real stack.
		t.Fatalf("check (make demo starts controld, deploy/host-setup.sh installs tesseract-ocr): %v", err)
	}
	rows, err := l.Run(ctx, env)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	m := rowsByKey(t, rows)
	one := func(r result.Row) bool { return *r.P50 == 1 }
	wantRow(t, m, "legibility.text_safe codec=png edge=native", one)
	wantRow(t, m, "legibility.read_share codec=png edge=native source=terminal-16px", one)
	wantRow(t, m, "legibility.located_share codec=png edge=native source=browser", func(r result.Row) bool { return *r.P50 >= 0.8 })
	// At 512 px the page's small text is gone: the judge must see it.
	wantRow(t, m, "legibility.read_share codec=jpeg-q95 edge=512 source=all", func(r result.Row) bool { return *r.P50 < 1 })
}
