//go:build linux

package harness

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"

	"github.com/forkfleet/forkfleet/api/desktoptest"
)

// Scene is a content type the observation suites measure on.
type Scene string

const (
	// SceneSparse is one 80x24 xterm on a flat background (~15% coverage).
	SceneSparse Scene = "sparse"
	// SceneDense is a near-fullscreen xterm of ANSI-colored text.
	SceneDense Scene = "dense"
	// ScenePhoto is a procedurally generated photographic frame on the root.
	ScenePhoto Scene = "photo"
)

// Scenes lists every scene in report order.
var Scenes = []Scene{SceneSparse, SceneDense, ScenePhoto}

// RootColor matches guestd's default desktop background.
const RootColor = "#2f3b4c"

type sceneState struct {
	procs []*desktoptest.Proc
	conn  *xgb.Conn // keeps the photo pixmap alive
}

func (dt *Desktop) clearScene() {
	dt.mu.Lock()
	s := dt.scene
	dt.scene = nil
	dt.mu.Unlock()
	if s == nil {
		return
	}
	for _, p := range s.procs {
		p.Stop()
	}
	if s.conn != nil {
		s.conn.Close()
	}
}

// SetScene replaces the desktop's content with scene and waits until it has
// painted and settled. workDir holds the scene's generated files.
func (dt *Desktop) SetScene(ctx context.Context, scene Scene, workDir string) error {
	dt.clearScene()
	st := &sceneState{}
	start := func(name string, argv ...string) error {
		p, err := dt.Spawn(name, argv...)
		if err != nil {
			return err
		}
		st.procs = append(st.procs, p)
		return nil
	}
	minColors := 2
	switch scene {
	case SceneSparse, SceneDense:
		if err := dt.run(ctx, "xsetroot", "-solid", RootColor); err != nil {
			return err
		}
		if err := dt.paintRootColor(); err != nil {
			return err
		}
		if scene == SceneSparse {
			if err := start("xterm", "xterm", "-fn", "fixed", "+sb", "-geometry", "80x24+40+40"); err != nil {
				return err
			}
			minColors = 3
		} else {
			path := filepath.Join(workDir, "dense.txt")
			if err := os.WriteFile(path, []byte(DenseText(200, 60)), 0o644); err != nil {
				return err
			}
			if err := start("xterm", "xterm", "-fn", "fixed", "+sb", "-bg", "black", "-fg", "grey85",
				"-geometry", "208x58+0+0", "-e", "sh", "-c", "cat "+shellQuote(path)+"; exec sleep 2147483647"); err != nil {
				return err
			}
			minColors = 6
		}
	case ScenePhoto:
		c, err := paintRootImage(dt.Name(), PhotoImage(Width, Height, 20261130))
		if err != nil {
			return fmt.Errorf("paint photo scene: %w", err)
		}
		st.conn = c
		minColors = 100
	default:
		return fmt.Errorf("unknown scene %q", scene)
	}
	dt.mu.Lock()
	dt.scene = st
	dt.mu.Unlock()
	if err := waitPainted(ctx, dt.Name(), minColors, 15*time.Second); err != nil {
		return fmt.Errorf("scene %s: %w", scene, err)
	}
	return nil
}

// paintRootColor clears any root pixmap a previous photo scene left.
func (dt *Desktop) paintRootColor() error {
	c, err := xgb.NewConnDisplay(dt.Name())
	if err != nil {
		return err
	}
	defer c.Close()
	root := xproto.Setup(c).DefaultScreen(c).Root
	return xproto.ClearAreaChecked(c, true, root, 0, 0, 0, 0).Check()
}

