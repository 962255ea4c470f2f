//go:build linux

package containerdrt

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// A lazy restore's tasks need a userfaultfd each, made by CRIU inside the
// sandbox's user namespace, where userfaultfd(2) is refused unless the host
// sets vm.unprivileged_userfaultfd=1 (every unprivileged process on the host
// would get kernel-mode userfaultfds). /dev/userfaultfd makes the same uffd
// with no such setting (USERFAULTFD_IOC_NEW; only the device file's mode is
// checked, at open). CRIU cannot open it itself: runc moves CRIU into the
// container's cgroup before the restore, and the sandbox's device rules
// refuse the device. So controld hands an open one to the restore's CRIU:
// the CRIU preload library (deploy/criu/uffd.c), when CRIU connects to its
// page server's lazy-pages.socket, connects to userfaultfdSocket beside it
// and keeps the descriptor for the restored tasks, each of which makes its
// uffd with it and closes it before it runs. docs/security.md.
const (
	userfaultfdSocket = "userfaultfd.socket"
	userfaultfdDevice = "/dev/userfaultfd"
)

// userfaultfdServer hands /dev/userfaultfd to the CRIU of one restore.
type userfaultfdServer struct {
	l    *net.UnixListener
	path string
	done chan struct{}
}

// serveUserfaultfd listens on workDir's userfaultfdSocket (workDir is
// controld's own: no sandbox can shape it) and answers every connection
// from root with one byte carrying an open /dev/userfaultfd. A device that
// cannot be opened fails here, before the restore.
func serveUserfaultfd(workDir string) (*userfaultfdServer, error) {
	dev, err := openUserfaultfd()
	if err != nil {
		return nil, err
	}
	dev.Close()
	path := filepath.Join(workDir, userfaultfdSocket)
	os.Remove(path)
	// Bound through the directory's descriptor: a socket path is at most
	// 107 bytes, and CRIU reaches this one relative to its work dir.
	dir, err := os.OpenFile(workDir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("userfaultfd socket: %w: %w", errdefs.ErrInternal, err)
	}
	defer dir.Close()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), userfaultfdSocket), Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("userfaultfd socket: %w: %w", errdefs.ErrInternal, err)
	}
	l.SetUnlinkOnClose(true)
	s := &userfaultfdServer{l: l, path: path, done: make(chan struct{})}
	go s.serve()
	return s, nil
}

func openUserfaultfd() (*os.File, error) {
	fd, err := unix.Open(userfaultfdDevice, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "LAZY_RESTORE_UNAVAILABLE",
			"lazy restore needs %s (Linux 6.1 with CONFIG_USERFAULTFD, open to controld: its unit's DeviceAllow): %v", userfaultfdDevice, err)
	}
	return os.NewFile(uintptr(fd), userfaultfdDevice), nil
}

func (s *userfaultfdServer) serve() {
	defer close(s.done)
	for {
		c, err := s.l.AcceptUnix()
		if err != nil {
			return // closed
		}
		s.answer(c)
	}
}

// answer sends the device to a root peer (CRIU runs as root; the socket's
// directory is root's alone too).
func (s *userfaultfdServer) answer(c *net.UnixConn) {
	defer c.Close()
	raw, err := c.SyscallConn()
	if err != nil {
		return
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil || cerr != nil || cred.Uid != 0 {
		return
	}
	dev, err := openUserfaultfd()
	if err != nil {
		return
	}
	defer dev.Close()
	c.WriteMsgUnix([]byte{0}, unix.UnixRights(int(dev.Fd())), nil)
}

// Close stops listening and removes the socket.
func (s *userfaultfdServer) Close() error {
	if s == nil {
		return nil
	}
	err := s.l.Close()
	<-s.done
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
