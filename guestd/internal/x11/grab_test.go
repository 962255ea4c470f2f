//go:build linux

package x11

import (
	"testing"
	"time"
)

// TestGrabServer checks that while the desktop holds the server grab no
// other client is served (an app's drawing waits), and that it is served
// again after the release.
func TestGrabServer(t *testing.T) {
	needXvfb(t)
	x := startX(t)
	d := openDesktop(t, x)
	c := newClient(t, x)
	if err := d.GrabServer(); err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		c.sync() // a round trip: answered only once the grab is gone
		close(served)
	}()
	select {
	case <-served:
		t.Fatal("another client was served during the grab")
	case <-time.After(300 * time.Millisecond):
	}
	if err := d.UngrabServer(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("the other client was not served after the release")
	}
}
