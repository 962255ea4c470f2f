//go:build linux

// Package desktoptest runs the host desktop that tests and benchmarks drive
// guestd on outside a sandbox: a private Xvfb on a display it picks itself,
// and guestd built from the monorepo, serving that display without
// supervision. It is the one starter of these for every module (api,
// guestd's own tests, benchd). It does not import testing, so benchd links
// it; the helpers taking a TB are for tests, which pass their testing.TB.
package desktoptest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The screen of a host desktop unless asked otherwise.
const (
	Width  = 1280
	Height = 800
	Depth  = 24
)

// EnvIntegration set to 1 demands the real-X tests: what they need missing
// then fails them instead of skipping.
const EnvIntegration = "FORKFLEET_INTEGRATION"

// TB is the part of testing.TB the helpers use.
type TB interface {
	Helper()
	Cleanup(func())
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
	Skip(args ...any)
}

// Proc is a child process in a process group of its own, so stopping it
// takes its children too.
type Proc struct {
	Name string
	Cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// StartProc starts cmd, its output to logTo (when not nil). The process
// gets SIGTERM should its parent die first.
func StartProc(name string, cmd *exec.Cmd, logTo io.Writer) (*Proc, error) {
	if logTo != nil {
		cmd.Stdout, cmd.Stderr = logTo, logTo
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{Name: name, Cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	return p, nil
}

// Pid of the process.
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Exited reports whether the process ended, and how.
func (p *Proc) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop sends SIGTERM to the process group, then SIGKILL after 3 s, and
// waits for the process. It is idempotent.
func (p *Proc) Stop() {
	if p == nil {
		return
	}
	if ok, _ := p.Exited(); ok {
		return
	}
	_ = syscall.Kill(-p.Pid(), syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(3 * time.Second):
		_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
		<-p.done
	}
}

// XvfbOptions say how to run Xvfb.
type XvfbOptions struct {
	// Width and Height of the screen (depth 24): Width x Height when 0.
	Width, Height int
	// Args are added to Xvfb's command line.
	Args []string
	// Log receives Xvfb's output; nil keeps it for the error of a failed
	// start.
	Log io.Writer
}

// Xvfb is a running Xvfb.
type Xvfb struct {
	*Proc
	Num int // the display number
}

// Name is the DISPLAY value, ":N".
func (x *Xvfb) Name() string { return ":" + strconv.Itoa(x.Num) }

// StartXvfb starts Xvfb on a display it picks itself (-displayfd), so
// parallel tests and runs never collide nor mistake another server (or a
// stale socket) for theirs, and returns once it accepts X connections. The
// extensions guestd uses are named, so a server without them fails here.
func StartXvfb(ctx context.Context, o XvfbOptions) (*Xvfb, error) {
	if o.Width == 0 || o.Height == 0 {
		o.Width, o.Height = Width, Height
	}
	bin, err := exec.LookPath("Xvfb")
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	args := append([]string{"-displayfd", "3", "-screen", "0", fmt.Sprintf("%dx%dx%d", o.Width, o.Height, Depth),
		"-nolisten", "tcp", "-noreset",
		"+extension", "XTEST", "+extension", "DAMAGE", "+extension", "XFIXES", "+extension", "MIT-SHM"}, o.Args...)
	cmd := exec.Command(bin, args...)
	cmd.ExtraFiles = []*os.File{w}
	var out lockedBuffer
	logTo := o.Log
	if logTo == nil {
		logTo = &out
	}
	p, err := StartProc("Xvfb", cmd, logTo)
	w.Close()
	if err != nil {
		return nil, err
	}
	type got struct {
		n   int
		err error
	}
	ch := make(chan got, 1)
	go func() {
		// Xvfb writes the number and the newline separately and dies if
		// the pipe is gone in between: read the whole line.
		line, err := bufio.NewReader(r).ReadString('\n')
		if err != nil {
			ch <- got{err: fmt.Errorf("Xvfb exited before naming its display: %w%s", err, out.tail())}
			return
		}
		n, err := strconv.Atoi(strings.TrimSpace(line))
		ch <- got{n, err}
	}()
	select {
	case g := <-ch:
		if g.err != nil {
			p.Stop()
			return nil, g.err
		}
		x := &Xvfb{Proc: p, Num: g.n}
		if err := waitX(ctx, x.Num); err != nil {
			p.Stop()
			return nil, err
		}
		return x, nil
	case <-time.After(15 * time.Second):
		p.Stop()
		return nil, fmt.Errorf("Xvfb did not start within 15s%s", out.tail())
	case <-ctx.Done():
		p.Stop()
		return nil, ctx.Err()
	}
}

// waitX waits until display n's socket accepts connections (Xvfb names the
// display once it listens; this is the check that it does).
func waitX(ctx context.Context, n int) error {
	sock := "/tmp/.X11-unix/X" + strconv.Itoa(n)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("X server :%d not answering: %w", n, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// NeedXvfb skips tb when Xvfb is missing, unless FORKFLEET_INTEGRATION=1
// demands the real-X tests, in which case it fails. With integrationOnly
// tb also skips when FORKFLEET_INTEGRATION is not set.
func NeedXvfb(tb TB, integrationOnly bool) {
	tb.Helper()
	on := os.Getenv(EnvIntegration) == "1"
	if integrationOnly && !on {
		tb.Skip("set FORKFLEET_INTEGRATION=1 to run against real Xvfb")
	}
	if _, err := exec.LookPath("Xvfb"); err != nil {
		if on {
			tb.Fatalf("FORKFLEET_INTEGRATION=1 but Xvfb is missing: %v", err)
		}
		tb.Skipf("Xvfb not installed: real-X tests skipped (%v)", err)
	}
}

// NewXvfb starts Xvfb for a test (NeedXvfb(tb, false) first) and stops it
// when the test ends; tests may Stop it earlier to take the display away.
func NewXvfb(tb TB, o XvfbOptions) *Xvfb {
	tb.Helper()
	NeedXvfb(tb, false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	x, err := StartXvfb(ctx, o)
	if err != nil {
		tb.Fatalf("Xvfb: %v", err)
	}
	tb.Cleanup(x.Stop)
	return x
}

// lockedBuffer keeps a process's output for an error message.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > 64<<10 {
		return len(p), nil // enough to say why
	}
	return l.b.Write(p)
}

// tail is the kept output as the end of an error message.
func (l *lockedBuffer) tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := strings.TrimSpace(l.b.String()); s != "" {
		return ": " + s
	}
	return ""
}
