//go:build linux

package supervise

import (
	"errors"
	"fmt"
	"math/bits"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jezek/xgb"
	"github.com/jezek/xgb/xproto"
	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/guestd/internal/config"
	"github.com/forkfleet/forkfleet/guestd/internal/sysops"
)

// XvfbSpec builds the Xvfb program: the configured display and screen,
// -noreset (the server must not reset when the last client leaves: guestd's
// own connection may come and go), and -displayfd 3 so the supervisor learns
// the moment the server accepts connections, with no polling or sleeps.
func XvfbSpec(cfg *config.Config, onUp func()) Spec {
	args := []string{cfg.Display,
		"-screen", "0", fmt.Sprintf("%dx%dx%d", cfg.Screen.Width, cfg.Screen.Height, cfg.Screen.Depth),
		"-noreset", "-displayfd", "3"}
	args = append(args, cfg.Xvfb.Args...)
	name := cfg.Xvfb.Name
	if name == "" {
		name = "xvfb"
	}
	return Spec{
		Name: name, Path: cfg.Xvfb.Path, Args: args, Env: cfg.Xvfb.Env, Restart: config.RestartAlways,
		NotifyFD: true,
		OnNotify: func(string) { onUp() },
	}
}

// CleanStaleXLock removes the lock file and socket a dead X server left for
// display (after a crash, or in an image built from a running container), so
// the new Xvfb does not refuse to start. A lock held by a live process is
// left alone.
func CleanStaleXLock(display string) error {
	n := strings.SplitN(strings.TrimPrefix(display, ":"), ".", 2)[0]
	if _, err := strconv.Atoi(n); err != nil {
		return fmt.Errorf("display %q: not :N", display)
	}
	if err := os.MkdirAll("/tmp/.X11-unix", 0o1777); err != nil {
		return err
	}
	_ = os.Chmod("/tmp/.X11-unix", 0o1777|os.ModeSticky)
	lock := "/tmp/.X" + n + "-lock"
	b, err := os.ReadFile(lock)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil && pid > 0 {
		if unix.Kill(pid, 0) == nil || unix.Kill(pid, 0) == unix.EPERM {
			return fmt.Errorf("display %s is held by live pid %d", display, pid)
		}
	}
	os.Remove(lock)
	os.Remove(filepath.Join("/tmp/.X11-unix", "X"+n))
	return nil
}

// PaintRoot sets the root window background to color (0xRRGGBB) and clears
// it, through the X protocol so no xsetroot process is needed. The
// background is a window attribute, so it persists after this connection
// closes.
func PaintRoot(display string, color uint32) error {
	c, err := xgb.NewConnDisplay(display)
	if err != nil {
		return fmt.Errorf("paint root: connect %s: %w", display, err)
	}
	defer c.Close()
	scr := xproto.Setup(c).DefaultScreen(c)
	pixel := color
	for _, d := range scr.AllowedDepths {
		for _, v := range d.Visuals {
			if v.VisualId == scr.RootVisual {
				pixel = toPixel(color, v.RedMask, v.GreenMask, v.BlueMask)
			}
		}
	}
	if err := xproto.ChangeWindowAttributesChecked(c, scr.Root, xproto.CwBackPixel, []uint32{pixel}).Check(); err != nil {
		return fmt.Errorf("paint root: %w", err)
	}
	if err := xproto.ClearAreaChecked(c, false, scr.Root, 0, 0, 0, 0).Check(); err != nil {
		return fmt.Errorf("paint root: %w", err)
	}
	return nil
}

// toPixel scales 8-bit RGB into a TrueColor visual's channel masks.
func toPixel(rgb, rm, gm, bm uint32) uint32 {
	if rm == 0 || gm == 0 || bm == 0 {
		return rgb
	}
	ch := func(v uint32, mask uint32) uint32 {
		shift := bits.TrailingZeros32(mask)
		width := bits.OnesCount32(mask)
		return ((v * ((1 << width) - 1) / 255) << shift) & mask
	}
	return ch(rgb>>16&0xff, rm) | ch(rgb>>8&0xff, gm) | ch(rgb&0xff, bm)
}

// TerminateAll, as the top of its sandbox, sends SIGTERM to every other
// process, waits until they are gone or grace passes, then SIGKILLs the
// rest. It returns at once anywhere else (see KillAll).
func TerminateAll(grace time.Duration) {
	if !KillAll(unix.SIGTERM) {
		return
	}
	deadline := time.Now().Add(grace)
	for othersAlive() {
		if time.Now().After(deadline) {
			KillAll(unix.SIGKILL)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// othersAlive reports whether /proc shows a process besides this one (and
// the init above it) that is not a zombie (the reaper collects those).
func othersAlive() bool {
	for _, pid := range pids() {
		if st := procState(pid); !sysops.GuestdOrInit(pid) && st != 0 && st != 'Z' {
			return true
		}
	}
	return false
}

// KillAll sends sig to every process but itself (kill(-1)) when guestd is
// PID 1 of its PID namespace: at shutdown that reaches the orphans nobody
// supervises. Anywhere else it does nothing, since kill(-1) on a host would
// hit every process of the user.
func KillAll(sig unix.Signal) bool {
	if !sysops.SandboxInit() {
		return false
	}
	_ = unix.Kill(-1, sig) // never the init: kill(-1) spares PID 1 of its namespace
	return true
}
