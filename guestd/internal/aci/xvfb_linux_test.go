//go:build linux

package aci

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/png"
	"log/slog"
	"math/rand/v2"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"

	aciclient "github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/desktoptest"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/encode"
	"github.com/forkfleet/forkfleet/guestd/internal/x11"
)

// These tests run the ACI server on a real x11.Desktop over a private Xvfb.
// They need FORKFLEET_INTEGRATION=1 and fail when it is set but Xvfb is
// missing.

const realW, realH = 1280, 800

func needRealX(tb testing.TB) { tb.Helper(); desktoptest.NeedXvfb(tb, true) }

// startXvfb starts a private Xvfb and returns its display name.
func startXvfb(tb testing.TB) string {
	tb.Helper()
	needRealX(tb)
	return desktoptest.NewXvfb(tb, desktoptest.XvfbOptions{Width: realW, Height: realH}).Name()
}

// realServer is an ACI server on a real desktop with one client session.
type realServer struct {
	desk *x11.Desktop
	srv  *Server
	c    *aciclient.WireConn
}

func newRealServer(tb testing.TB, display string) *realServer {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := x11.Open(ctx, display)
	if err != nil {
		tb.Fatal(err)
	}
	srv, err := New(Options{InsecureNoAuth: true, MaxMessageBytes: 1 << 20, EntropySink: os.DevNull, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		tb.Fatal(err)
	}
	srv.SetDesktop(d)
	hs := httptest.NewUnstartedServer(srv)
	hs.Config.ConnContext = WithRawConn
	hs.Start()
	c, _, err := aciclient.DialWire(ctx, "ws"+strings.TrimPrefix(hs.URL, "http"), "")
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := c.Hello(ctx, "codec.png", "dedup"); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		c.Conn.CloseNow()
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		srv.Shutdown(sctx)
		hs.Close()
		d.Close()
	})
	return &realServer{desk: d, srv: srv, c: c}
}

func (rs *realServer) shot(tb testing.TB, req *aciv1.ScreenshotRequest) *aciv1.ScreenshotResponse {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := rs.c.Call(ctx, shot(req))
	if err != nil {
		tb.Fatal(err)
	}
	if r.GetScreenshot() == nil {
		tb.Fatalf("screenshot: %v", r)
	}
	return r.GetScreenshot()
}

// painter is a second X client that draws on the screen and reads it back
// with core GetImage, independent of the desktop under test.
type painter struct {
	tb   testing.TB
	conn *xgb.Conn
	root xproto.Window
	vis  xproto.Visualid
	gc   xproto.Gcontext
}

func newPainter(tb testing.TB, display string) *painter {
	tb.Helper()
	conn, err := xgb.NewConnDisplay(display)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(conn.Close)
	go func() {
		for {
			if ev, err := conn.WaitForEvent(); ev == nil && err == nil {
				return
			}
		}
	}()
	scr := xproto.Setup(conn).DefaultScreen(conn)
	p := &painter{tb: tb, conn: conn, root: scr.Root, vis: scr.RootVisual}
	if p.gc, err = xproto.NewGcontextId(conn); err != nil {
		tb.Fatal(err)
	}
	if err := xproto.CreateGCChecked(conn, p.gc, xproto.Drawable(p.root), xproto.GcSubwindowMode, []uint32{xproto.SubwindowModeClipByChildren}).Check(); err != nil {
		tb.Fatal(err)
	}
	return p
}

func (p *painter) sync() {
	p.tb.Helper()
	if _, err := xproto.GetInputFocus(p.conn).Reply(); err != nil {
		p.tb.Fatal(err)
	}
}

func (p *painter) fill(d xproto.Drawable, rgb uint32, r image.Rectangle) {
	xproto.ChangeGC(p.conn, p.gc, xproto.GcForeground, []uint32{rgb})
	xproto.PolyFillRectangle(p.conn, d, p.gc, []xproto.Rectangle{{X: int16(r.Min.X), Y: int16(r.Min.Y), Width: uint16(r.Dx()), Height: uint16(r.Dy())}})
}

