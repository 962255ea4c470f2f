//go:build linux

package suites

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"image"
	"image/jpeg"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/benchd/internal/result"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
)

// legibilityPage is the browser's scripted text: two lines at each of five
// sizes, each ending in a token an agent would look for. Tokens avoid the
// glyphs a sans-serif face draws alike (l/I/1, O/0): the judge measures the
// codec, not the font.
//
//go:embed testdata/legibility_page.html
var legibilityPage []byte

var legibilityLine = regexp.MustCompile(`<p style="font-size:(\d+)px">([^<]+)</p>`)

// legibilitySuite asks which observation cells an agent can still read:
// scripted text in the browser (ground truth: the a11y tree's text and
// bounds) and in xterm (ground truth: the script, the window's bounds), every
// codec cell of the ladder, OCR by tesseract on each element's box.
type legibilitySuite struct {
	image      string
	qualities  intList
	edges      intList
	termSizes  intList
	minPx      int
	tesseract  string
	upscaleBy  int
	screenSize image.Point
}

func (*legibilitySuite) Name() string { return "legibility" }
func (*legibilitySuite) Description() string {
	return "text legibility per codec cell (PNG, JPEG q10/50/80/95 at native/1024/768/512): scripted text in the browser (truth: a11y tree) and xterm (truth: the script), tesseract OCR per element box; share read within edit distance, tokens located, text-safe cells"
}
func (l *legibilitySuite) Flags(fs *flag.FlagSet) {
	l.qualities = intList{10, 50, 80, 95}
	l.edges = intList{0, 1024, 768, 512}
	l.termSizes = intList{9, 12, 16}
	fs.StringVar(&l.image, "legibility-image", "localhost/forkfleet/desktop-web:latest", "the web desktop image (make image-web)")
	fs.Var(&l.qualities, "legibility-qualities", "JPEG qualities")
	fs.Var(&l.edges, "legibility-edges", "max_long_edge values (0: native)")
	fs.Var(&l.termSizes, "legibility-term-px", "xterm font pixel sizes")
	fs.IntVar(&l.minPx, "legibility-min-px", 11, "a cell is text-safe when every element of at least this size is read and located")
	fs.IntVar(&l.upscaleBy, "legibility-ocr-zoom", 3, "the OCR judge's zoom of each box")
}

func (l *legibilitySuite) Check(ctx context.Context, env *suiteapi.Env) error {
	if err := checkControld(ctx, env); err != nil {
		return err
	}
	bin, err := lookPath("tesseract")
	if err != nil {
		return fmt.Errorf("tesseract not installed (deploy/host-setup.sh installs tesseract-ocr): %w", err)
	}
	l.tesseract = bin
	return nil
}

// legCell is one observation codec cell.
type legCell struct {
	codec, edge string
	req         *aciv1.ScreenshotRequest
}

func (l *legibilitySuite) cells() ([]legCell, error) {
	var cells []legCell
	for _, edge := range l.edges {
		edgeName := "native"
		if edge > 0 {
			edgeName = itoa(edge)
		}
		cells = append(cells, legCell{"png", edgeName, &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG, MaxLongEdge: uint32(edge)}})
		for _, q := range l.qualities {
			if q < 1 || q > 100 {
				return nil, fmt.Errorf("legibility: quality %d out of 1..100", q)
			}
			cells = append(cells, legCell{fmt.Sprintf("jpeg-q%d", q), edgeName, &aciv1.ScreenshotRequest{
				Format: aciv1.ImageFormat_IMAGE_FORMAT_JPEG, Quality: uint32(q), MaxLongEdge: uint32(edge)}})
		}
	}
	return cells, nil
}

