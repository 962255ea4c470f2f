package suites

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// userHZ is the /proc clock tick: fixed at 100 by the Linux user ABI.
const userHZ = 100

// CPUTime reads utime+stime of pid ("self" for this process) from
// /proc/<pid>/stat.
func CPUTime(pid string) (time.Duration, error) {
	f, err := statFields(pid)
	if err != nil {
		return 0, err
	}
	// f[0] is field 3 (state); utime is field 14, stime 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%s/stat: short", pid)
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%s/stat: bad times", pid)
	}
	return time.Duration(ut+st) * time.Second / userHZ, nil
}

// hostBusy is the CPU time the host's CPUs ran anything but their idle
// task: user, nice, system, irq and softirq of /proc/stat (not iowait, nor
// steal, the hypervisor's), in its 10 ms ticks per CPU.
func hostBusy() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: no cpu line")
	}
	var ticks uint64
	for _, i := range []int{1, 2, 3, 6, 7} { // user nice system irq softirq
		v, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %w", err)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// statFields returns the fields of /proc/<pid>/stat from the third
// (state) on. The command name before them may hold spaces and
// parentheses: they start after the last ')'.
func statFields(pid string) ([]string, error) {
	data, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return nil, err
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%s/stat: malformed", pid)
	}
	return strings.Fields(s[i+1:]), nil
}

// StatusKB reads a "Key:   N kB" line of /proc/<pid>/status.
func StatusKB(pid, key string) (uint64, error) {
	data, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, key+":"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				return strconv.ParseUint(f[0], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("/proc/%s/status: no %s", pid, key)
}

// CPUMeter measures the CPU share of a set of processes over a window.
type CPUMeter struct {
	pids  []string
	start []time.Duration
	t0    time.Time
}

// StartCPU begins a window for pids.
func StartCPU(pids ...string) (*CPUMeter, error) {
	m := &CPUMeter{pids: pids, t0: time.Now()}
	for _, p := range pids {
		c, err := CPUTime(p)
		if err != nil {
			return nil, err
		}
		m.start = append(m.start, c)
	}
	return m, nil
}

// Percent returns, per pid, CPU time over the window as a percentage of one
// core.
func (m *CPUMeter) Percent() ([]float64, time.Duration, error) {
	wall := time.Since(m.t0)
	out := make([]float64, len(m.pids))
	for i, p := range m.pids {
		c, err := CPUTime(p)
		if err != nil {
			return nil, wall, err
		}
		out[i] = float64(c-m.start[i]) / float64(wall) * 100
	}
	return out, wall, nil
}

// taskMeter reads the CPU time every task (thread) of the host has run,
// by the group its process belongs to (taskGroup): se.sum_exec_runtime of
// /proc/<pid>/task/<tid>/sched, nanosecond resolution where
// /proc/<pid>/stat counts 10 ms ticks, too coarse for a window of a few
// ms. The tasks are listed, grouped and their files opened up front, so a
// read is one pread per task (about 2 ms for 160): tasks born after the
// listing are not counted, tasks that end count until then. The window
// opens with this process's tasks read last and closes with them read
// first, so the client's share leaves out the meter's own reads.
type taskMeter struct {
	files  []*os.File // this process's tasks first (nself of them)
	nself  int
	groups []string
	start  []time.Duration
	buf    []byte
}

// newTaskMeter lists the host's tasks and starts a window.
func newTaskMeter() *taskMeter {
	t := &taskMeter{buf: make([]byte, 8192)}
	procs, _ := os.ReadDir("/proc")
	self := strconv.Itoa(os.Getpid())
	add := func(pid, group string) {
		tasks, _ := os.ReadDir("/proc/" + pid + "/task")
		for _, task := range tasks {
			f, err := os.Open("/proc/" + pid + "/task/" + task.Name() + "/sched")
			if err != nil {
				continue
			}
			t.files = append(t.files, f)
			t.groups = append(t.groups, group)
		}
	}
	add(self, "client")
	t.nself = len(t.files)
	for _, p := range procs {
		if pid := p.Name(); pid[0] >= '0' && pid[0] <= '9' && pid != self {
			add(pid, taskGroup(pid, self))
		}
	}
	t.start = make([]time.Duration, len(t.files))
	t.read(t.start, t.nself, len(t.files))
	t.read(t.start, 0, t.nself)
	return t
}

// read reads tasks [from, to) into out.
func (t *taskMeter) read(out []time.Duration, from, to int) {
	for i := from; i < to; i++ {
		n, _ := t.files[i].ReadAt(t.buf, 0)
		out[i], _ = schedRuntime(t.buf[:n])
	}
}

// since is the CPU time each group ran since the window began.
func (t *taskMeter) since() map[string]time.Duration {
	now := make([]time.Duration, len(t.files))
	t.read(now, 0, len(t.files))
	out := map[string]time.Duration{}
	for i, v := range now {
		if d := v - t.start[i]; d > 0 {
			out[t.groups[i]] += d
		}
	}
	return out
}

func (t *taskMeter) Close() {
	for _, f := range t.files {
		f.Close()
	}
}

// schedRuntime parses se.sum_exec_runtime (ms with a fraction) of a sched
// file.
func schedRuntime(b []byte) (time.Duration, bool) {
	_, rest, ok := strings.Cut(string(b), "se.sum_exec_runtime")
	if !ok {
		return 0, false
	}
	_, rest, ok = strings.Cut(rest, ":")
	if !ok {
		return 0, false
	}
	v, _, _ := strings.Cut(strings.TrimSpace(rest), "\n")
	ms, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil {
		return 0, false
	}
	return time.Duration(ms * float64(time.Millisecond)), true
}

// taskGroup names what a process is, for where a window's CPU went:
// client (this benchd), controld, guestd, desktop (a sandbox's other
// processes: the X server, window manager, terminal, shell), runtime
// (containerd, its shims, runc, CRIU, the log forwarder), ksmd, kworker
// (the kernel's workers and softirq threads), kernel (its other threads),
// other.
func taskGroup(pid, self string) string {
	if pid == self {
		return "client"
	}
	b, _ := os.ReadFile("/proc/" + pid + "/comm")
	comm := strings.TrimSpace(string(b))
	switch {
	case comm == "controld":
		return "controld"
	case comm == "guestd":
		return "guestd"
	case comm == "containerd" || strings.HasPrefix(comm, "containerd-shim") || strings.HasPrefix(comm, "runc") ||
		comm == "criu" || comm == "forkfleet-log":
		return "runtime"
	case comm == "ksmd":
		return "ksmd"
	case strings.HasPrefix(comm, "kworker") || strings.HasPrefix(comm, "ksoftirqd"):
		return "kworker"
	}
	if kernelThread(pid) {
		return "kernel"
	}
	if inSandbox(pid) {
		return "desktop"
	}
	return "other"
}

// kernelThread reports whether pid is a kernel thread (kthreadd's child).
func kernelThread(pid string) bool {
	if pid == "2" {
		return true
	}
	f, err := statFields(pid)
	return err == nil && len(f) > 1 && f[1] == "2" // f[1]: field 4, ppid
}

// inSandbox reports whether pid runs in a container: another mount
// namespace than this process's.
func inSandbox(pid string) bool {
	mine, err1 := os.Readlink("/proc/self/ns/mnt")
	its, err2 := os.Readlink("/proc/" + pid + "/ns/mnt")
	return err1 == nil && err2 == nil && mine != its
}

// monotonicNow is CLOCK_MONOTONIC in ns, the clock perf can stamp its
// samples with.
func monotonicNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0
	}
	return ts.Nano()
}
