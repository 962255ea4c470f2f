package hostinfo

import (
	"errors"
	"os"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"unsafe"
)

// kmsgPath is the kernel's log as records (one per read).
const kmsgPath = "/dev/kmsg"

// Hypervisor returns what the kernel logged at boot as "Hypervisor
// detected: X" (KVM, PVM, Microsoft Hyper-V...). A CPU model does not tell
// hosts apart that run the same CPU under different hypervisors, whose
// memory costs differ tenfold. Empty on bare metal, without the right to
// read the log, or once the boot lines have left its ring buffer.
func Hypervisor() string {
	// A raw non-blocking fd: through os.File the runtime's poller would
	// wait for the next record instead of returning EAGAIN at the end.
	fd, err := syscall.Open(kmsgPath, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return ""
	}
	defer syscall.Close(fd)
	buf := make([]byte, 8192)
	// Bounded: the boot lines come first, and a busy log must not keep a
	// fingerprint reading.
	for range 100000 {
		n, err := syscall.Read(fd, buf)
		if errors.Is(err, syscall.EPIPE) {
			continue // a record was overwritten while read: go on with the next
		}
		if err != nil || n <= 0 {
			return ""
		}
		if h, ok := parseHypervisorRecord(string(buf[:n])); ok {
			return h
		}
	}
	return ""
}

// parseHypervisorRecord reads one /dev/kmsg record ("PRI,SEQ,TS,FLAGS;text"
// then continuation lines).
func parseHypervisorRecord(rec string) (string, bool) {
	_, text, ok := strings.Cut(rec, ";")
	if !ok {
		return "", false
	}
	text, _, _ = strings.Cut(text, "\n")
	h, ok := strings.CutPrefix(text, "Hypervisor detected: ")
	if h = strings.TrimSpace(h); !ok || h == "" {
		return "", false
	}
	return h, true
}

// Page-touch probe: rounds of pageTouchBytes each, the median kept.
const (
	pageTouchBytes  = 16 << 20
	pageTouchRounds = 5
)

// PageTouchNs measures, in ns per page, a process's first write to fresh
// 4 KiB pages of anonymous memory: the kernel's fault and zeroing, and
// under a hypervisor that shadows page tables (PVM) its own fault too. It
// is the unit of a restore's page copy and of every copy-on-write, so
// results of hosts with different values are not comparable in absolute
// terms. Huge pages are refused for the probe's mapping so that every host
// measures the same 4 KiB faults. 0 when the probe cannot map memory.
func PageTouchNs() float64 {
	// Thread CPU time, not wall time: a probe descheduled for a while by a
	// busy host would otherwise report the wait as the fault's price.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	page := os.Getpagesize()
	rounds := make([]float64, 0, pageTouchRounds)
	for range pageTouchRounds {
		mem, err := syscall.Mmap(-1, 0, pageTouchBytes, syscall.PROT_READ|syscall.PROT_WRITE,
			syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS)
		if err != nil {
			return 0
		}
		_ = syscall.Madvise(mem, syscall.MADV_NOHUGEPAGE)
		start, err := threadCPU()
		for off := 0; off < len(mem); off += page {
			mem[off] = 1
		}
		end, err2 := threadCPU()
		_ = syscall.Munmap(mem)
		if err != nil || err2 != nil {
			return 0
		}
		rounds = append(rounds, float64(end-start)/float64(len(mem)/page))
	}
	slices.Sort(rounds)
	return rounds[len(rounds)/2]
}

// threadCPU is the calling thread's CPU time in ns.
func threadCPU() (int64, error) {
	var ts syscall.Timespec
	if _, _, e := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTimeID, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return 0, e
	}
	return ts.Nano(), nil
}

// clockThreadCPUTimeID is CLOCK_THREAD_CPUTIME_ID (linux/time.h).
const clockThreadCPUTimeID = 3
