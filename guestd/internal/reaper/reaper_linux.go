//go:build linux

// Package reaper is guestd's single wait loop. As PID 1 (or a child
// subreaper) guestd must reap every child, including orphans reparented to
// it, yet the code that started a process must still get that process's exit
// status. So nothing in guestd calls Wait on a child: processes are started
// through Reaper.Start, which registers the pid, and one loop calls wait4 and
// dispatches each status to the registered waiter. Statuses of unregistered
// pids (orphans) are dropped after reaping.
package reaper

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// Mode selects which children the loop reaps.
type Mode int

const (
	// All reaps every child (wait4(-1)): the PID 1 / subreaper mode.
	All Mode = iota
	// Own reaps only the pids started through the Reaper, leaving other
	// children of the process alone (guestd running on a host, tests).
	Own
	// Children reaps every child (wait4(-1)) but leaves orphans to the
	// sandbox's init above guestd (tini): CRIU restores a process whose
	// session leader is gone only as a child of the dump's root, PID 1
	// (a helper task stands in for the leader), never of a subreaper.
	Children
)

// Status is the exit of one process.
type Status struct {
	Pid    int
	Status unix.WaitStatus
	Rusage unix.Rusage
}

// ExitCode is the exit code, or -1 when the process died of a signal.
func (s Status) ExitCode() int {
	if s.Status.Exited() {
		return s.Status.ExitStatus()
	}
	return -1
}

// Signal is the killing signal, 0 when the process exited normally.
func (s Status) Signal() syscall.Signal {
	if s.Status.Signaled() {
		return s.Status.Signal()
	}
	return 0
}

func (s Status) String() string {
	if sig := s.Signal(); sig != 0 {
		return "signal " + unix.SignalName(sig)
	}
	return fmt.Sprintf("exit status %d", s.ExitCode())
}

// ErrClosed is returned by Start after Close.
var ErrClosed = errors.New("reaper: closed")

// allActive enforces one All-mode reaper per process: two wait4(-1) loops
// would steal each other's statuses.
var allActive atomic.Bool

// Reaper dispatches child exit statuses by pid.
type Reaper struct {
	mode Mode
	sig  chan os.Signal
	done chan struct{}
	wg   sync.WaitGroup

	// mu is held across cmd.Start+registration and across each wait4 sweep,
	// so a child that exits before it is registered is not reaped as an
	// orphan: the sweep waits for the registration.
	mu      sync.Mutex
	waiters map[int]chan Status
	closed  bool
	orphans uint64
}

// New starts the wait loop. In mode All it also makes the process a child
// subreaper (a no-op for PID 1) so orphans of exec'd commands come back to
// guestd instead of escaping to the host's init.
func New(mode Mode) (*Reaper, error) {
	if mode != Own && !allActive.CompareAndSwap(false, true) {
		return nil, errors.New("reaper: an All-mode reaper is already running in this process")
	}
	if mode == All && os.Getpid() != 1 {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			allActive.Store(false)
			return nil, fmt.Errorf("reaper: PR_SET_CHILD_SUBREAPER: %w", err)
		}
	}
	r := &Reaper{
		mode:    mode,
		sig:     make(chan os.Signal, 1),
		done:    make(chan struct{}),
		waiters: make(map[int]chan Status),
	}
	signal.Notify(r.sig, unix.SIGCHLD)
	r.wg.Add(1)
	go r.loop()
	return r, nil
}

// Start starts cmd and returns a channel that receives its exit status
// exactly once. The caller must not call cmd.Wait; it should call
// cmd.Process.Release after the status arrives and close any pipes itself.
func (r *Reaper) Start(cmd *exec.Cmd) (<-chan Status, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, ErrClosed
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ch := make(chan Status, 1)
	r.waiters[cmd.Process.Pid] = ch
	return ch, nil
}

// Orphans is how many unregistered children were reaped.
func (r *Reaper) Orphans() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.orphans
}

// Close stops the loop. Waiters still registered never receive a status.
func (r *Reaper) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	r.mu.Unlock()
	signal.Stop(r.sig)
	close(r.done)
	r.wg.Wait()
	if r.mode != Own {
		allActive.Store(false)
	}
}

func (r *Reaper) loop() {
	defer r.wg.Done()
	for {
		select {
		case <-r.done:
			return
		case <-r.sig:
			r.sweep()
		}
	}
}

func (r *Reaper) sweep() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mode == Own {
		for pid, ch := range r.waiters {
			if st, ok := wait(pid); ok {
				delete(r.waiters, pid)
				ch <- st
			}
		}
		return
	}
	for {
		st, ok := wait(-1)
		if !ok {
			return
		}
		if ch, found := r.waiters[st.Pid]; found {
			delete(r.waiters, st.Pid)
			ch <- st
		} else {
			r.orphans++
		}
	}
}

// wait reaps one exited child of pid (-1: any) without blocking.
func wait(pid int) (Status, bool) {
	for {
		var st Status
		got, err := unix.Wait4(pid, &st.Status, unix.WNOHANG, &st.Rusage)
		if err == unix.EINTR {
			continue
		}
		if err != nil || got <= 0 {
			return Status{}, false
		}
		st.Pid = got
		return st, true
	}
}
