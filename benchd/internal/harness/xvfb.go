//go:build linux

// Package harness is the host-side desktop benchd measures against:
// desktoptest's Xvfb and guestd, with openbox and deterministic content
// scenes on that display.
package harness

import (
	"context"
	"io"
	"log"
	"os"
	"os/exec"
	"sync"

	"github.com/jezek/xgb"

	"github.com/forkfleet/forkfleet/api/desktoptest"
)

func init() {
	// xgb logs every connection without an Xauthority; Xvfb runs with -ac.
	xgb.Logger = log.New(io.Discard, "", 0)
}

// Screen geometry of every benchmark desktop.
const (
	Width  = 1280
	Height = 800
	Depth  = 24
)

// Desktop is a display with a window manager and scene processes.
type Desktop struct {
	*desktoptest.Xvfb
	mu    sync.Mutex
	procs []*desktoptest.Proc
	log   io.Writer
	scene *sceneState
}

// StartDesktop starts Xvfb (desktoptest's, without access control: xgb
// connects without an Xauthority) and openbox.
func StartDesktop(ctx context.Context, logTo io.Writer) (*Desktop, error) {
	d, err := desktoptest.StartXvfb(ctx, desktoptest.XvfbOptions{Width: Width, Height: Height, Args: []string{"-ac"}, Log: logTo})
	if err != nil {
		return nil, err
	}
	dt := &Desktop{Xvfb: d, log: logTo}
	if _, err := dt.Spawn("openbox", "openbox"); err != nil {
		dt.Stop()
		return nil, err
	}
	if err := waitWM(ctx, d.Name()); err != nil {
		dt.Stop()
		return nil, err
	}
	// A painted root, as guestd's own supervised desktop has: its readiness
	// waits for a non-black root.
	if err := dt.run(ctx, "xsetroot", "-solid", RootColor); err != nil {
		dt.Stop()
		return nil, err
	}
	return dt, nil
}

// Spawn starts a program on the desktop's display; it is stopped with the
// desktop.
func (dt *Desktop) Spawn(name string, argv ...string) (*desktoptest.Proc, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "DISPLAY="+dt.Name())
	p, err := desktoptest.StartProc(name, cmd, dt.log)
	if err != nil {
		return nil, err
	}
	dt.mu.Lock()
	dt.procs = append(dt.procs, p)
	dt.mu.Unlock()
	return p, nil
}

// Env returns os.Environ with DISPLAY pointing at the desktop.
func (dt *Desktop) Env() []string { return append(os.Environ(), "DISPLAY="+dt.Name()) }

// Stop ends every process of the desktop, then Xvfb.
func (dt *Desktop) Stop() {
	dt.clearScene()
	dt.mu.Lock()
	procs := dt.procs
	dt.procs = nil
	dt.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Stop()
	}
	dt.Xvfb.Stop()
}
