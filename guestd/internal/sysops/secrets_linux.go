package sysops

import (
	"os"

	"golang.org/x/sys/unix"
)

// Undumpable closes guestd's memory and environment to the sandbox:
// /proc/<guestd>/{environ,mem,fd,maps}, ptrace and process_vm_readv then
// need CAP_SYS_PTRACE over guestd's user namespace, which no process of the
// sandbox holds (not even its root). guestd's tokens, the memory mark and
// everything else in its heap stay guestd's. CRIU dumps and restores the
// flag; guestd sets it again whenever it installs new secrets anyway, and
// so must anything that changes its credentials (which resets it).
func Undumpable() error {
	return unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
}

// Dumpable reports the process's dumpable flag.
func Dumpable() (bool, error) {
	v, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
	return v != 0, err
}

// ScrubEnv removes names from the process's environment as Go and the C
// library see it (os.Environ, children's defaults). The kernel's copy of the
// initial environment (/proc/self/environ) keeps them; Undumpable closes
// that one.
func ScrubEnv(names ...string) {
	for _, n := range names {
		os.Unsetenv(n)
	}
}
