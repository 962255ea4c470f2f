//go:build linux

package suites

import (
	"bytes"
	"errors"
	"fmt"
	"image"
	"image/color"
	"strconv"
	"strings"
	"unicode"
)

// The legibility suite's pure parts: tesseract's TSV, edit distance, and
// scoring one codec cell's OCR against the ground truth.

// legElement is one piece of scripted text: its ground-truth text, the
// token an agent would look for, its size and its box on the screen.
type legElement struct {
	Source string // "browser" or "terminal"
	SizePx int
	Text   string
	Token  string
	Box    image.Rectangle // screen coordinates
}

// ocrLine is one line tesseract read: its words and their union box, in the
// coordinates of the image tesseract was given.
type ocrLine struct {
	Words []ocrWord
	Box   image.Rectangle
}

type ocrWord struct {
	Text string
	Box  image.Rectangle
}

func (l ocrLine) text() string {
	ws := make([]string, len(l.Words))
	for i, w := range l.Words {
		ws[i] = w.Text
	}
	return strings.Join(ws, " ")
}

// parseTesseractTSV groups tesseract's word rows (level 5) into lines by
// (block, paragraph, line).
func parseTesseractTSV(b []byte) ([]ocrLine, error) {
	rows := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(rows) == 0 || !bytes.HasPrefix(rows[0], []byte("level\t")) {
		return nil, errors.New("tesseract tsv: no header")
	}
	var lines []ocrLine
	var last string
	for _, r := range rows[1:] {
		f := strings.Split(string(r), "\t")
		if len(f) != 12 {
			return nil, fmt.Errorf("tesseract tsv: %d fields in %q", len(f), r)
		}
		if f[0] != "5" || strings.TrimSpace(f[11]) == "" {
			continue
		}
		var n [4]int
		for i := range n {
			v, err := strconv.Atoi(f[6+i])
			if err != nil {
				return nil, fmt.Errorf("tesseract tsv: %q: %w", r, err)
			}
			n[i] = v
		}
		w := ocrWord{Text: f[11], Box: image.Rect(n[0], n[1], n[0]+n[2], n[1]+n[3])}
		key := f[2] + "/" + f[3] + "/" + f[4]
		if key != last || len(lines) == 0 {
			lines = append(lines, ocrLine{Box: w.Box})
			last = key
		}
		l := &lines[len(lines)-1]
		l.Words = append(l.Words, w)
		l.Box = l.Box.Union(w.Box)
	}
	return lines, nil
}

// editDistance is the Levenshtein distance between a and b in runes.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev, cur := make([]int, len(rb)+1), make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			c := prev[j-1]
			if ra[i-1] != rb[j-1] {
				c++
			}
			cur[j] = min(c, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}

// normText lowercases and collapses whitespace: case and spacing are not
// what an agent fails to read.
func normText(s string) string { return strings.Join(strings.Fields(strings.ToLower(s)), " ") }

// readWithin is the edit distance an element may be read with: one edit per
// ten characters, at least one.
func readWithin(truth string) int { return max(1, len([]rune(truth))/10) }

// scoredElement is one element's verdict in one cell.
type scoredElement struct {
	legElement
	Read    bool // some OCR line in its box within readWithin of its text
	Located bool // its token is a word OCR found inside its box
	Best    string
}

// scoreElements judges each element against the lines OCR read from an
// image whose pixel (x, y) shows the screen at (x/scale+origin): a line
// belongs to an element when its center falls in the element's box grown by
// pad screen pixels.
func scoreElements(els []legElement, lines []ocrLine, scale float64, origin image.Point, pad int) []scoredElement {
	toScreen := func(r image.Rectangle) image.Point {
		c := r.Min.Add(r.Max).Div(2)
		return image.Pt(int(float64(c.X)/scale)+origin.X, int(float64(c.Y)/scale)+origin.Y)
	}
	out := make([]scoredElement, len(els))
	for i, el := range els {
		se := scoredElement{legElement: el}
		box, truth, best := el.Box.Inset(-pad), normText(el.Text), -1
		for _, l := range lines {
			if !toScreen(l.Box).In(box) {
				continue
			}
			if d := editDistance(normText(l.text()), truth); best < 0 || d < best {
				best, se.Best = d, l.text()
			}
			for _, w := range l.Words {
				if strings.EqualFold(strings.TrimFunc(w.Text, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) }), el.Token) &&
					toScreen(w.Box).In(box) {
					se.Located = true
				}
			}
		}
		se.Read = best >= 0 && best <= readWithin(truth)
		out[i] = se
	}
	return out
}

// cellVerdict sums a cell's elements: shares read and located, and whether
// the cell is text-safe (every element of at least minPx read and located).
type cellVerdict struct {
	Elements, Read, Located int
	TextSafe                bool
	Missed                  []string
}

func judgeCell(scored []scoredElement, minPx int) cellVerdict {
	v := cellVerdict{Elements: len(scored), TextSafe: len(scored) > 0}
	for _, s := range scored {
		if s.Read {
			v.Read++
		}
		if s.Located {
			v.Located++
		}
		if s.SizePx >= minPx && !(s.Read && s.Located) {
			v.TextSafe = false
			v.Missed = append(v.Missed, fmt.Sprintf("%s %dpx %q read as %q", s.Source, s.SizePx, s.Text, s.Best))
		}
	}
	return v
}

// upscale enlarges img by an integer factor with bilinear interpolation, as
// gray: tesseract reads text best at ~30 px cap height, and the judge reads
// what the agent was sent at a zoom of its own.
func upscale(img image.Image, f int) *image.Gray {
	b := img.Bounds()
	w, h := b.Dx(), b.Dy()
	src := make([]float64, w*h)
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			src[y*w+x] = float64(color.GrayModel.Convert(img.At(b.Min.X+x, b.Min.Y+y)).(color.Gray).Y)
		}
	}
	out := image.NewGray(image.Rect(0, 0, w*f, h*f))
	at := func(x, y int) float64 { return src[min(max(y, 0), h-1)*w+min(max(x, 0), w-1)] }
	for y := 0; y < h*f; y++ {
		sy := (float64(y)+0.5)/float64(f) - 0.5
		y0 := int(sy)
		if sy < 0 {
			y0 = -1
		}
		fy := sy - float64(y0)
		for x := 0; x < w*f; x++ {
			sx := (float64(x)+0.5)/float64(f) - 0.5
			x0 := int(sx)
			if sx < 0 {
				x0 = -1
			}
			fx := sx - float64(x0)
			v := (at(x0, y0)*(1-fx)+at(x0+1, y0)*fx)*(1-fy) + (at(x0, y0+1)*(1-fx)+at(x0+1, y0+1)*fx)*fy
			out.Pix[y*out.Stride+x] = uint8(v + 0.5)
		}
	}
	return out
}

func (l *ocrLine) shift(d image.Point) {
	l.Box = l.Box.Add(d)
	for i := range l.Words {
		l.Words[i].Box = l.Words[i].Box.Add(d)
	}
}

// withMargin pads img with m white pixels on every side.
func withMargin(img *image.Gray, m int) *image.Gray {
	b := img.Bounds()
	out := image.NewGray(image.Rect(0, 0, b.Dx()+2*m, b.Dy()+2*m))
	for i := range out.Pix {
		out.Pix[i] = 0xff
	}
	for y := 0; y < b.Dy(); y++ {
		copy(out.Pix[(y+m)*out.Stride+m:], img.Pix[y*img.Stride:y*img.Stride+b.Dx()])
	}
	return out
}
