//go:build linux

package suites

import (
	"syscall"
	"testing"
	"time"
)

func TestSchedRuntime(t *testing.T) {
	sched := "head (12329, #threads: 1)\n---\nse.exec_start                                :      83656419.859607\n" +
		"se.vruntime                                  :           408.711080\nse.sum_exec_runtime                          :             12.129435\n"
	got, ok := schedRuntime([]byte(sched))
	if want := 12129435 * time.Nanosecond; !ok || got != want {
		t.Fatalf("schedRuntime = %v, %v; want %v", got, ok, want)
	}
	if _, ok := schedRuntime([]byte("no such field\n")); ok {
		t.Fatal("schedRuntime parsed a file without se.sum_exec_runtime")
	}
}

// The host's tasks are read, this process's own counted as the client's.
func TestCPUByGroupCountsThisProcess(t *testing.T) {
	tm := newTaskMeter()
	defer tm.Close()
	if len(tm.files) == 0 {
		t.Skip("no /proc/<pid>/task/<tid>/sched on this kernel")
	}
	// Spin until this process has used 20 ms of CPU (not of wall time: on
	// a loaded host a wall-clock loop may get a fraction of a core).
	start := processCPU(t)
	for processCPU(t)-start < 20*time.Millisecond {
	}
	ran := tm.since()
	if ran["client"] < 10*time.Millisecond {
		t.Fatalf("client ran %v in a 20 ms busy loop; groups %v", ran["client"], ran)
	}
}

// processCPU is the CPU time this process has used, user and system.
func processCPU(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// The host's busy time grows by at least what this process burns.
func TestHostBusyCountsThisProcess(t *testing.T) {
	b0, err := hostBusy()
	if err != nil {
		t.Fatal(err)
	}
	self0, err := CPUTime("self")
	if err != nil {
		t.Fatal(err)
	}
	for {
		self, err := CPUTime("self")
		if err != nil {
			t.Fatal(err)
		}
		if self-self0 >= 100*time.Millisecond {
			break
		}
	}
	b1, err := hostBusy()
	if err != nil {
		t.Fatal(err)
	}
	if d := b1 - b0; d < 60*time.Millisecond {
		t.Errorf("host busy grew %v while this process ran 100 ms", d)
	}
}
