//go:build linux

package supervise

import (
	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/guestd/internal/sysops"
)

// stopPasses bounds StopOthers' scans of /proc: a process forked while a
// scan ran is stopped by the next one.
const stopPasses = 5

// StopOthers, as the top of its sandbox (sysops.SandboxInit), stops
// (SIGSTOP) every other process but tini and the one keep names (the X
// server; 0: none), and returns a function that continues (SIGCONT)
// exactly the processes it stopped and returns their count: one stopped
// before (by an agent, a debugger) stays stopped. Anywhere else it stops
// nothing, since /proc would show the host's processes.
//
// A pool's member waits for its claim this way: its proofs need only
// guestd and the X server, and apps stopped right after the restore hold
// the checkpoint's memory, not what a page does until the member's freeze.
func StopOthers(keep func() int) (cont func() int) {
	var stopped []int
	if sysops.SandboxInit() {
		x := 0
		if keep != nil {
			x = keep()
		}
		seen := map[int]bool{}
		for range stopPasses {
			more := false
			for _, pid := range pids() {
				if sysops.GuestdOrInit(pid) || pid == x || seen[pid] {
					continue
				}
				seen[pid] = true
				switch procState(pid) {
				case 0, 'Z', 'X', 'T', 't':
					// Gone, exiting, or stopped by someone else.
					continue
				}
				if unix.Kill(pid, unix.SIGSTOP) == nil {
					stopped = append(stopped, pid)
					more = true
				}
			}
			if !more {
				break
			}
		}
	}
	return func() int {
		n := 0
		for _, pid := range stopped {
			if unix.Kill(pid, unix.SIGCONT) == nil {
				n++
			}
		}
		return n
	}
}

// pids lists the sandbox's processes (none when /proc cannot be read).
func pids() []int {
	p, _ := sysops.PIDs()
	return p
}

// procState is the state letter of /proc/<pid>/stat (0 when unreadable).
func procState(pid int) byte {
	st, err := sysops.ReadStat(pid)
	if err != nil {
		return 0
	}
	return st.State
}
