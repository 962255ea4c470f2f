package sysops

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// InitPath is the sandbox's init in the desktop images: Debian's tini, its
// static build (same package), so a restore has no loader or libc of tini's
// to map.
//
// guestd does not stay PID 1 because of CRIU. On every dump of a sandbox in
// a user namespace CRIU (4.2) enters, from inside that user namespace, the
// other namespaces of the dump's root process, which needs ptrace access to
// it. A process CRIU restored keeps the host's user namespace as the owner
// of its memory (only exec changes that), and guestd is non-dumpable: in a
// replica, nothing inside the sandbox, CRIU's probe included, may open its
// /proc/<pid>/ns. With guestd as the dump's root a replica could not be
// checkpointed again ("Can't open <pid>/ns/net on procfs: Permission
// denied"). tini is the root instead: it holds nothing secret, so it stays
// dumpable, and guestd runs as its only child and reaper of the session.
const InitPath = "/usr/bin/tini-static"

// FlagUnderInit is the flag guestd, as PID 1, passes to itself under tini.
const FlagUnderInit = "under-init"

// FlagTokensFD names the pipe the tokens come through under tini: they
// never pass through tini's environment, which stays readable in the
// sandbox.
const FlagTokensFD = "tokens-fd"

var underInit atomic.Bool

// SandboxInit reports whether guestd is the top of its sandbox: PID 1 of
// its PID namespace, or tini's child there. /proc then shows the sandbox's
// processes only, and guestd reaps and stops them.
func SandboxInit() bool { return os.Getpid() == 1 || underInit.Load() }

// SetUnderInit records that guestd runs under tini (--under-init). It
// refuses anywhere else: taken for the top of a host's processes, guestd
// would stop and kill them.
func SetUnderInit() error {
	if os.Getppid() != 1 {
		return fmt.Errorf("--%s: guestd's parent is pid %d, not the sandbox's init", FlagUnderInit, os.Getppid())
	}
	underInit.Store(true)
	return nil
}

// GuestdOrInit reports whether pid is guestd or, under tini, the init: the
// processes that are not the sandbox's session.
func GuestdOrInit(pid int) bool {
	return pid == os.Getpid() || (pid == 1 && underInit.Load())
}

// ExecInit replaces guestd, as PID 1, with tini running guestd again
// (--under-init, args after). The tokens go to the new guestd through a
// pipe, never through tini's environment. It returns only when it could not
// exec: guestd then stays the init.
func ExecInit(args []string, tokenVars ...string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	var secret strings.Builder
	for _, v := range tokenVars {
		t := os.Getenv(v)
		if strings.ContainsAny(t, "\n\x00") {
			return fmt.Errorf("%s holds a newline or NUL", v)
		}
		secret.WriteString(t + "\n")
	}
	if secret.Len() > 4096 { // far under a pipe's buffer: the write cannot block
		return errors.New("tokens longer than 4 KiB")
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return fmt.Errorf("pipe: %w", err)
	}
	r, w := p[0], p[1]
	_, err = unix.Write(w, []byte(secret.String()))
	unix.Close(w)
	if err != nil {
		unix.Close(r)
		return fmt.Errorf("pipe: %w", err)
	}
	// Only the read end reaches tini and, through it, guestd.
	if _, err := unix.FcntlInt(uintptr(r), unix.F_SETFD, 0); err != nil {
		unix.Close(r)
		return fmt.Errorf("pipe: %w", err)
	}
	argv := append([]string{InitPath, "--", self, "--" + FlagUnderInit, "--" + FlagTokensFD + "=" + strconv.Itoa(r)}, args...)
	err = unix.Exec(InitPath, argv, SanitizedEnv(os.Environ(), tokenVars...))
	unix.Close(r)
	return fmt.Errorf("exec %s: %w", InitPath, err)
}

// ReadTokens reads what ExecInit sent through fd, one value per name, and
// closes fd.
func ReadTokens(fd int, names ...string) (map[string]string, error) {
	f := os.NewFile(uintptr(fd), "tokens")
	if f == nil {
		return nil, fmt.Errorf("--%s=%d: not a file descriptor", FlagTokensFD, fd)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 8192))
	if err != nil {
		return nil, fmt.Errorf("--%s: %w", FlagTokensFD, err)
	}
	vals := strings.Split(string(b), "\n")
	if len(vals) != len(names)+1 || vals[len(names)] != "" {
		return nil, fmt.Errorf("--%s: %d values, want %d", FlagTokensFD, len(vals)-1, len(names))
	}
	out := make(map[string]string, len(names))
	for i, n := range names {
		out[n] = vals[i]
	}
	return out, nil
}