func (p *painter) window(r image.Rectangle, bg uint32) xproto.Window {
	p.tb.Helper()
	wid, err := xproto.NewWindowId(p.conn)
	if err != nil {
		p.tb.Fatal(err)
	}
	err = xproto.CreateWindowChecked(p.conn, 0, wid, p.root, int16(r.Min.X), int16(r.Min.Y), uint16(r.Dx()), uint16(r.Dy()), 0,
		xproto.WindowClassInputOutput, p.vis, xproto.CwBackPixel|xproto.CwOverrideRedirect, []uint32{bg, 1}).Check()
	if err != nil {
		p.tb.Fatal(err)
	}
	return wid
}

// truth reads the whole screen as BGRX.
func (p *painter) truth() encode.Image {
	p.tb.Helper()
	rep, err := xproto.GetImage(p.conn, xproto.ImageFormatZPixmap, xproto.Drawable(p.root), 0, 0, realW, realH, 0xffffffff).Reply()
	if err != nil {
		p.tb.Fatal(err)
	}
	return encode.Image{Pix: rep.Data, Stride: realW * 4, Width: realW, Height: realH}
}

func hashOf(tb testing.TB, img encode.Image) []byte {
	tb.Helper()
	h, err := encode.Hash128(img)
	if err != nil {
		tb.Fatal(err)
	}
	return h[:]
}

// TestRealScreenshotNeverStale draws from another X connection and asks
// for a frame right after the draw reached the server, in every request
// shape, and checks each answer against the screen read back independently.
// A cached frame served after a draw would fail it.
func TestRealScreenshotNeverStale(t *testing.T) {
	display := startXvfb(t)
	rs := newRealServer(t, display)
	p := newPainter(t, display)
	rng := rand.New(rand.NewPCG(1, 2))
	rndRect := func(maxW, maxH int) image.Rectangle {
		w, h := 1+rng.IntN(maxW), 1+rng.IntN(maxH)
		x, y := rng.IntN(realW-w), rng.IntN(realH-h)
		return image.Rect(x, y, x+w, y+h)
	}

	win := p.window(image.Rect(300, 200, 500, 350), 0x336699)
	xproto.MapWindow(p.conn, win)
	mapped := true
	p.sync()

	full := &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE}
	last := rs.shot(t, full).GetFrameHash()
	const rounds = 500
	stats := map[string]int{}
	for i := 0; i < rounds; i++ {
		// Mostly small draws, some window operations, some idle rounds.
		color := uint32(rng.IntN(1 << 24))
		op := rng.IntN(10)
		switch {
		case op < 5:
			p.fill(xproto.Drawable(p.root), color, rndRect(6, 6))
		case op == 5:
			p.fill(xproto.Drawable(win), color, image.Rect(rng.IntN(190), rng.IntN(140), 200, 150))
		case op == 6:
			xproto.ConfigureWindow(p.conn, win, xproto.ConfigWindowX|xproto.ConfigWindowY,
				[]uint32{uint32(rng.IntN(realW - 200)), uint32(rng.IntN(realH - 150))})
		case op == 7:
			if mapped {
				xproto.UnmapWindow(p.conn, win)
			} else {
				xproto.MapWindow(p.conn, win)
			}
			mapped = !mapped
		default:
			// Nothing drawn.
		}
		// The draw has reached the server before the screenshot request.
		p.sync()

		kind := rng.IntN(5)
		var req *aciv1.ScreenshotRequest
		switch kind {
		case 0:
			req = &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE, IfNoneMatch: last}
		case 1:
			req = &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG}
		case 2:
			req = &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE, Region: &aciv1.Rect{X: 250, Y: 150, Width: 400, Height: 300}}
		case 3:
			req = &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE, MaxLongEdge: 640}
		case 4:
			req = &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG, IfNoneMatch: last}
		}
		got := rs.shot(t, req)
		truth := p.truth()
		var want []byte
		switch kind {
		case 2:
			want = hashOf(t, truth.SubImage(image.Rect(250, 150, 650, 450)))
		case 3:
			small, err := encode.Downscale(nil, truth, 640)
			if err != nil {
				t.Fatal(err)
			}
			want = hashOf(t, small)
		default:
			want = hashOf(t, truth)
		}
		if !bytes.Equal(got.GetFrameHash(), want) {
			t.Fatalf("round %d (op %d, request %d): frame_hash %x, screen hashes %x: stale frame", i, op, kind, got.GetFrameHash(), want)
		}
		if req.GetIfNoneMatch() != nil {
			if got.GetNotModified() != bytes.Equal(last, want) {
				t.Fatalf("round %d: not_modified=%v but the screen changed=%v", i, got.GetNotModified(), !bytes.Equal(last, want))
			}
			if got.GetNotModified() {
				stats["not_modified"]++
			}
		}
		if req.GetFormat() == aciv1.ImageFormat_IMAGE_FORMAT_PNG && !got.GetNotModified() {
			img, err := png.Decode(bytes.NewReader(got.GetData()))
			if err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
			// Spot-check pixels against the screen (the hash covers all).
			for k := 0; k < 64; k++ {
				x, y := rng.IntN(realW), rng.IntN(realH)
				r, g, b, _ := img.At(x, y).RGBA()
				px := truth.Pix[y*truth.Stride+4*x:]
				if byte(r>>8) != px[2] || byte(g>>8) != px[1] || byte(b>>8) != px[0] {
					t.Fatalf("round %d: PNG pixel (%d,%d) differs from the screen", i, x, y)
				}
			}
			stats["png"]++
		}
		if kind == 0 || kind == 1 || kind == 4 {
			last = want
		}
		stats[fmt.Sprintf("op%d", op)]++
	}
	t.Logf("%d rounds: %v", rounds, stats)
}

