package sysops

import (
	"errors"

	"golang.org/x/sys/unix"
)

// MergeMemory opts the process, and every process it starts from now on,
// into KSM (PR_SET_MEMORY_MERGE): replicas forked from one checkpoint share
// most of their pages, and the kernel merges them only where asked. CRIU
// restores each mapping's advice but not this process-wide flag, so a
// replica's guestd sets it again in restored: without it memory mapped
// after the restore, and every process started after it, is never merged.
// A kernel without the call (< 6.4, EINVAL) is not an error: there is
// nothing to opt into.
func MergeMemory() error {
	if err := unix.Prctl(unix.PR_SET_MEMORY_MERGE, 1, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return err
	}
	return nil
}

// MemoryMerged reports whether the process is opted into KSM
// (PR_GET_MEMORY_MERGE).
func MemoryMerged() (bool, error) {
	v, err := unix.PrctlRetInt(unix.PR_GET_MEMORY_MERGE, 0, 0, 0, 0)
	return v == 1, err
}
