//go:build linux

package x11

import (
	"context"
	"image"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jezek/xgb/xproto"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

func TestClipboard(t *testing.T) {
	x := startX(t)
	d1 := openDesktop(t, x)
	d2 := openDesktop(t, x)
	ctx := context.Background()

	if s, err := d1.ClipboardGet(ctx); err != nil || s != "" {
		t.Fatalf("empty clipboard: %q %v", s, err)
	}
	text := "héllo ✓ clipboard\nline two"
	if err := d1.ClipboardSet(text); err != nil {
		t.Fatal(err)
	}
	if s, err := d1.ClipboardGet(ctx); err != nil || s != text {
		t.Fatalf("own clipboard: %q %v", s, err)
	}
	// d2 converts the selection from d1, which serves it from its event loop.
	if s, err := d2.ClipboardGet(ctx); err != nil || s != text {
		t.Fatalf("converted clipboard: %q %v", s, err)
	}
	// Taking ownership elsewhere clears d1's copy; d1 then converts.
	big := strings.Repeat("0123456789abcdef", 10000) // 160 KB
	if err := d2.ClipboardSet(big); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Second, "d1 to lose the selection", func() bool {
		d1.clip.mu.Lock()
		defer d1.clip.mu.Unlock()
		return !d1.clip.owned
	})
	if s, err := d1.ClipboardGet(ctx); err != nil || s != big {
		t.Fatalf("large converted clipboard: %d bytes %v", len(s), err)
	}
	if err := d1.ClipboardSet(strings.Repeat("x", maxClipboardSet+1)); !isErr(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("oversized set: %v", err)
	}
	if err := d1.ClipboardSet("\xff"); !isErr(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("invalid UTF-8: %v", err)
	}

	// An owner that never answers makes Get time out.
	c := newClient(t, x)
	w := c.window(winOpts{w: 1, h: 1, override: true})
	xproto.SetSelectionOwner(c.conn, w, c.atom("CLIPBOARD"), xproto.TimeCurrentTime)
	c.sync()
	tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := d1.ClipboardGet(tctx); !isErr(err, errdefs.ErrDeadlineExceeded) {
		t.Fatalf("silent owner: %v, want ErrTimeout", err)
	}
}

func TestWatchDamage(t *testing.T) {
	x := startX(t)
	d := openDesktop(t, x)
	c := newClient(t, x)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Two watchers; one drained, one left blocked to check that a slow
	// receiver neither stalls the other nor the event loop.
	fast := make(chan image.Rectangle, 16)
	slow := make(chan image.Rectangle)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, ch := range []chan image.Rectangle{fast, slow} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- d.WatchDamage(ctx, ch)
		}()
	}
	waitFor(t, 2*time.Second, "watchers to register", func() bool {
		d.dmg.mu.Lock()
		defer d.dmg.mu.Unlock()
		return len(d.dmg.watchers) == 2
	})
	time.Sleep(20 * time.Millisecond) // let the first-watcher re-arm happen

	drawn := image.Rect(100, 100, 150, 130)
	expect := func(ch chan image.Rectangle, want image.Rectangle) {
		t.Helper()
		deadline := time.After(3 * time.Second)
		for {
			select {
			case r := <-ch:
				if r.Overlaps(want) {
					return
				}
			case <-deadline:
				t.Fatalf("no damage over %v", want)
			}
		}
	}
	for i := 0; i < 50; i++ {
		c.fill(xproto.Drawable(c.root), uint32(0x010101*i), xproto.Rectangle{X: 100, Y: 100, Width: 50, Height: 30})
	}
	expect(fast, drawn)

	// The event loop is still responsive with a blocked watcher.
	if _, _, err := d.CursorPosition(); err != nil {
		t.Fatal(err)
	}
	second := image.Rect(900, 600, 910, 700)
	c.fill(xproto.Drawable(c.root), 0xabcdef, xproto.Rectangle{X: 900, Y: 600, Width: 10, Height: 100})
	expect(fast, second)
	// The slow watcher kept everything, coalesced as needed.
	expect(slow, drawn)

	// A client window drawing is reported in root coordinates.
	win := c.window(winOpts{x: 500, y: 400, w: 100, h: 100, override: true})
	for len(fast) > 0 {
		<-fast
	}
	c.fill(xproto.Drawable(win), 0xff00ff, xproto.Rectangle{X: 10, Y: 10, Width: 5, Height: 5})
	expect(fast, image.Rect(510, 410, 515, 415))

	cancel()
	wg.Wait()
	for i := 0; i < 2; i++ {
		if err := <-errs; err != context.Canceled {
			t.Fatalf("WatchDamage returned %v", err)
		}
	}
}

func BenchmarkDamageLatency(b *testing.B) {
	x := startX(b)
	d := openDesktop(b, x)
	c := newClient(b, x)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch := make(chan image.Rectangle, 64)
	go d.WatchDamage(ctx, ch)
	time.Sleep(50 * time.Millisecond)
	gc, _ := xproto.NewGcontextId(c.conn)
	xproto.CreateGC(c.conn, gc, xproto.Drawable(c.root), xproto.GcForeground, []uint32{0x123456})
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		xproto.PolyFillRectangle(c.conn, xproto.Drawable(c.root), gc, []xproto.Rectangle{{X: int16(i % 1000), Y: 10, Width: 4, Height: 4}})
		<-ch
		for len(ch) > 0 {
			<-ch
		}
	}
}
