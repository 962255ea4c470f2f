//go:build linux

package x11

import "golang.org/x/sys/unix"

// inputWaitSyscalls are the system calls an event loop sleeps in.
var inputWaitSyscalls = []int{
	unix.SYS_POLL, unix.SYS_PPOLL, unix.SYS_SELECT, unix.SYS_PSELECT6,
	unix.SYS_EPOLL_WAIT, unix.SYS_EPOLL_PWAIT, unix.SYS_EPOLL_PWAIT2,
}
