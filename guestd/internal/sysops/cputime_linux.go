package sysops

import (
	"bytes"
	"os"
	"strconv"
	"time"
)

// OthersCPUTime returns the CPU time every process but this one has used,
// summed from /proc/<pid>/schedstat (nanoseconds, unlike the 10 ms ticks of
// /proc/<pid>/stat). guestd runs as the sandbox's init, so /proc holds the
// sandbox's processes only; a change between two calls means something in
// the sandbox ran. Processes that vanish between the directory read and
// their file are skipped.
func OthersCPUTime() (time.Duration, error) {
	pids, err := PIDs()
	if err != nil {
		return 0, err
	}
	var total int64
	buf := make([]byte, 0, 96)
	for _, pid := range pids {
		if GuestdOrInit(pid) { // tini wakes every second
			continue
		}
		f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/schedstat")
		if err != nil {
			continue
		}
		b := buf[:cap(buf)]
		k, _ := f.Read(b)
		f.Close()
		field, _, _ := bytes.Cut(b[:k], []byte(" "))
		if v, err := strconv.ParseInt(string(field), 10, 64); err == nil {
			total += v
		}
	}
	return time.Duration(total), nil
}
