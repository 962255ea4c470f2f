//go:build linux

// Package xvfbtest starts private Xvfb servers for guestd's real-X tests:
// each on the first free display of a range, stopped when the test ends.
package xvfbtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// XvfbPath is where Debian installs Xvfb.
const XvfbPath = "/usr/bin/Xvfb"

// Need skips the test when Xvfb is missing, unless FORKFLEET_INTEGRATION=1
// demands the real-X tests, in which case it fails. With integrationOnly the
// test also skips when FORKFLEET_INTEGRATION is not set.
func Need(tb testing.TB, integrationOnly bool) {
	tb.Helper()
	on := os.Getenv("FORKFLEET_INTEGRATION") == "1"
	if integrationOnly && !on {
		tb.Skip("set FORKFLEET_INTEGRATION=1 to run against real Xvfb")
	}
	if _, err := os.Stat(XvfbPath); err != nil {
		if on {
			tb.Fatalf("FORKFLEET_INTEGRATION=1 but %s is missing: %v", XvfbPath, err)
		}
		tb.Skipf("%s not installed: real-X tests skipped", XvfbPath)
	}
}

// Options say which displays to try and how to run Xvfb.
type Options struct {
	// FirstDisplay and Displays are the range tried; packages whose tests
	// run in parallel use disjoint ranges. Displays defaults to 40.
	FirstDisplay, Displays int
	// Width and Height default to 1280x800 (depth 24).
	Width, Height int
	// Args are added to Xvfb's command line.
	Args []string
}

// Server is a running Xvfb.
type Server struct {
	Display string // ":N"
	cmd     *exec.Cmd
	exited  chan struct{}
	stopped bool
}

// Start starts Xvfb on the first free display and stops it when the test
// ends. It calls Need(tb, false) first.
func Start(tb testing.TB, o Options) *Server {
	tb.Helper()
	Need(tb, false)
	if o.Displays == 0 {
		o.Displays = 40
	}
	if o.Width == 0 || o.Height == 0 {
		o.Width, o.Height = 1280, 800
	}
	for n := o.FirstDisplay; n < o.FirstDisplay+o.Displays; n++ {
		// A live lock makes Xvfb exit at once; a stale one it replaces.
		if s := try(tb, n, o); s != nil {
			tb.Cleanup(s.Stop)
			return s
		}
	}
	tb.Fatalf("no free X display in :%d..:%d", o.FirstDisplay, o.FirstDisplay+o.Displays-1)
	return nil
}

func try(tb testing.TB, n int, o Options) *Server {
	tb.Helper()
	args := append([]string{fmt.Sprintf(":%d", n), "-screen", "0", fmt.Sprintf("%dx%dx24", o.Width, o.Height),
		"-noreset", "-nolisten", "tcp"}, o.Args...)
	cmd := exec.Command(XvfbPath, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start Xvfb: %v", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	sock := fmt.Sprintf("/tmp/.X11-unix/X%d", n)
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-exited:
			return nil // lost a race for the display: try the next one
		default:
		}
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return &Server{Display: fmt.Sprintf(":%d", n), cmd: cmd, exited: exited}
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-exited
			tb.Fatalf("Xvfb :%d did not come up: %s", n, stderr.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Stop terminates Xvfb (SIGTERM, then SIGKILL after 3 s) and waits for it.
// Tests call it to take the display away early; it is idempotent.
func (s *Server) Stop() {
	if s.stopped {
		return
	}
	s.stopped = true
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(3 * time.Second):
		s.cmd.Process.Kill()
		<-s.exited
	}
}

// Pid is Xvfb's process id.
func (s *Server) Pid() int { return s.cmd.Process.Pid }