// TestRealScreenshotCursorAndCache checks that the cursor overlay is part
// of what the cache compares, and that an idle screen is answered from it.
func TestRealScreenshotCursorAndCache(t *testing.T) {
	display := startXvfb(t)
	rs := newRealServer(t, display)
	p := newPainter(t, display)
	p.fill(xproto.Drawable(p.root), 0x204060, image.Rect(0, 0, realW, realH))
	p.sync()

	withCursor := &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG, IncludeCursor: true}
	if err := rs.desk.MoveTo(100, 100); err != nil {
		t.Fatal(err)
	}
	a := rs.shot(t, withCursor)
	b := rs.shot(t, withCursor)
	if !bytes.Equal(a.GetFrameHash(), b.GetFrameHash()) || !bytes.Equal(a.GetData(), b.GetData()) || b.GetEncodeNs() != 0 {
		t.Fatalf("idle repeat: equal hash %v, equal data %v, encode %d ns", bytes.Equal(a.GetFrameHash(), b.GetFrameHash()), bytes.Equal(a.GetData(), b.GetData()), b.GetEncodeNs())
	}
	if err := rs.desk.MoveTo(400, 300); err != nil {
		t.Fatal(err)
	}
	moved := rs.shot(t, withCursor)
	if bytes.Equal(moved.GetFrameHash(), a.GetFrameHash()) {
		t.Fatal("cursor moved but the frame did not change")
	}
	// Ground truth: the screen with the sprite drawn where the server says.
	truth := p.truth()
	cur, err := rs.desk.CursorImage()
	if err != nil {
		t.Fatal(err)
	}
	if err := encode.CompositeARGB(truth, cur.X-cur.XHot, cur.Y-cur.YHot, cur.ARGB, cur.Width, cur.Height); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(moved.GetFrameHash(), hashOf(t, truth)) {
		t.Fatal("cursor frame differs from the screen with the sprite composited")
	}
	// Without the cursor the frame is the plain screen, cached separately.
	plain := rs.shot(t, &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE})
	if !bytes.Equal(plain.GetFrameHash(), hashOf(t, p.truth())) {
		t.Fatal("plain frame differs from the screen")
	}
}

