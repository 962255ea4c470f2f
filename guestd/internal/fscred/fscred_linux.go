//go:build linux

// Package fscred runs a function with another user's filesystem
// credentials: guestd stays root (it is the sandbox's init), but what it
// does on the agent's behalf (file requests, reading the agent's /proc
// entries) is checked by the kernel as that user.
//
// Linux keeps the filesystem uid/gid and the supplementary groups per
// thread. The function runs on a fresh goroutine locked to its OS thread
// and never unlocked, so the thread with changed credentials exits with the
// goroutine and no other goroutine ever runs on it (the Go runtime never
// starts new threads from a locked one).
package fscred

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Cred is a user's identity for filesystem access checks.
type Cred struct {
	UID, GID int
	// Groups are the supplementary groups; nil means none.
	Groups []int
}

// Root is the identity guestd runs with; Do runs fn directly for it.
var Root = Cred{}

// IsRoot reports whether c is uid 0 (access checks as guestd's own).
func (c Cred) IsRoot() bool { return c.UID == 0 }

// Do runs fn with c's filesystem credentials and returns its error. For
// root it runs fn on the calling goroutine.
func Do(c Cred, fn func() error) error {
	if c.IsRoot() {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see the package comment
		if err := set(c); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// set changes the calling thread's groups, fsgid and fsuid (in that order:
// changing groups needs CAP_SETGID, which a non-zero fsuid does not drop,
// but do the uid last anyway). Raw syscalls: the libc and Go wrappers
// apply these to every thread of the process.
func set(c Cred) error {
	gs := make([]uint32, len(c.Groups))
	for i, g := range c.Groups {
		gs[i] = uint32(g)
	}
	var p unsafe.Pointer
	if len(gs) > 0 {
		p = unsafe.Pointer(&gs[0])
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(gs)), uintptr(p), 0); e != 0 {
		return fmt.Errorf("fscred: setgroups: %w", e)
	}
	// setfsuid/setfsgid report the previous value and no error; read back.
	unix.RawSyscall(unix.SYS_SETFSGID, uintptr(c.GID), 0, 0)
	if r, _, _ := unix.RawSyscall(unix.SYS_SETFSGID, ^uintptr(0), 0, 0); int(r) != c.GID {
		return fmt.Errorf("fscred: setfsgid %d did not take", c.GID)
	}
	unix.RawSyscall(unix.SYS_SETFSUID, uintptr(c.UID), 0, 0)
	if r, _, _ := unix.RawSyscall(unix.SYS_SETFSUID, ^uintptr(0), 0, 0); int(r) != c.UID {
		return fmt.Errorf("fscred: setfsuid %d did not take", c.UID)
	}
	return nil
}
