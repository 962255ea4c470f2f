//go:build linux

// Package harness starts the host-side desktop benchd measures against: an
// Xvfb, openbox, deterministic content scenes and guestd on that display.
package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jezek/xgb"
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

// Proc is a child process benchd started and must stop.
type Proc struct {
	Name string
	Cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func startProc(name string, cmd *exec.Cmd, logTo io.Writer) (*Proc, error) {
	if logTo != nil {
		cmd.Stdout, cmd.Stderr = logTo, logTo
	}
	// Own process group, so stopping it takes its children too.
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

// Stop sends SIGTERM to the process group, then SIGKILL after a grace period.
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

// Display is a running Xvfb.
type Display struct {
	Num  int
	Xvfb *Proc
}

// Name is the DISPLAY value.
func (d *Display) Name() string { return ":" + strconv.Itoa(d.Num) }

// StartXvfb starts Xvfb 1280x800x24 on a display number it picks itself
// (-displayfd), so parallel runs never collide, and waits until it accepts
// X connections.
func StartXvfb(ctx context.Context, logTo io.Writer) (*Display, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := exec.Command("Xvfb", "-displayfd", "3", "-screen", "0", fmt.Sprintf("%dx%dx%d", Width, Height, Depth),
		"-nolisten", "tcp", "-ac", "+extension", "XTEST", "+extension", "DAMAGE", "+extension", "XFIXES",
		"+extension", "MIT-SHM", "-noreset")
	cmd.ExtraFiles = []*os.File{w}
	p, err := startProc("Xvfb", cmd, logTo)
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
		line, err := bufio.NewReader(r).ReadString('\n')
		if err != nil {
			ch <- got{err: fmt.Errorf("Xvfb exited before naming its display: %w", err)}
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
		d := &Display{Num: g.n, Xvfb: p}
		if err := waitX(ctx, d.Name()); err != nil {
			p.Stop()
			return nil, err
		}
		return d, nil
	case <-time.After(15 * time.Second):
		p.Stop()
		return nil, errors.New("Xvfb did not start within 15s")
	case <-ctx.Done():
		p.Stop()
		return nil, ctx.Err()
	}
}

func waitX(ctx context.Context, display string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := xgb.NewConnDisplay(display)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("X server %s not answering: %w", display, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Stop ends the Xvfb.
func (d *Display) Stop() { d.Xvfb.Stop() }

// Desktop is a display with a window manager and scene processes.
type Desktop struct {
	*Display
	mu    sync.Mutex
	procs []*Proc
	log   io.Writer
	scene *sceneState
}

// StartDesktop starts Xvfb and openbox.
func StartDesktop(ctx context.Context, logTo io.Writer) (*Desktop, error) {
	d, err := StartXvfb(ctx, logTo)
	if err != nil {
		return nil, err
	}
	dt := &Desktop{Display: d, log: logTo}
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
func (dt *Desktop) Spawn(name string, argv ...string) (*Proc, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "DISPLAY="+dt.Name())
	p, err := startProc(name, cmd, dt.log)
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
	dt.Display.Stop()
}
