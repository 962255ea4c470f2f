//go:build linux

package suites

import (
	"context"
	"io"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/benchd/internal/harness"
	"github.com/forkfleet/forkfleet/benchd/internal/peers"
	"github.com/forkfleet/forkfleet/benchd/internal/rfb"
)

func integration(t *testing.T) {
	t.Helper()
	if os.Getenv("FORKFLEET_INTEGRATION") != "1" {
		t.Skip("set FORKFLEET_INTEGRATION=1 to run against a real Xvfb")
	}
}

// TestScenesAndX11vncRFB paints every scene on a real Xvfb and reads full
// frames from x11vnc with each encoding through the RFB client.
func TestScenesAndX11vncRFB(t *testing.T) {
	integration(t)
	for _, bin := range []string{"Xvfb", "openbox", "xterm"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s not installed: the integration test cannot run", bin)
		}
	}
	peer, _ := peers.Lookup("x11vnc")
	x11vnc, err := peer.Path()
	if err != nil {
		t.Fatalf("%v: the integration test cannot run (make peers installs it)", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dt, err := harness.StartDesktop(ctx, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer dt.Stop()
	for _, sc := range harness.Scenes {
		if err := dt.SetScene(ctx, sc, t.TempDir()); err != nil {
			t.Fatal(err)
		}
	}
	p, addr, err := startX11vnc(ctx, dt, x11vnc)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	for _, enc := range [][]int32{{rfb.EncZRLE}, {rfb.EncTight}, {rfb.EncRaw}} {
		c, err := rfb.Dial(addr, 10*time.Second, enc...)
		if err != nil {
			t.Fatal(err)
		}
		if c.Width != harness.Width || c.Height != harness.Height {
			t.Fatalf("geometry %dx%d", c.Width, c.Height)
		}
		if err := c.Request(false); err != nil {
			t.Fatal(err)
		}
		u, err := c.ReadUpdate(time.Now().Add(30 * time.Second))
		c.Close()
		if err != nil {
			t.Fatalf("encoding %v: %v", enc, err)
		}
		if u.Pixels < int64(harness.Width*harness.Height) || u.Bytes < 1000 {
			t.Fatalf("encoding %v: full update covers %d px in %d bytes", enc, u.Pixels, u.Bytes)
		}
		t.Logf("encoding %v: photo full frame %d bytes in %d rects", enc, u.Bytes, u.Rects)
	}
}
