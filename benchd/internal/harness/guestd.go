//go:build linux

package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
)

// Guestd is a guestd serving the ACI over loopback TCP for a host desktop.
type Guestd struct {
	Proc *Proc
	Addr string // host:port
}

// URL is the ACI WebSocket URL.
func (g *Guestd) URL() string { return "ws://" + g.Addr + aci.DefaultUnixPath }

// Stop ends guestd.
func (g *Guestd) Stop() { g.Proc.Stop() }

// BuildGuestd compiles guestd from the monorepo into dir and returns the
// binary path.
func BuildGuestd(ctx context.Context, repoRoot, dir string) (string, error) {
	if repoRoot == "" {
		return "", errors.New("no monorepo found to build guestd from; pass --guestd")
	}
	out := filepath.Join(dir, "guestd")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/guestd")
	cmd.Dir = filepath.Join(repoRoot, "guestd")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build guestd: %w: %s", err, msg)
	}
	return out, nil
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// StartGuestd runs bin on dt's display without supervision or auth, on a free
// loopback port, and waits until an ACI session reports the desktop ready.
func StartGuestd(ctx context.Context, dt *Desktop, bin string, logTo io.Writer) (*Guestd, error) {
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("guestd binary: %w", err)
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.Command(bin, "--display", dt.Name(), "--no-supervise", "--insecure-no-auth", "--listen-tcp", addr)
	cmd.Env = dt.Env()
	p, err := startProc("guestd", cmd, logTo)
	if err != nil {
		return nil, err
	}
	g := &Guestd{Proc: p, Addr: addr}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if exited, werr := p.Exited(); exited {
			return nil, fmt.Errorf("guestd exited during start: %v", werr)
		}
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		s, err := aci.Dial(dctx, g.URL(), "", aci.WithClientName("benchd-probe"))
		if err == nil {
			_, err = s.WaitReady(dctx)
			s.Close()
		}
		cancel()
		if err == nil {
			return g, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			g.Stop()
			return nil, fmt.Errorf("guestd at %s not ready within 20s: %w", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
