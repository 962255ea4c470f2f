//go:build linux

package suites

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/desktoptest"
	"github.com/forkfleet/forkfleet/benchd/internal/harness"
	"github.com/forkfleet/forkfleet/benchd/internal/suiteapi"
)

// hostGuest is the host-side system under test: Xvfb + openbox + guestd,
// with one counted ACI session.
type hostGuest struct {
	Desktop *harness.Desktop
	Guestd  *desktoptest.Guestd
	Session *aci.Session
	Wire    *wireCounter
}

// wireCounter counts bytes crossing the session's TCP connection in both
// directions: the honest "bytes per op".
type wireCounter struct{ rx, tx atomic.Int64 }

func (w *wireCounter) Total() int64 { return w.rx.Load() + w.tx.Load() }

type countedConn struct {
	net.Conn
	w *wireCounter
}

func (c countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.w.rx.Add(int64(n))
	return n, err
}

func (c countedConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.w.tx.Add(int64(n))
	return n, err
}

// guestdBinary returns --guestd or builds guestd from the monorepo.
func guestdBinary(ctx context.Context, env *suiteapi.Env) (string, error) {
	bin := env.GuestdBin
	if bin == "" {
		env.Progressf("building guestd from %s/guestd", env.RepoRoot)
		var err error
		if bin, err = desktoptest.BuildGuestd(ctx, env.RepoRoot, env.WorkDir); err != nil {
			return "", err
		}
	}
	// The guestd measured is part of the evidence.
	if sum, err := fileSHA256(bin); err == nil {
		env.Notef("guestd under test: %s (sha256 %s)", bin, sum)
	}
	return bin, nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// checkHostGuest is the prerequisite check of every host-desktop suite.
func checkHostGuest(env *suiteapi.Env) error {
	for _, bin := range []string{"Xvfb", "openbox", "xterm", "xsetroot"} {
		if _, err := lookPath(bin); err != nil {
			return suiteapi.Skipf("%s not installed", bin)
		}
	}
	if env.GuestdBin == "" && env.RepoRoot == "" {
		return suiteapi.Skipf("no --guestd given and no monorepo to build it from")
	}
	if env.GuestdBin != "" {
		if _, err := os.Stat(env.GuestdBin); err != nil {
			return suiteapi.Skipf("--guestd: %v", err)
		}
	}
	return nil
}

// startHostGuest brings up the desktop and guestd and dials one session
// through a byte-counting dialer.
func startHostGuest(ctx context.Context, env *suiteapi.Env) (*hostGuest, error) {
	bin, err := guestdBinary(ctx, env)
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(env.WorkDir + "/desktop.log")
	if err != nil {
		return nil, err
	}
	dt, err := harness.StartDesktop(ctx, logf)
	if err != nil {
		return nil, err
	}
	g, err := desktoptest.StartGuestd(ctx, dt.Name(), bin, desktoptest.GuestdOptions{Env: dt.Env(), Log: logf})
	if err != nil {
		dt.Stop()
		return nil, err
	}
	hg := &hostGuest{Desktop: dt, Guestd: g, Wire: &wireCounter{}}
	hg.Session, err = hg.Dial(ctx, hg.Wire)
	if err != nil {
		hg.Stop()
		return nil, err
	}
	env.Progressf("desktop %s up, guestd %s (pid %d)", dt.Name(), g.Addr, g.Proc.Pid())
	return hg, nil
}

// Dial opens another session to guestd; w counts its wire bytes when set.
func (hg *hostGuest) Dial(ctx context.Context, w *wireCounter, opts ...aci.DialOption) (*aci.Session, error) {
	d := &net.Dialer{Timeout: 10 * time.Second}
	opts = append(opts, aci.WithClientName("benchd"))
	if w != nil {
		opts = append(opts, aci.WithDialer(func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetNoDelay(true)
			}
			return countedConn{Conn: c, w: w}, nil
		}))
	}
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	s, err := aci.Dial(dctx, hg.Guestd.URL(), "", opts...)
	if err != nil {
		return nil, fmt.Errorf("dial guestd: %w", err)
	}
	return s, nil
}

// Stop tears everything down.
func (hg *hostGuest) Stop() {
	if hg.Session != nil {
		hg.Session.Close()
	}
	hg.Guestd.Stop()
	hg.Desktop.Stop()
}