func (l *legibilitySuite) Run(ctx context.Context, env *suiteapi.Env) ([]result.Row, error) {
	cells, err := l.cells()
	if err != nil {
		return nil, err
	}
	c, err := dialControld(ctx, env)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	cr, err := c.createImage(ctx, l.image)
	if err != nil {
		return nil, fmt.Errorf("boot %s: %w (make image-web builds it)", l.image, err)
	}
	defer c.remove(ctx, cr.GetSandbox().GetId())
	s, err := dialEndpoint(ctx, cr.GetEndpoint())
	if err != nil {
		return nil, err
	}
	defer s.Close()
	if _, err := s.WaitReady(ctx); err != nil {
		return nil, err
	}
	native, err := s.Screenshot(ctx, aci.PNG())
	if err != nil {
		return nil, err
	}
	l.screenSize = image.Pt(int(native.GetWidth()), int(native.GetHeight()))

	// verdicts[cell index] collects each source's scored elements.
	verdicts := make([][]scoredElement, len(cells))
	var rows []result.Row

	browser, err := l.browserElements(ctx, s)
	if err != nil {
		return nil, err
	}
	env.Progressf("legibility: browser page open, %d elements from the a11y tree", len(browser))
	r, err := l.judge(ctx, env, s, "browser", browser, unionBox(browser).Inset(-16), cells, verdicts)
	if err != nil {
		return nil, err
	}
	rows = append(rows, r...)

	for _, px := range l.termSizes {
		els, box, stop, err := l.terminal(ctx, s, px)
		if err != nil {
			return nil, err
		}
		r, err := l.judge(ctx, env, s, "terminal-"+itoa(px)+"px", els, box, cells, verdicts)
		stop()
		if err != nil {
			return nil, err
		}
		rows = append(rows, r...)
	}

	var safe []string
	for i, ce := range cells {
		v := judgeCell(verdicts[i], l.minPx)
		lbl := labels("codec", ce.codec, "edge", ce.edge)
		ts := 0.0
		if v.TextSafe {
			ts = 1
			safe = append(safe, ce.codec+"@"+ce.edge)
		}
		rows = append(rows, share("legibility.text_safe", lbl, ts),
			share("legibility.read_share", labels("codec", ce.codec, "edge", ce.edge, "source", "all"), float64(v.Read)/float64(v.Elements)),
			share("legibility.located_share", labels("codec", ce.codec, "edge", ce.edge, "source", "all"), float64(v.Located)/float64(v.Elements)))
		if !v.TextSafe && len(v.Missed) > 0 {
			env.Progressf("legibility %s@%s: missed %d, e.g. %s", ce.codec, ce.edge, len(v.Missed), v.Missed[0])
		}
	}
	env.Notef("text-safe cells (every element of %d px or more read within one edit per ten characters and its token located): %s",
		l.minPx, strings.Join(safe, ", "))
	// The clients' default observation is a native PNG (aci.PNG, the Python
	// env's act.png()).
	def := "not text-safe"
	for _, n := range safe {
		if n == "png@native" {
			def = "text-safe"
		}
	}
	env.Notef("the clients' default observation (PNG, native) is %s", def)
	return rows, nil
}

func share(metric string, lbl map[string]string, v float64) result.Row {
	r := result.Single(metric, "share", lbl, v)
	r.Better = result.BetterHigher
	return r
}

// browserElements opens the page and takes each scripted line's text and
// bounds from the a11y tree.
func (l *legibilitySuite) browserElements(ctx context.Context, s *aci.Session) ([]legElement, error) {
	if err := s.PutFile(ctx, "/tmp/legibility.html", legibilityPage); err != nil {
		return nil, err
	}
	if _, err := s.Step(ctx, []*aciv1.Action{aci.Key("ctrl", "l"), aci.Wait(300 * time.Millisecond),
		aci.Type("file:///tmp/legibility.html"), aci.Key("Return")}, nil); err != nil {
		return nil, err
	}
	if err := waitTitle(ctx, s, func(t string) bool { return strings.HasPrefix(t, "legibility bench ready") }); err != nil {
		return nil, err
	}
	script := legibilityLine.FindAllSubmatch(legibilityPage, -1)
	deadline := time.Now().Add(30 * time.Second)
	for {
		tree, err := s.A11yTree(ctx, &aciv1.A11YTreeRequest{TimeoutMs: 30_000, AppTimeoutMs: 30_000})
		if err != nil {
			return nil, err
		}
		var els []legElement
		for _, m := range script {
			px, _ := strconv.Atoi(string(m[1]))
			want := normText(string(m[2]))
			for _, n := range tree.GetNodes() {
				txt := n.GetText()
				if txt == "" {
					txt = n.GetName()
				}
				b := n.GetBounds()
				if normText(txt) != want || b.GetWidth() <= 0 || b.GetHeight() <= 0 {
					continue
				}
				f := strings.Fields(txt)
				els = append(els, legElement{Source: "browser", SizePx: px, Text: txt, Token: f[len(f)-1],
					Box: image.Rect(int(b.GetX()), int(b.GetY()), int(b.GetX()+b.GetWidth()), int(b.GetY()+b.GetHeight()))})
				break
			}
		}
		if len(els) == len(script) {
			return els, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the a11y tree has %d of the page's %d lines after 30 s", len(els), len(script))
		}
		time.Sleep(300 * time.Millisecond)
	}
}

