//go:build linux && !amd64

package x11

import "golang.org/x/sys/unix"

// inputWaitSyscalls are the system calls an event loop sleeps in.
var inputWaitSyscalls = []int{unix.SYS_PPOLL, unix.SYS_PSELECT6, unix.SYS_EPOLL_PWAIT, unix.SYS_EPOLL_PWAIT2}
