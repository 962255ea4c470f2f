package sysops

import (
	"errors"
	"os"
	"strconv"
	"strings"
)

// PIDs lists the processes /proc shows. guestd runs as the sandbox's init,
// so that is the sandbox's processes only.
func PIDs() ([]int, error) {
	d, err := os.Open("/proc")
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	out := make([]int, 0, len(names))
	for _, n := range names {
		if pid, err := strconv.Atoi(n); err == nil && pid > 0 {
			out = append(out, pid)
		}
	}
	return out, nil
}

// Stat is what guestd reads of /proc/<pid>/stat.
type Stat struct {
	State byte   // field 3: R, S, D, Z, T, t, X, ...
	Start uint64 // field 22: start time, clock ticks since the host booted
}

var errStatFormat = errors.New("sysops: /proc stat: unexpected format")

// ReadStat reads /proc/<pid>/stat; pid 0 is this process.
func ReadStat(pid int) (Stat, error) {
	p := "/proc/self/stat"
	if pid != 0 {
		p = "/proc/" + strconv.Itoa(pid) + "/stat"
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return Stat{}, err
	}
	return parseStat(string(b))
}

func parseStat(s string) (Stat, error) {
	// comm (field 2) may hold spaces and parentheses: count from its end.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return Stat{}, errStatFormat
	}
	f := strings.Fields(s[i+1:])
	const stateField, startField = 3 - 3, 22 - 3 // fields after comm start at 3
	if len(f) <= startField || len(f[stateField]) != 1 {
		return Stat{}, errStatFormat
	}
	start, err := strconv.ParseUint(f[startField], 10, 64)
	if err != nil {
		return Stat{}, errStatFormat
	}
	return Stat{State: f[stateField][0], Start: start}, nil
}
