//go:build linux

// Package supervise runs guestd's long-lived children (Xvfb, the window
// manager, session apps): start, restart with backoff by policy, and stop
// with SIGTERM then SIGKILL after a grace period. Exit statuses come from
// the shared reaper, never from cmd.Wait.
package supervise

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/guestd/internal/config"
	"github.com/forkfleet/forkfleet/guestd/internal/reaper"
)

// Backoff bounds between restarts. A process that ran for stableAfter resets
// the backoff, so a crash after hours of uptime restarts at once.
const (
	minBackoff  = 50 * time.Millisecond
	maxBackoff  = 5 * time.Second
	stableAfter = 10 * time.Second
)

// Spec is one supervised program.
type Spec struct {
	Name    string
	Path    string
	Args    []string
	Env     []string // appended to the supervisor's base environment
	Restart string   // config.RestartAlways, RestartOnFailure or RestartNever
	// Credential and Dir: the user the program runs as and where it starts
	// (nil and "": guestd's own).
	Credential *syscall.Credential
	Dir        string
	// NotifyFD passes the write end of a pipe as fd 3; every line the
	// program writes there is handed to OnNotify (Xvfb -displayfd 3).
	NotifyFD bool
	OnNotify func(line string)
	// OnExit sees every exit (before any restart).
	OnExit func(reaper.Status)
}

// Supervisor owns a set of running Specs.
type Supervisor struct {
	reaper *reaper.Reaper
	log    *slog.Logger
	env    []string
	grace  time.Duration

	mu       sync.Mutex
	services []*service
}

type service struct {
	spec     Spec
	cancel   context.CancelFunc
	done     chan struct{}
	pid      atomic.Int64
	restarts atomic.Int64
}

// New returns a Supervisor whose children get env and have grace between
// SIGTERM and SIGKILL when stopped.
func New(r *reaper.Reaper, log *slog.Logger, env []string, grace time.Duration) *Supervisor {
	return &Supervisor{reaper: r, log: log, env: env, grace: grace}
}

// Start runs spec until Stop (or until its restart policy says it is done).
func (s *Supervisor) Start(spec Spec) {
	ctx, cancel := context.WithCancel(context.Background())
	svc := &service{spec: spec, cancel: cancel, done: make(chan struct{})}
	s.mu.Lock()
	s.services = append(s.services, svc)
	s.mu.Unlock()
	go s.run(ctx, svc)
}

// Pid is the current pid of the named program (0 when not running).
func (s *Supervisor) Pid(name string) int {
	if svc := s.find(name); svc != nil {
		return int(svc.pid.Load())
	}
	return 0
}

// Restarts counts the restarts of the named program.
func (s *Supervisor) Restarts(name string) int {
	if svc := s.find(name); svc != nil {
		return int(svc.restarts.Load())
	}
	return 0
}

func (s *Supervisor) find(name string) *service {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, svc := range s.services {
		if svc.spec.Name == name {
			return svc
		}
	}
	return nil
}

// Stop stops the named programs in the given order (each one fully before
// the next, so apps go before the window manager before X), then any others
// concurrently. Each gets SIGTERM, then SIGKILL after the grace period.
func (s *Supervisor) Stop(order ...string) {
	for _, name := range order {
		if svc := s.find(name); svc != nil {
			svc.cancel()
			<-svc.done
		}
	}
	s.mu.Lock()
	rest := append([]*service(nil), s.services...)
	s.mu.Unlock()
	for _, svc := range rest {
		svc.cancel()
	}
	for _, svc := range rest {
		<-svc.done
	}
}

func (s *Supervisor) run(ctx context.Context, svc *service) {
	defer close(svc.done)
	spec := svc.spec
	log := s.log.With("program", spec.Name)
	backoff := minBackoff
	for {
		started := time.Now()
		st, ok := s.once(ctx, svc, log)
		if !ok {
			return // stopped
		}
		if spec.OnExit != nil && st.Pid != 0 {
			spec.OnExit(st)
		}
		switch {
		case spec.Restart == config.RestartNever:
			return
		case spec.Restart == config.RestartOnFailure && st.Pid != 0 && st.ExitCode() == 0:
			log.Info("exited cleanly; not restarting (restart=on-failure)")
			return
		}
		if time.Since(started) > stableAfter {
			backoff = minBackoff
		}
		log.Warn("restarting", "in", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
		backoff = min(backoff*2, maxBackoff)
		svc.restarts.Add(1)
	}
}

// once starts the program and waits for it to exit. ok is false when the
// supervisor stopped it. A start failure returns a zero Status and ok.
func (s *Supervisor) once(ctx context.Context, svc *service, log *slog.Logger) (reaper.Status, bool) {
	if ctx.Err() != nil {
		return reaper.Status{}, false
	}
	spec := svc.spec
	cmd := &exec.Cmd{Path: spec.Path, Args: append([]string{spec.Path}, spec.Args...), Env: append(append([]string(nil), s.env...), spec.Env...), Dir: spec.Dir}
	// Own process group so a stop reaches the program's children too.
	cmd.SysProcAttr = &unix.SysProcAttr{Setpgid: true, Credential: spec.Credential}
	out := &lineLogger{log: log}
	pr, pw, err := os.Pipe()
	if err != nil {
		log.Error("pipe", "err", err)
		return reaper.Status{}, true
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	var nr, nw *os.File
	if spec.NotifyFD {
		if nr, nw, err = os.Pipe(); err != nil {
			pr.Close()
			pw.Close()
			log.Error("pipe", "err", err)
			return reaper.Status{}, true
		}
		cmd.ExtraFiles = []*os.File{nw}
	}
	done, err := s.reaper.Start(cmd)
	pw.Close()
	if nw != nil {
		nw.Close()
	}
	if err != nil {
		pr.Close()
		if nr != nil {
			nr.Close()
		}
		log.Error("start failed", "path", spec.Path, "err", err)
		return reaper.Status{}, true
	}
	pid := cmd.Process.Pid
	svc.pid.Store(int64(pid))
	log.Info("started", "pid", pid)
	go out.copy(pr)
	if nr != nil {
		go func() {
			defer nr.Close()
			sc := bufio.NewScanner(nr)
			for sc.Scan() {
				if spec.OnNotify != nil {
					spec.OnNotify(strings.TrimSpace(sc.Text()))
				}
			}
		}()
	}
	var st reaper.Status
	select {
	case st = <-done:
		log.Warn("exited", "pid", pid, "status", st.String())
	case <-ctx.Done():
		_ = unix.Kill(-pid, unix.SIGTERM)
		t := time.NewTimer(s.grace)
		select {
		case st = <-done:
			t.Stop()
		case <-t.C:
			log.Warn("did not exit after SIGTERM; killing", "grace", s.grace)
			_ = unix.Kill(-pid, unix.SIGKILL)
			st = <-done
		}
		log.Info("stopped", "pid", pid, "status", st.String())
		svc.pid.Store(0)
		cmd.Process.Release()
		return st, false
	}
	svc.pid.Store(0)
	cmd.Process.Release()
	return st, true
}

// lineLogger forwards a child's output to guestd's log line by line.
type lineLogger struct{ log *slog.Logger }

func (l *lineLogger) copy(f *os.File) {
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 4096), 64<<10)
	for sc.Scan() {
		l.log.Info("output", "line", sc.Text())
	}
	// A line longer than the buffer ends the scan: keep draining so the
	// child never blocks on a full pipe.
	_, _ = io.Copy(io.Discard, f)
}