// TestRealReleaseScratch gives the capture segment back and checks the next
// capture is still exact.
func TestRealReleaseScratch(t *testing.T) {
	display := startXvfb(t)
	rs := newRealServer(t, display)
	p := newPainter(t, display)
	p.fill(xproto.Drawable(p.root), 0x336699, image.Rect(100, 100, 400, 300))
	p.sync()
	before := rs.shot(t, &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := rs.c.Call(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_ReleaseScratch{ReleaseScratch: &aciv1.ReleaseScratchRequest{}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.GetReleaseScratch().GetReleasedBytes(); got < realW*realH*4 {
		t.Fatalf("released %d bytes, want at least the capture segment (%d): %v", got, realW*realH*4, r)
	}
	// Draw, so the answer cannot come from the unchanged-frame cache.
	p.fill(xproto.Drawable(p.root), 0x996633, image.Rect(500, 100, 600, 200))
	p.sync()
	after := rs.shot(t, &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE})
	if want := hashOf(t, p.truth()); !bytes.Equal(after.GetFrameHash(), want) || bytes.Equal(after.GetFrameHash(), before.GetFrameHash()) {
		t.Fatalf("frame after release %x, want %x (screen read back)", after.GetFrameHash(), want)
	}
}

// TestRealBornFrameHashInBands: a replica's born frame, captured through
// the MIT-SHM segment a band of rows at a time, hashes as the whole screen
// read back independently does, whether the band height divides the screen
// or not, and as the one band of the screen's full height; and a replica's
// capture segment is left holding one band's pages, not the screen's.
func TestRealBornFrameHashInBands(t *testing.T) {
	display := startXvfb(t)
	rs := newRealServer(t, display)
	p := newPainter(t, display)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 200; i++ {
		x, y := rng.IntN(realW-40), rng.IntN(realH-40)
		p.fill(xproto.Drawable(p.root), rng.Uint32()&0xffffff, image.Rect(x, y, x+1+rng.IntN(40), y+1+rng.IntN(40)))
	}
	p.sync()
	if on, err := rs.desk.SHMEnabled(); !on {
		t.Fatalf("MIT-SHM is off (%v): the bands would not go through the segment", err)
	}
	want := hashOf(t, p.truth())
	for _, rows := range []int{1, 51, 64, realH} {
		got, err := hashInBands(rs.desk, realW, realH, rows)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("bands of %d rows: %x (%v), want the screen's %x", rows, got, err, want)
		}
	}
	// As in a replica: the segment's pages were given back before the dump.
	rs.desk.ReleaseScratch(0)
	if n := sysvRSS(t); n != 0 {
		t.Fatalf("%d bytes of the capture segment resident after its release", n)
	}
	ctx := context.Background()
	got, err := rs.srv.bornFrameHash(ctx, false)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("bornFrameHash: %x (%v), want the screen's %x", got, err, want)
	}
	if n := sysvRSS(t); n == 0 || n > bornBandBytes {
		t.Fatalf("%d bytes of the capture segment resident after the born frame, want one band (%d at most)", n, bornBandBytes)
	}
	// A pool member's (restored with hold_apps) goes into the screen
	// mirror, which release_scratch keeps; rows drawn after it are read
	// into the kept copy.
	if got, err = rs.srv.bornFrameHash(ctx, true); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("bornFrameHash kept: %x (%v), want the screen's %x", got, err, want)
	}
	rs.srv.releaseScratch()
	p.fill(xproto.Drawable(p.root), 0x996633, image.Rect(500, 100, 600, 200))
	p.sync()
	after := rs.shot(t, &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE})
	if want := hashOf(t, p.truth()); !bytes.Equal(after.GetFrameHash(), want) {
		t.Fatalf("frame after the kept copy's release %x, want %x (screen read back)", after.GetFrameHash(), want)
	}
}

// sysvRSS is the resident size of this process's SysV shared memory
// mappings (the capture segment), from /proc/self/smaps.
func sysvRSS(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	total, in := 0, false
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			in = strings.Contains(line, "SYSV")
			continue
		}
		if kb, ok := strings.CutPrefix(line, "Rss:"); ok && in {
			n, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(kb), "kB")))
			if err != nil {
				t.Fatalf("smaps %q: %v", line, err)
			}
			total += n << 10
		}
	}
	return total
}

// BenchmarkBornFrameHash is a replica's born-frame hash at 1280x800 after its
// capture segment was given back (as every replica's was before the dump):
// in bands, as bornFrameHash captures it, and as one full-screen capture.
func BenchmarkBornFrameHash(b *testing.B) {
	d := newRealServer(b, startXvfb(b)).desk
	for _, c := range []struct {
		name string
		rows int
	}{{"bands", bornBandBytes / (realW * 4)}, {"whole", realH}} {
		b.Run(c.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				d.ReleaseScratch(0)
				b.StartTimer()
				if _, err := hashInBands(d, realW, realH, c.rows); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
