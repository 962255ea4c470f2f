//go:build linux

package x11

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestReadTaskOtherUser: guestd (root without CAP_SYS_PTRACE in a sandbox)
// reads what a client of another user waits in: a process asleep in
// select is waiting for input, one asleep in nanosleep is not.
func TestReadTaskOtherUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (processes of another user)")
	}
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		t.Skip("python3 not installed")
	}
	start := func(argv ...string) int {
		c := exec.Command(argv[0], argv[1:]...)
		c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Process.Kill(); c.Wait() })
		return c.Process.Pid
	}
	waiting := func(pid int, want bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			task, err := readTask(pid)
			if err != nil {
				t.Fatal(err)
			}
			if task.waiting == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("pid %d: waiting %v, want %v", pid, task.waiting, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waiting(start("/usr/bin/python3", "-c", "import select; select.select([], [], [])"), true)
	waiting(start("sleep", "60"), false)
}
