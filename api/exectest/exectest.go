//go:build linux

// Package exectest makes a test binary a process that execs itself from a
// thread other than its leader, as guestd execs the sandbox's init: the
// kernel ends the leader first, so for a moment the pid names a task
// without a root, and a frozen cgroup holds the exec's thread until the
// others exit. It is the one such helper for every module's tests.
package exectest

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
	"time"
)

// env carries how many execs are left (a negative count: for ever).
const env = "FORKFLEET_EXECTEST_EXECS_LEFT"

// Done is the line the helper writes on its stdout after its last exec.
const Done = "done\n"

// Main makes the test binary the helper when Command started it, and
// never returns then; otherwise it returns. Call it first in TestMain.
func Main() {
	v, ok := os.LookupEnv(env)
	if !ok {
		return
	}
	n, err := strconv.Atoi(v)
	if err != nil || n == 0 {
		os.Stdout.WriteString(Done)
		for {
			time.Sleep(time.Hour)
		}
	}
	if n > 0 {
		os.Setenv(env, strconv.Itoa(n-1))
	}
	// The main goroutine keeps the leader thread, so the exec runs on
	// another one.
	runtime.LockOSThread()
	go func() {
		time.Sleep(time.Millisecond) // Go's runtime starts its threads
		err := syscall.Exec("/proc/self/exe", os.Args[:1], os.Environ())
		os.Stderr.WriteString("exectest: exec: " + err.Error() + "\n")
		os.Exit(2)
	}()
	select {}
}

// Command returns the test binary to start as the helper: it execs itself
// execs times (for ever when negative), each time from a thread other
// than its leader, then writes Done and sleeps until killed.
func Command(execs int) *exec.Cmd {
	cmd := exec.Command("/proc/self/exe", "-test.run=^$")
	cmd.Env = append(os.Environ(), env+"="+strconv.Itoa(execs))
	return cmd
}
