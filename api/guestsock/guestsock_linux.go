//go:build linux

package guestsock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// resolveInSandbox is how the socket path is resolved below the sandbox's
// root: ".." and absolute names stay inside it, and no symlink (magic or
// not) is followed at all. guestd's path has none, so a symlink anywhere on
// it was planted.
const resolveInSandbox = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// Dial connects to the socket a names (see the package comment). A socket
// not there yet or not accepting fails with an error wrapping
// errdefs.ErrUnavailable (retry), and so does a process caught without a
// root for a moment (a thread other than its leader exec'ing); a pid that
// no longer names the sandbox's init with ErrProcessGone; a planted symlink
// or a non-socket with ErrUnsafePath; a caller not allowed to look into the
// process's root (not root, or not the sandbox's owner) with
// errdefs.ErrPermissionDenied.
func Dial(ctx context.Context, a Addr) (*net.UnixConn, error) {
	if err := a.Validate(); err != nil {
		return nil, err
	}
	fd, err := open(a)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	// connect(2) follows the magic link to the very inode fd holds.
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("guestsock: dial %s: %w", a, ctx.Err())
		}
		return nil, fmt.Errorf("guestsock: dial %s: %w: %w", a, errdefs.ErrUnavailable, err)
	}
	return c.(*net.UnixConn), nil
}

// open returns an O_PATH descriptor of the socket a names, checked.
func open(a Addr) (int, error) {
	proc, err := unix.Open("/proc/"+strconv.FormatUint(uint64(a.PID), 10), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, procErr(a, "open /proc entry", err)
	}
	defer unix.Close(proc)
	// proc pins the process: if it exits, lookups through proc fail rather
	// than reach a new process with the same pid. So a matching start time
	// read through it vouches for the root opened through it.
	start, err := startOf(proc)
	if err != nil {
		return -1, procErr(a, "read start time", err)
	}
	if start != a.Start {
		return -1, fmt.Errorf("%w: pid %d started at tick %d, the sandbox's init at %d (pid reused)", ErrProcessGone, a.PID, start, a.Start)
	}
	root, err := unix.Openat(proc, "root", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			if again, serr := startOf(proc); serr == nil && again == a.Start {
				// The pid still names the process, which has no root for
				// a moment: a thread other than the leader is exec'ing
				// (the old leader has exited and the exec'ing thread has
				// not taken its pid over yet; guestd's exec of its init
				// does that), or it exited and is not reaped yet. The one
				// passes, the other ends in ErrProcessGone at a retry.
				return -1, fmt.Errorf("guestsock: %s: %w: the process has no root at the moment (exec or exit in progress)", a, errdefs.ErrUnavailable)
			}
		}
		return -1, procErr(a, "open root", err)
	}
	defer unix.Close(root)
	fd, err := openat2Retry(root, strings.TrimPrefix(a.Path, "/"), &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: resolveInSandbox,
	})
	if err != nil {
		switch {
		case errors.Is(err, unix.ENOENT):
			return -1, fmt.Errorf("guestsock: %s: %w: no socket there (yet)", a, errdefs.ErrUnavailable)
		case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.EXDEV):
			return -1, fmt.Errorf("%w: %s: %v (a symlink or non-directory on the path)", ErrUnsafePath, a, err)
		case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
			return -1, fmt.Errorf("guestsock: %s: %w: %v", a, errdefs.ErrPermissionDenied, err)
		}
		return -1, fmt.Errorf("guestsock: %s: %w: %v", a, errdefs.ErrInternal, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("guestsock: %s: %w: fstat: %v", a, errdefs.ErrInternal, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		unix.Close(fd)
		return -1, fmt.Errorf("%w: %s is not a socket (mode %#o)", ErrUnsafePath, a, st.Mode&unix.S_IFMT)
	}
	return fd, nil
}

// openat2Retry retries EAGAIN, which RESOLVE_IN_ROOT returns when a rename
// raced the walk (the sandbox can cause that; it cannot make it last).
func openat2Retry(dirfd int, path string, how *unix.OpenHow) (int, error) {
	for i := 0; ; i++ {
		fd, err := unix.Openat2(dirfd, path, how)
		if (err != unix.EAGAIN && err != unix.EINTR) || i == 16 {
			return fd, err
		}
	}
}

// procErr classifies a failure to look at the sandbox's init.
func procErr(a Addr, what string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ESRCH):
		return fmt.Errorf("%w: pid %d: %s: %v", ErrProcessGone, a.PID, what, err)
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return fmt.Errorf("guestsock: pid %d: %s: %w: %v", a.PID, what, errdefs.ErrPermissionDenied, err)
	}
	return fmt.Errorf("guestsock: pid %d: %s: %w: %v", a.PID, what, errdefs.ErrInternal, err)
}

// ProcessStart returns a process's start time in clock ticks since boot
// (what Addr.Start records).
func ProcessStart(pid uint32) (uint64, error) {
	proc, err := unix.Open("/proc/"+strconv.FormatUint(uint64(pid), 10), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, procErr(Addr{PID: pid}, "open /proc entry", err)
	}
	defer unix.Close(proc)
	start, err := startOf(proc)
	if err != nil {
		return 0, procErr(Addr{PID: pid}, "read start time", err)
	}
	return start, nil
}

// startOf reads field 22 (starttime) of the stat file in a /proc/<pid>
// directory.
func startOf(proc int) (uint64, error) {
	fd, err := unix.Openat(proc, "stat", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	var buf [1024]byte
	n, err := unix.Read(fd, buf[:])
	if err != nil {
		return 0, err
	}
	return parseStart(buf[:n])
}

// parseStart extracts starttime from a /proc/<pid>/stat line. The command
// name (field 2) may hold spaces and parentheses: fields count from the
// last ')'.
func parseStart(stat []byte) (uint64, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat: no command field")
	}
	fields := strings.Fields(string(stat[i+1:]))
	const startField = 22 - 3 // fields[0] is field 3 (state)
	if len(fields) <= startField {
		return 0, fmt.Errorf("stat: %d fields", len(fields)+2)
	}
	v, err := strconv.ParseUint(fields[startField], 10, 64)
	if err != nil || v == 0 {
		return 0, fmt.Errorf("stat: start time %q", fields[startField])
	}
	return v, nil
}

// Self addresses path in this process's own root, as if this process were a
// sandbox's init: for tests and fakes that stand in for a sandbox (the
// dialing code stays the real one).
func Self(path string) (Addr, error) {
	pid := uint32(os.Getpid())
	start, err := ProcessStart(pid)
	if err != nil {
		return Addr{}, err
	}
	a := Addr{PID: pid, Start: start, Path: path}
	return a, a.Validate()
}