func (dt *Desktop) run(ctx context.Context, argv ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := execCommand(ctx, argv...)
	cmd.Env = dt.Env()
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// DenseText is deterministic ANSI-colored filler: rows lines of up to cols
// characters of pseudo-words in eight foreground colors.
func DenseText(cols, rows int) string {
	words := []string{"fork", "fleet", "sandbox", "checkpoint", "replica", "observe", "pixel", "guestd", "controld",
		"latency", "frame", "encode", "xterm", "desktop", "agent", "step", "cursor", "window", "tile", "hash"}
	var b strings.Builder
	seed := uint32(2463534242)
	next := func() uint32 { seed ^= seed << 13; seed ^= seed >> 17; seed ^= seed << 5; return seed }
	for r := 0; r < rows; r++ {
		n := 0
		for n < cols-12 {
			w := words[next()%uint32(len(words))]
			fmt.Fprintf(&b, "\x1b[%dm%s\x1b[0m ", 31+next()%7, w)
			n += len(w) + 1
			if next()%5 == 0 {
				num := fmt.Sprintf("%d", next()%100000)
				b.WriteString(num + " ")
				n += len(num) + 1
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// PhotoImage is a deterministic photographic-looking frame in BGRX (the X
// server's 24-bit ZPixmap order): multi-octave value noise, broad gradients
// and sensor-like grain, so codecs see natural-image statistics without a
// binary asset in the repository.
func PhotoImage(w, h int, seed uint32) []byte {
	hash := func(x, y int32, o uint32) float64 {
		v := uint32(x)*374761393 + uint32(y)*668265263 + o*2246822519 + seed
		v = (v ^ (v >> 13)) * 1274126177
		v ^= v >> 16
		return float64(v&0xffff) / 65535
	}
	noise := func(fx, fy float64, o uint32) float64 {
		x0, y0 := math.Floor(fx), math.Floor(fy)
		tx, ty := fx-x0, fy-y0
		tx, ty = tx*tx*(3-2*tx), ty*ty*(3-2*ty)
		ix, iy := int32(x0), int32(y0)
		a := hash(ix, iy, o) + tx*(hash(ix+1, iy, o)-hash(ix, iy, o))
		b := hash(ix, iy+1, o) + tx*(hash(ix+1, iy+1, o)-hash(ix, iy+1, o))
		return a + ty*(b-a)
	}
	out := make([]byte, w*h*4)
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			var ch [3]float64
			for c := 0; c < 3; c++ {
				v, amp, freq := 0.0, 0.5, 1.0/160
				for o := 0; o < 5; o++ {
					v += amp * noise(float64(x)*freq, float64(y)*freq, uint32(c*8+o))
					amp *= 0.5
					freq *= 2
				}
				grad := 0.35 * float64(y) / float64(h)
				if c == 2 {
					grad = 0.35 * (1 - float64(y)/float64(h))
				}
				grain := (hash(int32(x), int32(y), uint32(100+c)) - 0.5) * 0.08
				ch[c] = math.Max(0, math.Min(1, v*0.8+grad+grain))
			}
			i := (y*w + x) * 4
			out[i], out[i+1], out[i+2] = byte(ch[2]*255), byte(ch[1]*255), byte(ch[0]*255)
		}
	}
	return out
}

// paintRootImage sets bgrx as the root window's background pixmap. The
// returned connection owns the pixmap: closing it ends the scene.
func paintRootImage(display string, bgrx []byte) (*xgb.Conn, error) {
	c, err := xgb.NewConnDisplay(display)
	if err != nil {
		return nil, err
	}
	scr := xproto.Setup(c).DefaultScreen(c)
	if scr.RootDepth != Depth {
		c.Close()
		return nil, fmt.Errorf("root depth %d, want %d", scr.RootDepth, Depth)
	}
	pix, err := xproto.NewPixmapId(c)
	if err != nil {
		c.Close()
		return nil, err
	}
	gc, err := xproto.NewGcontextId(c)
	if err != nil {
		c.Close()
		return nil, err
	}
	if err := xproto.CreatePixmapChecked(c, Depth, pix, xproto.Drawable(scr.Root), Width, Height).Check(); err != nil {
		c.Close()
		return nil, err
	}
	if err := xproto.CreateGCChecked(c, gc, xproto.Drawable(pix), 0, nil).Check(); err != nil {
		c.Close()
		return nil, err
	}
	// The core protocol caps a request at 256 KiB without BIG-REQUESTS:
	// send the image in strips that fit.
	const rowsPerStrip = 40
	for y := 0; y < Height; y += rowsPerStrip {
		n := min(rowsPerStrip, Height-y)
		data := bgrx[y*Width*4 : (y+n)*Width*4]
		if err := xproto.PutImageChecked(c, xproto.ImageFormatZPixmap, xproto.Drawable(pix), gc, Width, uint16(n), 0, int16(y), 0, Depth, data).Check(); err != nil {
			c.Close()
			return nil, fmt.Errorf("PutImage: %w", err)
		}
	}
	if err := xproto.ChangeWindowAttributesChecked(c, scr.Root, xproto.CwBackPixmap, []uint32{uint32(pix)}).Check(); err != nil {
		c.Close()
		return nil, err
	}
	if err := xproto.ClearAreaChecked(c, true, scr.Root, 0, 0, 0, 0).Check(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
