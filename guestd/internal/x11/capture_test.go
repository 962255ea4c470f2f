//go:build linux

package x11

import (
	"context"
	"image"
	"os"
	"testing"
	"time"
	"unsafe"

	"github.com/jezek/xgb/xproto"
	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
)

type colorRect struct {
	r   image.Rectangle
	rgb uint32
}

// paintScene fills the root with known rectangles and returns the model.
func paintScene(c *client) []colorRect {
	scene := []colorRect{
		{image.Rect(0, 0, screenW, screenH), 0x203040},
		{image.Rect(10, 20, 310, 220), 0xff0000},
		{image.Rect(300, 200, 700, 500), 0x00ff00},
		{image.Rect(650, 0, 1280, 37), 0x0000ff},
		{image.Rect(1279, 799, 1280, 800), 0xfedcba},
		{image.Rect(0, 799, 1, 800), 0x010203},
		{image.Rect(501, 601, 502, 602), 0xffffff},
	}
	for _, s := range scene {
		c.fill(xproto.Drawable(c.root), s.rgb, xproto.Rectangle{
			X: int16(s.r.Min.X), Y: int16(s.r.Min.Y), Width: uint16(s.r.Dx()), Height: uint16(s.r.Dy()),
		})
	}
	return scene
}

func expectedAt(scene []colorRect, p image.Point) uint32 {
	var rgb uint32
	for _, s := range scene {
		if p.In(s.r) {
			rgb = s.rgb
		}
	}
	return rgb
}

func checkFrame(t *testing.T, f *desktop.Frame, r image.Rectangle, scene []colorRect) {
	t.Helper()
	if f.Rect != r || f.Stride != r.Dx()*4 || len(f.Pix) != r.Dx()*r.Dy()*4 {
		t.Fatalf("frame rect %v stride %d len %d, want %v", f.Rect, f.Stride, len(f.Pix), r)
	}
	bad := 0
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			o := (y-r.Min.Y)*f.Stride + (x-r.Min.X)*4
			got := uint32(f.Pix[o+2])<<16 | uint32(f.Pix[o+1])<<8 | uint32(f.Pix[o])
			if want := expectedAt(scene, image.Pt(x, y)); got != want {
				if bad++; bad < 5 {
					t.Errorf("pixel (%d,%d) = %06x want %06x", x, y, got, want)
				}
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d pixels differ", bad)
	}
}

func TestCapturePixelExact(t *testing.T) {
	x := startX(t)
	d := openDesktop(t, x)
	c := newClient(t, x)
	scene := paintScene(c)

	if on, why := d.SHMEnabled(); !on {
		t.Fatalf("MIT-SHM not in use on a local Xvfb: %v", why)
	}
	regions := []image.Rectangle{
		image.Rect(0, 0, screenW, screenH),
		image.Rect(295, 195, 705, 505),
		image.Rect(1279, 799, 1280, 800),
		image.Rect(0, 790, 40, 800),
		image.Rect(600, 0, 1280, 50),
	}
	var f desktop.Frame
	for _, r := range regions {
		if err := d.Capture(r, &f); err != nil {
			t.Fatalf("shm capture %v: %v", r, err)
		}
		checkFrame(t, &f, r, scene)
	}

	// Buffer reuse: a smaller capture into the same frame keeps the array.
	full := make([]byte, 0, screenW*screenH*4)
	f = desktop.Frame{Pix: full}
	if err := d.Capture(image.Rect(0, 0, screenW, screenH), &f); err != nil {
		t.Fatal(err)
	}
	if err := d.Capture(image.Rect(5, 5, 50, 50), &f); err != nil {
		t.Fatal(err)
	}
	if &f.Pix[0] != &full[:1][0] {
		t.Error("frame buffer reallocated")
	}

	// The plain GetImage fallback gives the same pixels.
	for _, r := range regions {
		var g desktop.Frame
		d.cap.mu.Lock()
		pix, err := d.getImageView(r)
		if err == nil {
			setFrame(&g, r, pix)
		}
		d.cap.mu.Unlock()
		if err != nil {
			t.Fatalf("GetImage capture %v: %v", r, err)
		}
		checkFrame(t, &g, r, scene)
	}

	for _, r := range []image.Rectangle{{}, image.Rect(-1, 0, 10, 10), image.Rect(0, 0, screenW+1, 10)} {
		if err := d.Capture(r, &f); !isErr(err, errdefs.ErrInvalidArgument) {
			t.Errorf("capture %v: %v, want ErrInvalid", r, err)
		}
	}
}

