// Package guestsock reaches guestd's unix socket inside a running sandbox
// from the host, without trusting anything the sandbox can shape.
//
// A sandbox's root is hostile: root inside it can replace any component of
// /run/forkfleet/aci.sock with a symlink. Dialing
// /proc/<pid>/root/run/forkfleet/aci.sock as a plain path lets the kernel
// follow an absolute symlink against the host's root, so the dialer (and the
// token and bytes it then sends) would land on whatever host socket the
// sandbox names. And a pid outlives nothing: once the sandbox is gone its
// pid can name another sandbox's init.
//
// Dial therefore pins the process (a /proc/<pid> directory handle whose
// start time must match the one recorded when the sandbox started), opens
// its root through that handle, resolves the socket path inside that root
// with openat2(RESOLVE_IN_ROOT|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS)
// as an O_PATH handle, checks that it is a socket, and connects through
// /proc/self/fd/<handle>: the socket reached is the inode checked, wherever
// the sandbox moves its names meanwhile.
//
// Every host-side dialer of a sandbox's guestd uses this package: controld's
// admin sessions and ACI gateway, and the Go client library (aci.DialSandbox)
// when a trainer on the host uses Endpoint.unix_path.
package guestsock

import (
	"fmt"
	"path"
	"strconv"
	"strings"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// Addr names guestd's socket of one running sandbox as the host reaches it.
// The zero Addr names nothing.
type Addr struct {
	// PID is the sandbox's init in the host's pid namespace.
	PID uint32
	// Start is that process's start time (/proc/<pid>/stat field 22, clock
	// ticks since boot), taken when the sandbox started: Dial refuses a pid
	// that now belongs to another process.
	Start uint64
	// Path is the socket's absolute path inside the sandbox.
	Path string
}

// IsZero reports whether a names no socket.
func (a Addr) IsZero() bool { return a == Addr{} }

// String is the host path the address goes through,
// /proc/<pid>/root<path>: for logs and Endpoint.unix_path. Never connect(2)
// to it directly (see the package comment); Parse turns it back into an
// Addr.
func (a Addr) String() string {
	if a.IsZero() {
		return ""
	}
	return "/proc/" + strconv.FormatUint(uint64(a.PID), 10) + "/root" + a.Path
}

// Validate checks the address's shape.
func (a Addr) Validate() error {
	if a.PID == 0 {
		return fmt.Errorf("guestsock: no pid: %w", errdefs.ErrInvalidArgument)
	}
	if a.Start == 0 {
		return fmt.Errorf("guestsock: pid %d without its start time: %w", a.PID, errdefs.ErrInvalidArgument)
	}
	if !path.IsAbs(a.Path) || path.Clean(a.Path) != a.Path || a.Path == "/" {
		return fmt.Errorf("guestsock: socket path %q is not a clean absolute file path: %w", a.Path, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Parse is the inverse of String: hostPath is /proc/<pid>/root<path>, start
// the process's start time that came with it.
func Parse(hostPath string, start uint64) (Addr, error) {
	rest, ok := strings.CutPrefix(hostPath, "/proc/")
	if !ok {
		return Addr{}, fmt.Errorf("guestsock: %q is not /proc/<pid>/root/<path>: %w", hostPath, errdefs.ErrInvalidArgument)
	}
	pidStr, inner, ok := strings.Cut(rest, "/root/")
	if !ok {
		return Addr{}, fmt.Errorf("guestsock: %q is not /proc/<pid>/root/<path>: %w", hostPath, errdefs.ErrInvalidArgument)
	}
	pid, err := strconv.ParseUint(pidStr, 10, 32)
	if err != nil || pid == 0 {
		return Addr{}, fmt.Errorf("guestsock: %q: bad pid %q: %w", hostPath, pidStr, errdefs.ErrInvalidArgument)
	}
	a := Addr{PID: uint32(pid), Start: start, Path: "/" + inner}
	if err := a.Validate(); err != nil {
		return Addr{}, err
	}
	return a, nil
}

// Errors Dial wraps besides the errdefs classes.
var (
	// ErrProcessGone: the pid no longer names the process the address was
	// made for (it exited, or the pid was reused). Also errdefs.ErrNotFound.
	ErrProcessGone = classed("guestsock: the sandbox's init process is gone", errdefs.ErrNotFound)
	// ErrUnsafePath: a component of the socket path inside the sandbox is a
	// symlink, or the path names something other than a socket. The
	// sandbox did that (guestd never does). Also
	// errdefs.ErrFailedPrecondition.
	ErrUnsafePath = classed("guestsock: unsafe socket path in the sandbox", errdefs.ErrFailedPrecondition)
)

type classedError struct {
	msg   string
	class error
}

func classed(msg string, class error) error { return &classedError{msg: msg, class: class} }

func (e *classedError) Error() string { return e.msg }
func (e *classedError) Unwrap() error { return e.class }
