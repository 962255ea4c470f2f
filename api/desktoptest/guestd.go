//go:build linux

package desktoptest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
)

// BuildGuestd compiles guestd from the monorepo at repoRoot into dir and
// returns the binary's path.
func BuildGuestd(ctx context.Context, repoRoot, dir string) (string, error) {
	if repoRoot == "" {
		return "", fmt.Errorf("build guestd: %w", errNoRepo)
	}
	out := filepath.Join(dir, "guestd")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/guestd")
	cmd.Dir = filepath.Join(repoRoot, "guestd")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build guestd: %w: %s", err, msg)
	}
	return out, nil
}

// A test process builds guestd once, into buildDir.
var (
	buildOnce sync.Once
	buildDir  string
	buildBin  string
	buildErr  error
)

// GuestdBinary returns guestd built once per test process from the
// monorepo holding the working directory; it fails tb when that does not
// build. RemoveBuilds, from TestMain, removes the binary.
func GuestdBinary(tb TB) string {
	tb.Helper()
	buildOnce.Do(func() {
		wd, err := os.Getwd()
		if err != nil {
			buildErr = err
			return
		}
		if buildDir, err = os.MkdirTemp("", "forkfleet-guestd-"); err != nil {
			buildErr = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		buildBin, buildErr = BuildGuestd(ctx, RepoRoot(wd), buildDir)
	})
	if buildErr != nil {
		tb.Fatalf("%v", buildErr)
	}
	return buildBin
}

// RemoveBuilds removes what GuestdBinary built.
func RemoveBuilds() {
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
}

// Guestd is a guestd serving the ACI over loopback TCP for a host display.
type Guestd struct {
	*Proc
	Addr string // host:port
}

// URL is the ACI WebSocket URL.
func (g *Guestd) URL() string { return "ws://" + g.Addr + aci.DefaultUnixPath }

// GuestdOptions say how to run guestd.
type GuestdOptions struct {
	// Env is guestd's environment (os.Environ() when nil).
	Env []string
	// Args are added to its command line.
	Args []string
	// Log receives its output; nil keeps it for the error of a failed
	// start.
	Log io.Writer
	// Repaint, when set, is called while guestd sees a window manager but
	// an unpainted root: a window manager may clear the root as it starts,
	// after the caller painted it.
	Repaint func()
}

// StartGuestd runs bin on display without supervision or auth, on a free
// loopback port, and returns once an ACI session reports the desktop
// ready (within 20 s).
func StartGuestd(ctx context.Context, display, bin string, o GuestdOptions) (*Guestd, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("guestd binary: %w", err)
	}
	dir, err := os.MkdirTemp("", "forkfleet-guestd-addr-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	addrFile := filepath.Join(dir, "addr")
	cmd := exec.Command(bin, append([]string{"--display", display, "--no-supervise", "--insecure-no-auth",
		"--listen-tcp", "127.0.0.1:0", "--addr-file", addrFile}, o.Args...)...)
	cmd.Env = o.Env
	var out lockedBuffer
	logTo := o.Log
	if logTo == nil {
		logTo = &out
	}
	p, err := StartProc("guestd", cmd, logTo)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Guestd, error) {
		p.Stop()
		return nil, fmt.Errorf("%w%s", err, out.tail())
	}
	deadline := time.Now().Add(20 * time.Second)
	var g *Guestd
	for g == nil {
		if exited, werr := p.Exited(); exited {
			return fail(fmt.Errorf("guestd exited during start: %v", werr))
		}
		if b, err := os.ReadFile(addrFile); err == nil && len(bytes.TrimSpace(b)) > 0 {
			g = &Guestd{Proc: p, Addr: strings.TrimSpace(string(b))}
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fail(fmt.Errorf("guestd did not write its address within 20s"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	var last error
	for {
		last = g.probe(ctx, o.Repaint)
		if last == nil {
			return g, nil
		}
		if exited, werr := p.Exited(); exited {
			return fail(fmt.Errorf("guestd exited during start: %v", werr))
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fail(fmt.Errorf("guestd at %s not ready within 20s: %w", g.Addr, last))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// probe asks guestd once whether the desktop is ready, repainting the root
// when guestd sees it unpainted under a window manager.
func (g *Guestd) probe(ctx context.Context, repaint func()) error {
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s, err := aci.Dial(dctx, g.URL(), "", aci.WithClientName("desktoptest-probe"))
	if err != nil {
		return err
	}
	defer s.Close()
	r, err := s.Ready(dctx)
	if err != nil {
		return err
	}
	if r.GetReady() {
		return nil
	}
	if repaint != nil && r.GetWmUp() && !r.GetRootPainted() {
		repaint()
	}
	return fmt.Errorf("desktop not ready: %v", r)
}
