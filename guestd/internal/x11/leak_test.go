//go:build linux

package x11

import (
	"context"
	"image"
	"runtime"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
)

// TestCloseReleases checks that Open/Close cycles (guestd's reconnect
// loop) leave no goroutines behind, including a watcher ended by Close.
func TestCloseReleases(t *testing.T) {
	x := startX(t)
	// Warm up once so lazily started runtime goroutines are not counted.
	d0, err := Open(context.Background(), x.display)
	if err != nil {
		t.Fatal(err)
	}
	d0.Close()
	time.Sleep(50 * time.Millisecond)
	before := runtime.NumGoroutine()
	for i := 0; i < 5; i++ {
		d, err := Open(context.Background(), x.display)
		if err != nil {
			t.Fatal(err)
		}
		var f desktop.Frame
		if err := d.Capture(image.Rect(0, 0, 64, 64), &f); err != nil {
			t.Fatal(err)
		}
		if err := d.TypeText("é"); err != nil { // arms the restore timer
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() { errc <- d.WatchDamage(context.Background(), make(chan image.Rectangle)) }()
		d.Close()
		if err := <-errc; !isErr(err, errdefs.ErrUnavailable) {
			t.Fatalf("watcher after Close: %v", err)
		}
		if err := d.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
	}
	waitFor(t, 5*time.Second, "goroutines to exit", func() bool {
		return runtime.NumGoroutine() <= before
	})
}

func TestOpenNoServer(t *testing.T) {
	_, err := Open(context.Background(), ":199")
	if !isErr(err, errdefs.ErrUnavailable) {
		t.Fatalf("Open of a display without server: %v, want ErrUnavailable", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Open(ctx, ":199"); err == nil {
		t.Fatal("Open with a cancelled context succeeded")
	}
}