func TestReadyNoWM(t *testing.T) {
	x := startX(t)
	d := openDesktop(t, x)
	c := newClient(t, x)
	c.fill(xproto.Drawable(c.root), 0, xproto.Rectangle{Width: screenW, Height: screenH})
	st, err := d.Ready(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !st.XUp || st.WMUp || st.RootPainted {
		t.Fatalf("black root, no WM: %+v", st)
	}
	c.fill(xproto.Drawable(c.root), 0x336699, xproto.Rectangle{Width: screenW, Height: screenH})
	if st, err = d.Ready(context.Background()); err != nil || !st.RootPainted || !st.XUp {
		t.Fatalf("painted root: %+v %v", st, err)
	}
	if w, h := d.ScreenSize(); w != screenW || h != screenH {
		t.Fatalf("screen %dx%d", w, h)
	}
}

func TestCursorImage(t *testing.T) {
	x := startX(t)
	d := openDesktop(t, x)
	if err := d.MoveTo(123, 456); err != nil {
		t.Fatal(err)
	}
	cur, err := d.CursorImage()
	if err != nil {
		t.Fatal(err)
	}
	if cur.X != 123 || cur.Y != 456 {
		t.Errorf("cursor at %d,%d", cur.X, cur.Y)
	}
	if cur.Width <= 0 || cur.Height <= 0 || len(cur.ARGB) != cur.Width*cur.Height {
		t.Errorf("sprite %dx%d with %d pixels", cur.Width, cur.Height, len(cur.ARGB))
	}
}

func TestConnectionLoss(t *testing.T) {
	x := startX(t)
	d := openDesktop(t, x)
	x.stop()
	select {
	case <-d.Done():
	case <-timeAfter(10):
		t.Fatal("Done not closed after the server died")
	}
	var f desktop.Frame
	checks := map[string]error{
		"MoveTo":   d.MoveTo(1, 1),
		"KeyDown":  d.KeyDown("a"),
		"TypeText": d.TypeText("x"),
		"Capture":  d.Capture(image.Rect(0, 0, 10, 10), &f),
	}
	_, checks["ListWindows"] = d.ListWindows()
	_, checks["CursorImage"] = d.CursorImage()
	_, _, checks["CursorPosition"] = d.CursorPosition()
	_, checks["ClipboardGet"] = d.ClipboardGet(context.Background())
	checks["ClipboardSet"] = d.ClipboardSet("x")
	checks["WatchDamage"] = d.WatchDamage(context.Background(), make(chan image.Rectangle))
	for name, err := range checks {
		if !isErr(err, errdefs.ErrUnavailable) {
			t.Errorf("%s after server death: %v, want ErrUnavailable", name, err)
		}
	}
	if st, err := d.Ready(context.Background()); err != nil || st.XUp {
		t.Errorf("Ready after server death: %+v %v", st, err)
	}
}

func BenchmarkCaptureSHM(b *testing.B) {
	x := startX(b)
	d := openDesktop(b, x)
	var f desktop.Frame
	r := image.Rect(0, 0, screenW, screenH)
	b.SetBytes(screenW * screenH * 4)
	for i := 0; i < b.N; i++ {
		if err := d.Capture(r, &f); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCaptureSHMAfterRelease is a full-screen capture whose segment
// was given back first (an idle sandbox's next screenshot): the cost of
// faulting the pages back in, against BenchmarkCaptureSHM.
func BenchmarkCaptureSHMAfterRelease(b *testing.B) {
	x := startX(b)
	d := openDesktop(b, x)
	var f desktop.Frame
	r := image.Rect(0, 0, screenW, screenH)
	b.SetBytes(screenW * screenH * 4)
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		d.ReleaseScratch(0)
		b.StartTimer()
		if err := d.Capture(r, &f); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCaptureSHMNoCopy is the server side alone, for the copy-out
// cost (BenchmarkCaptureSHM minus this).
func BenchmarkCaptureSHMNoCopy(b *testing.B) {
	x := startX(b)
	d := openDesktop(b, x)
	r := image.Rect(0, 0, screenW, screenH)
	for i := 0; i < b.N; i++ {
		d.cap.mu.Lock()
		_, err := shmGetImageOnly(d, r)
		d.cap.mu.Unlock()
		if err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCaptureSHMRegion(b *testing.B) {
	x := startX(b)
	d := openDesktop(b, x)
	var f desktop.Frame
	r := image.Rect(100, 100, 356, 164)
	for i := 0; i < b.N; i++ {
		if err := d.Capture(r, &f); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCaptureGetImage(b *testing.B) {
	x := startX(b)
	d := openDesktop(b, x)
	var f desktop.Frame
	r := image.Rect(0, 0, screenW, screenH)
	for i := 0; i < b.N; i++ {
		pix, err := d.getImageView(r)
		if err != nil {
			b.Fatal(err)
		}
		setFrame(&f, r, pix)
	}
}

func BenchmarkReady(b *testing.B) {
	x := startX(b)
	d := openDesktop(b, x)
	for i := 0; i < b.N; i++ {
		if _, err := d.Ready(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

// TestReleaseScratchIdle checks that an idle release gives back only a
// segment no capture used for the idle period: its pages leave memory
// (mincore), a capture brings them back, and a second release finds nothing
// left to give.
func TestReleaseScratchIdle(t *testing.T) {
	x := startX(t)
	d := openDesktop(t, x)
	full := image.Rect(0, 0, screenW, screenH)
	var f desktop.Frame
	if err := d.Capture(full, &f); err != nil {
		t.Fatal(err)
	}
	if got := residentPages(t, d.cap.shmBuf); got == 0 {
		t.Fatal("no page of the capture segment is resident after a capture")
	}
	if n := d.ReleaseScratch(time.Hour); n != 0 {
		t.Fatalf("released %d bytes of a segment used just now, want 0", n)
	}
	const idle = 20 * time.Millisecond
	time.Sleep(idle)
	if n := d.ReleaseScratch(idle); n < screenW*screenH*4 {
		t.Fatalf("released %d bytes after %s idle, want the capture segment (%d)", n, idle, screenW*screenH*4)
	}
	if got := residentPages(t, d.cap.shmBuf); got != 0 {
		t.Fatalf("%d pages of the released segment still resident", got)
	}
	time.Sleep(idle)
	if n := d.ReleaseScratch(idle); n != 0 {
		t.Fatalf("released %d bytes again with no capture since, want 0", n)
	}
	c := newClient(t, x)
	scene := paintScene(c)
	if err := d.Capture(full, &f); err != nil {
		t.Fatal(err)
	}
	checkFrame(t, &f, full, scene)
	if got := residentPages(t, d.cap.shmBuf); got == 0 {
		t.Fatal("the capture after a release left no page resident")
	}
}

// residentPages counts the pages of b in memory.
func residentPages(t *testing.T, b []byte) int {
	t.Helper()
	vec := make([]byte, (len(b)+os.Getpagesize()-1)/os.Getpagesize())
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatalf("mincore: %v", e)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// TestReleaseScratch checks that captures after the segments' pages were
// given back are still exact.
func TestReleaseScratch(t *testing.T) {
	x := startX(t)
	d := openDesktop(t, x)
	c := newClient(t, x)
	scene := paintScene(c)
	full := image.Rect(0, 0, screenW, screenH)
	var f desktop.Frame
	if err := d.Capture(full, &f); err != nil {
		t.Fatal(err)
	}
	if n := d.ReleaseScratch(0); n < screenW*screenH*4 {
		t.Fatalf("released %d bytes, want at least the capture segment (%d)", n, screenW*screenH*4)
	}
	for _, r := range []image.Rectangle{full, image.Rect(295, 195, 705, 505)} {
		if err := d.Capture(r, &f); err != nil {
			t.Fatalf("capture %v after release: %v", r, err)
		}
		checkFrame(t, &f, r, scene)
	}
}