var legibilityWords = []string{"cargo", "build", "release", "kernel", "socket", "deploy", "branch", "commit",
	"mirror", "target", "config", "lambda", "vertex", "shadow", "pillow", "rocket"}

// terminal opens an xterm at px pixels printing four scripted lines; the
// ground truth is the script, each line's box the window. The cursor is
// hidden: tesseract reads its block as part of the word above it.
func (l *legibilitySuite) terminal(ctx context.Context, s *aci.Session, px int) ([]legElement, image.Rectangle, func(), error) {
	title := "legibility-term-" + itoa(px)
	var els []legElement
	argv := []string{"/usr/bin/xterm", "-T", title, "-geometry", "64x6+40+40", "-bg", "white", "-fg", "black",
		"-fa", fmt.Sprintf("DejaVu Sans Mono:pixelsize=%d", px), "-e", "sh", "-c", `printf '%s\n' "$@"; printf '\033[?25l'; exec sleep 600`, "sh"}
	for i := 0; i < 4; i++ {
		tok := fmt.Sprintf("t%dq%d", px, 7*i+3)
		line := fmt.Sprintf("%s %s %s %dpx %s", legibilityWords[(px+3*i)%16], legibilityWords[(px+3*i+5)%16], legibilityWords[(px+3*i+11)%16], px, tok)
		els = append(els, legElement{Source: "terminal", SizePx: px, Text: line, Token: tok})
		argv = append(argv, line)
	}
	pid, err := s.Launch(ctx, &aciv1.LaunchRequest{Argv: argv})
	if err != nil {
		return nil, image.Rectangle{}, nil, fmt.Errorf("xterm: %w", err)
	}
	stop := func() {
		_, _ = s.Exec(context.WithoutCancel(ctx), &aciv1.ExecRequest{Argv: []string{"kill", itoa(pid)}, TimeoutMs: 5000})
		time.Sleep(300 * time.Millisecond)
	}
	if err := waitTitle(ctx, s, func(t string) bool { return t == title }); err != nil {
		stop()
		return nil, image.Rectangle{}, nil, fmt.Errorf("xterm %d px: %w", px, err)
	}
	ws, err := s.ListWindows(ctx)
	if err != nil {
		stop()
		return nil, image.Rectangle{}, nil, err
	}
	var box image.Rectangle
	for _, w := range ws {
		if g := w.GetGeometry(); w.GetTitle() == title {
			box = image.Rect(int(g.GetX()), int(g.GetY()), int(g.GetX()+g.GetWidth()), int(g.GetY()+g.GetHeight()))
		}
	}
	if box.Empty() {
		stop()
		return nil, image.Rectangle{}, nil, fmt.Errorf("xterm %d px: no window geometry", px)
	}
	for i := range els {
		els[i].Box = box
	}
	return els, box, stop, nil
}

