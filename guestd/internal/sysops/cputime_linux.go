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
	d, err := os.Open("/proc")
	if err != nil {
		return 0, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return 0, err
	}
	self := strconv.Itoa(os.Getpid())
	var total int64
	buf := make([]byte, 0, 96)
	for _, n := range names {
		if n == self || n[0] < '0' || n[0] > '9' {
			continue
		}
		f, err := os.Open("/proc/" + n + "/schedstat")
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
