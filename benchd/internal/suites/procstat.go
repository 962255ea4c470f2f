package suites

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// userHZ is the /proc clock tick: fixed at 100 by the Linux user ABI.
const userHZ = 100

// CPUTime reads utime+stime of pid ("self" for this process) from
// /proc/<pid>/stat.
func CPUTime(pid string) (time.Duration, error) {
	data, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name may hold spaces and parentheses: fields start after
	// the last ')'.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%s/stat: malformed", pid)
	}
	f := strings.Fields(s[i+1:])
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