// judge takes every cell's screenshot, OCRs the region, scores the elements
// and returns the source's rows; verdicts[i] gains cell i's scored elements.
func (l *legibilitySuite) judge(ctx context.Context, env *suiteapi.Env, s *aci.Session, source string, els []legElement, region image.Rectangle,
	cells []legCell, verdicts [][]scoredElement) ([]result.Row, error) {
	region = region.Intersect(image.Rectangle{Max: l.screenSize})
	// A terminal is one uniform block of text (page segmentation mode 6);
	// the page's lines of mixed sizes need tesseract's layout analysis (3).
	psm := "3"
	if strings.HasPrefix(source, "terminal") {
		psm = "6"
	}
	// Let the new text settle before the first cell.
	if _, err := s.Screenshot(ctx, &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE, SettleMs: 300}); err != nil {
		return nil, err
	}
	var rows []result.Row
	for i, ce := range cells {
		shot, err := s.Screenshot(ctx, ce.req)
		if err != nil {
			return nil, err
		}
		lines, scale, origin, err := l.ocr(ctx, env, shot, region, psm)
		if err != nil {
			return nil, fmt.Errorf("%s %s@%s: %w", source, ce.codec, ce.edge, err)
		}
		scored := scoreElements(els, lines, scale, origin, 6)
		verdicts[i] = append(verdicts[i], scored...)
		v := judgeCell(scored, 0)
		lbl := labels("codec", ce.codec, "edge", ce.edge, "source", source)
		rows = append(rows, share("legibility.read_share", lbl, float64(v.Read)/float64(v.Elements)),
			share("legibility.located_share", lbl, float64(v.Located)/float64(v.Elements)))
		env.Progressf("legibility %s %s@%s: read %d/%d, located %d/%d", source, ce.codec, ce.edge, v.Read, v.Elements, v.Located, v.Elements)
	}
	return rows, nil
}

// ocr decodes the cell's image, crops the screen region (scaled to the
// image), zooms it and runs tesseract; it returns the lines and the mapping
// from OCR pixels to screen pixels (screen = px/scale + origin).
func (l *legibilitySuite) ocr(ctx context.Context, env *suiteapi.Env, shot *aciv1.ScreenshotResponse, region image.Rectangle, psm string) ([]ocrLine, float64, image.Point, error) {
	var img image.Image
	var err error
	switch {
	case isPNG(shot.GetData()):
		img, err = png.Decode(bytes.NewReader(shot.GetData()))
	case isJPEG(shot.GetData()):
		img, err = jpeg.Decode(bytes.NewReader(shot.GetData()))
	default:
		err = errors.New("neither PNG nor JPEG")
	}
	if err != nil {
		return nil, 0, image.Point{}, fmt.Errorf("decode: %w", err)
	}
	k := float64(img.Bounds().Dx()) / float64(l.screenSize.X)
	crop := image.Rect(int(float64(region.Min.X)*k), int(float64(region.Min.Y)*k),
		int(float64(region.Max.X)*k+0.999), int(float64(region.Max.Y)*k+0.999)).Intersect(img.Bounds())
	sub, ok := img.(interface {
		SubImage(image.Rectangle) image.Image
	})
	if !ok || crop.Empty() {
		return nil, 0, image.Point{}, fmt.Errorf("cannot crop %v from %v", crop, img.Bounds())
	}
	// A white margin: tesseract drops words touching the image's edge.
	const margin = 24
	zoomed := withMargin(upscale(sub.SubImage(crop), l.upscaleBy), margin)
	path := filepath.Join(env.WorkDir, "legibility-ocr.png")
	f, err := os.Create(path)
	if err != nil {
		return nil, 0, image.Point{}, err
	}
	if err := png.Encode(f, zoomed); err != nil {
		f.Close()
		return nil, 0, image.Point{}, err
	}
	if err := f.Close(); err != nil {
		return nil, 0, image.Point{}, err
	}
	cmd := exec.CommandContext(ctx, l.tesseract, path, "stdout", "--psm", psm, "tsv")
	// One thread: the machine's cores are the benchmark's.
	cmd.Env = append(os.Environ(), "OMP_THREAD_LIMIT=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, 0, image.Point{}, fmt.Errorf("tesseract: %w: %s", err, stderr.Bytes())
	}
	lines, err := parseTesseractTSV(out)
	if err != nil {
		return nil, 0, image.Point{}, err
	}
	for i := range lines {
		lines[i].shift(image.Pt(-margin, -margin))
	}
	origin := image.Pt(int(float64(crop.Min.X)/k), int(float64(crop.Min.Y)/k))
	return lines, k * float64(l.upscaleBy), origin, nil
}

func unionBox(els []legElement) image.Rectangle {
	var r image.Rectangle
	for _, e := range els {
		r = r.Union(e.Box)
	}
	return r
}
