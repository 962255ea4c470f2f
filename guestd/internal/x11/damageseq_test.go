//go:build linux

package x11

import (
	"bytes"
	"context"
	"image"
	"os"
	"sync"
	"testing"

	"github.com/jezek/xgb/xproto"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
)

func TestDamageSeqSync(t *testing.T) {
	x := startX(t)
	d := openDesktop(t, x)
	c := newClient(t, x)
	ctx := context.Background()

	s0, err := d.DamageSeqSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s1, err := d.DamageSeqSync(ctx); err != nil || s1 != s0 {
		t.Fatalf("idle: %d then %d (%v)", s0, s1, err)
	}
	// Every draw that reached the server is counted by the next sync, on
	// the root and in a child window alike.
	win := c.window(winOpts{x: 200, y: 200, w: 50, h: 50, override: true})
	last, _ := d.DamageSeqSync(ctx)
	for i := 0; i < 200; i++ {
		if i%2 == 0 {
			c.fill(xproto.Drawable(c.root), uint32(i), xproto.Rectangle{X: int16(i), Y: 10, Width: 1, Height: 1})
		} else {
			c.fill(xproto.Drawable(win), uint32(i), xproto.Rectangle{X: 1, Y: 1, Width: 2, Height: 2})
		}
		s, err := d.DamageSeqSync(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if s == last {
			t.Fatalf("draw %d not counted", i)
		}
		last = s
	}
	// Concurrent callers each get an answer.
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < 50; k++ {
				if _, err := d.DamageSeqSync(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := d.DamageSeqSync(cctx); err == nil {
		t.Error("canceled context: no error")
	}
	x.stop()
	<-d.Done()
	if _, err := d.DamageSeqSync(ctx); !isErr(err, errdefs.ErrUnavailable) {
		t.Errorf("after server death: %v, want ErrUnavailable", err)
	}
}

func TestCaptureViewMatchesCapture(t *testing.T) {
	x := startX(t)
	d := openDesktop(t, x)
	c := newClient(t, x)
	scene := paintScene(c)
	for _, r := range []image.Rectangle{image.Rect(0, 0, screenW, screenH), image.Rect(13, 7, 300, 211)} {
		var f desktop.Frame
		if err := d.Capture(r, &f); err != nil {
			t.Fatal(err)
		}
		checkFrame(t, &f, r, scene)
		called := false
		err := d.CaptureView(r, func(v *desktop.Frame) error {
			called = true
			if v.Rect != r || v.Stride != 4*r.Dx() || !bytes.Equal(v.Pix, f.Pix) {
				t.Errorf("view of %v differs from the copied capture", r)
			}
			return nil
		})
		if err != nil || !called {
			t.Fatalf("CaptureView %v: %v, called %v", r, err, called)
		}
	}
	if err := d.CaptureView(image.Rect(0, 0, screenW+1, 1), func(*desktop.Frame) error { return nil }); !isErr(err, errdefs.ErrInvalidArgument) {
		t.Errorf("off-screen view: %v", err)
	}
}

func TestCaptureScreenSynced(t *testing.T) {
	x := startX(t)
	d := openDesktop(t, x)
	c := newClient(t, x)
	ctx := context.Background()
	full := image.Rect(0, 0, screenW, screenH)
	win := c.window(winOpts{x: 600, y: 500, w: 80, h: 60, override: true})
	var want desktop.Frame
	for i := 0; i < 60; i++ {
		keptCopy := false
		switch i % 4 {
		case 0:
			c.fill(xproto.Drawable(c.root), uint32(0x030507*i), xproto.Rectangle{X: int16(7 * i), Y: int16(11 * i), Width: 3, Height: 2})
		case 1:
			c.fill(xproto.Drawable(win), uint32(0x0a0b0c*i), xproto.Rectangle{X: 5, Y: 5, Width: 10, Height: 10})
		case 2:
			// A region capture writes into the shared segment, never
			// into the mirror's.
			var f desktop.Frame
			if err := d.Capture(image.Rect(0, 0, 64, 64), &f); err != nil {
				t.Fatal(err)
			}
		case 3:
			// Nothing drawn. Every other time the mirror's pages are
			// given back too, and its next refresh reads everything;
			// in between only its band is (a frozen pool member's
			// release), and the copy it keeps needs no rows read.
			switch i % 8 {
			case 7:
				if n := d.ReleaseScratch(0); n < screenW*screenH*4 {
					t.Fatalf("round %d: released %d bytes, want at least the mirror's copy", i, n)
				}
				if got := residentPages(t, d.cap.mir.buf); got != 0 {
					t.Fatalf("round %d: %d pages of the released mirror still resident", i, got)
				}
			case 3:
				if n := d.ReleaseShared(); n != len(d.cap.shmBuf)+len(d.cap.mir.band) {
					t.Fatalf("round %d: shared release gave back %d bytes, want the segments' and not the copy's", i, n)
				}
				if got := residentPages(t, d.cap.mir.band); got != 0 {
					t.Fatalf("round %d: %d pages of the released band still resident", i, got)
				}
				if got, want := residentPages(t, d.cap.mir.buf), screenW*screenH*4/os.Getpagesize(); got != want {
					t.Fatalf("round %d: %d of the kept copy's %d pages resident", i, got, want)
				}
				keptCopy = true
			}
		}
		if _, err := d.DamageSeqSync(ctx); err != nil {
			t.Fatal(err)
		}
		called := false
		err := d.CaptureScreenSynced(func(f *desktop.Frame) error {
			called = true
			if err := d.Capture(full, &want); err != nil {
				return err
			}
			if f.Rect != full || f.Stride != 4*screenW || !bytes.Equal(f.Pix, want.Pix) {
				t.Fatalf("round %d: mirror differs from the screen", i)
			}
			return nil
		})
		if err != nil || !called {
			t.Fatalf("round %d: %v, called %v", i, err, called)
		}
		if got := residentPages(t, d.cap.mir.band); keptCopy && got != 0 {
			t.Fatalf("round %d: the frame after a shared release read rows through the band (%d pages), want none: nothing was drawn", i, got)
		}
	}
	if err := d.CaptureScreenSynced(nil); !isErr(err, errdefs.ErrInvalidArgument) {
		t.Errorf("nil callback: %v", err)
	}
}

func BenchmarkDamageSeqSync(b *testing.B) {
	x := startX(b)
	d := openDesktop(b, x)
	for i := 0; i < b.N; i++ {
		if _, err := d.DamageSeqSync(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCaptureScreenSynced is a full-screen frame after a small
// repaint: the mirror reads the repainted rows only.
func BenchmarkCaptureScreenSynced(b *testing.B) {
	benchRepaintThenCapture(b, xproto.Rectangle{X: 100, Y: 700, Width: 24, Height: 16})
}

// BenchmarkCaptureScreenSyncedFullRepaint is a full-screen frame after the
// whole screen was repainted: the mirror reads every row.
func BenchmarkCaptureScreenSyncedFullRepaint(b *testing.B) {
	benchRepaintThenCapture(b, xproto.Rectangle{Width: screenW, Height: screenH})
}

// benchRepaintThenCapture times a full-screen mirror frame after each fill
// of area (untimed).
func benchRepaintThenCapture(b *testing.B, area xproto.Rectangle) {
	x := startX(b)
	d := openDesktop(b, x)
	c := newClient(b, x)
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		c.fill(xproto.Drawable(c.root), uint32(i), area)
		b.StartTimer()
		if _, err := d.DamageSeqSync(context.Background()); err != nil {
			b.Fatal(err)
		}
		if err := d.CaptureScreenSynced(func(*desktop.Frame) error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCaptureScreenSyncedAfterRelease is a full-screen frame once the
// mirror's pages were given back (a replica's or a claimed pool member's
// first screenshot, an idle sandbox's next one), read through as the
// frame hash reads it.
func BenchmarkCaptureScreenSyncedAfterRelease(b *testing.B) {
	x := startX(b)
	d := openDesktop(b, x)
	var sum byte
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		d.ReleaseScratch(0)
		b.StartTimer()
		if _, err := d.DamageSeqSync(context.Background()); err != nil {
			b.Fatal(err)
		}
		if err := d.CaptureScreenSynced(func(f *desktop.Frame) error {
			for _, v := range f.Pix {
				sum += v
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	_ = sum
}

func BenchmarkCaptureView(b *testing.B) {
	x := startX(b)
	d := openDesktop(b, x)
	r := image.Rect(0, 0, screenW, screenH)
	for i := 0; i < b.N; i++ {
		if err := d.CaptureView(r, func(*desktop.Frame) error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
}
