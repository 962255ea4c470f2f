//go:build linux

package containerdrt

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestCgroupPids(t *testing.T) {
	dir := t.TempDir()
	write := func(rel, procs string) {
		t.Helper()
		d := filepath.Join(dir, rel)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(procs), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("", "10\n11\n")
	write("child", "12\n")
	write("child/grandchild", "")
	write("other", "13\n")
	got, err := cgroupPids(dir, 0)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if want := []int{10, 11, 12, 13}; !slices.Equal(got, want) {
		t.Errorf("pids %v, want %v", got, want)
	}

	if _, err := cgroupPids(filepath.Join(dir, "missing"), 0); !errors.Is(err, errNoFreezer) {
		t.Errorf("missing cgroup: %v, want errNoFreezer", err)
	}
	write("bad", "12\nx\n")
	if _, err := cgroupPids(filepath.Join(dir, "bad"), 0); err == nil || !strings.Contains(err.Error(), "bad pid") {
		t.Errorf("bad pid: %v", err)
	}
	write("zero", "0\n")
	if _, err := cgroupPids(filepath.Join(dir, "zero"), 0); err == nil {
		t.Error("pid 0 accepted")
	}
	deep := "deep"
	write(deep, "")
	for range maxCgroupDepth + 1 {
		deep = filepath.Join(deep, "d")
		write(deep, "")
	}
	if _, err := cgroupPids(filepath.Join(dir, "deep"), 0); err == nil || !strings.Contains(err.Error(), "deeper") {
		t.Errorf("deep tree: %v", err)
	}
}

// sandboxPidfds opens a pidfd for every process of the sandbox's freezer
// cgroup.
func sandboxPidfds(t *testing.T, r *Runtime, id string) map[int]int {
	t.Helper()
	pids, err := cgroupPids(r.freezerDir(id), 0)
	if err != nil {
		t.Fatal(err)
	}
	fds := map[int]int{}
	for _, pid := range pids {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			t.Fatalf("pidfd of %d: %v", pid, err)
		}
		fds[pid] = fd
		t.Cleanup(func() { unix.Close(fd) })
	}
	return fds
}

// waitAllExited fails unless every pidfd's process has exited (a pidfd
// polls readable once it has) within timeout.
func waitAllExited(t *testing.T, fds map[int]int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for pid, fd := range fds {
		for {
			p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, _ := unix.Poll(p, 20)
			if n == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("process %d still runs", pid)
			}
		}
	}
}

// Delete kills every process of the sandbox through its freezer (no runc
// kill): the init and a child, running or frozen.
func TestIntegrationDeleteKillsEveryProcess(t *testing.T) {
	integration(t)
	r := newTestRuntime(t, testNamespace)
	importTestImage(t, r)
	ctx := context.Background()
	for _, frozen := range []bool{false, true} {
		inst := bootT(t, r, testSpec(uniqueID("killall")))
		mustCall(t, inst, "traced") // a second process, stopped under ptrace
		fds := sandboxPidfds(t, r, inst.ID)
		if len(fds) < 2 {
			t.Fatalf("%d processes in the sandbox, want the init and its child", len(fds))
		}
		if frozen {
			if err := r.Freeze(ctx, inst.ID); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.Delete(ctx, inst.ID); err != nil {
			t.Fatalf("Delete (frozen %v): %v", frozen, err)
		}
		waitAllExited(t, fds, 5*time.Second)
		assertGone(t, r, inst.ID)
	}
}

// killAll leaves no process and the freezer thawed; the task's delete
// then finds it stopped.
func TestIntegrationKillAll(t *testing.T) {
	integration(t)
	r := newTestRuntime(t, testNamespace)
	importTestImage(t, r)
	ctx := context.Background()
	inst := bootT(t, r, testSpec(uniqueID("killall")))
	t.Cleanup(func() { r.Delete(ctx, inst.ID) })
	fds := sandboxPidfds(t, r, inst.ID)
	if err := r.Freeze(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
	if err := r.killAll(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
	if st, err := r.freezerState(inst.ID); err != nil || st != freezerThawed {
		t.Errorf("freezer %q (%v) after killAll, want THAWED", st, err)
	}
	waitAllExited(t, fds, 5*time.Second)
	if err := r.killAll(ctx, inst.ID); err != nil {
		t.Errorf("killAll of a sandbox with no process: %v", err)
	}
	if err := r.killAll(ctx, "no-such-sandbox"); !errors.Is(err, errNoFreezer) {
		t.Errorf("killAll of an unknown sandbox: %v, want errNoFreezer", err)
	}
	if err := r.Delete(ctx, inst.ID); err != nil {
		t.Fatal(err)
	}
	assertGone(t, r, inst.ID)
}
