//go:build linux

package containerdrt

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/forkfleet/forkfleet/api/netnsfile"
	"golang.org/x/sys/unix"
)

// CRIU cannot dump a unix stream socket whose peer lives outside the dumped
// tree, nor a connection still in a listener's accept queue whose client
// went away. Both appear for a moment after controld closes its guestd
// session right before a checkpoint (the guest has not closed its end yet).
// unixWatcher finds them so the checkpoint can wait for them to settle
// before freezing.
//
// A connection accepted by a sandbox process from a client outside belongs
// to the CLIENT's network namespace (the kernel creates the server end in
// the connector's namespace), so it is found as a socket held by a sandbox
// process that sock_diag lists in the runtime's own namespace. Queued
// connections show up as "icons" of the sandbox's listeners.

// sock_diag constants (linux/sock_diag.h, linux/unix_diag.h).
const (
	sockDiagByFamily = 20
	udiagShowPeer    = 0x4
	udiagShowIcons   = 0x8
	unixDiagPeer     = 2
	unixDiagIcons    = 3
	unixDiagMsgLen   = 16 // struct unix_diag_msg
	unixDiagReqLen   = 24 // struct unix_diag_req
)

type unixWatcher struct {
	sandboxFD int    // NETLINK_SOCK_DIAG socket created inside the sandbox's netns
	ownFD     int    // NETLINK_SOCK_DIAG socket in the runtime's own netns
	procs     string // cgroup.procs listing the sandbox's processes
}

// newUnixWatcher opens a sock_diag socket in the network namespace of pid
// (a netlink socket answers for the namespace it was made in).
func newUnixWatcher(pid uint32, procs string) (*unixWatcher, error) {
	sandboxFD := -1
	err := netnsfile.Run("/proc/"+strconv.FormatUint(uint64(pid), 10)+"/ns/net", func() (err error) {
		sandboxFD, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("sock_diag socket in the sandbox: %w", err)
	}
	own, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		unix.Close(sandboxFD)
		return nil, fmt.Errorf("sock_diag socket: %w", err)
	}
	return &unixWatcher{sandboxFD: sandboxFD, ownFD: own, procs: procs}, nil
}

func (w *unixWatcher) Close() error {
	return errors.Join(unix.Close(w.sandboxFD), unix.Close(w.ownFD))
}

// unsettled counts what CRIU would refuse in the sandbox: sockets its
// processes hold that live in the runtime's namespace (connections
// accepted from outside), sockets of its namespace connected outside, and
// queued connections on its listeners.
func (w *unixWatcher) unsettled() (int, error) {
	own, err := diagUnix(w.ownFD)
	if err != nil {
		return 0, err
	}
	held, err := heldSockets(w.procs)
	if err != nil {
		return 0, err
	}
	n := 0
	for ino := range held {
		if own.inodes[ino] {
			n++
		}
	}
	sb, err := diagUnix(w.sandboxFD)
	if err != nil {
		return 0, err
	}
	for _, p := range sb.peers {
		if !sb.inodes[p] && !held[p] {
			n++
		}
	}
	return n + sb.queued, nil
}

// heldSockets returns the inodes of the sockets the processes listed in
// procs hold open.
func heldSockets(procs string) (map[uint32]bool, error) {
	b, err := os.ReadFile(procs)
	if err != nil {
		return nil, err
	}
	held := map[uint32]bool{}
	for _, pid := range strings.Fields(string(b)) {
		dir := "/proc/" + pid + "/fd"
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue // exited meanwhile
		}
		for _, fd := range fds {
			link, err := os.Readlink(dir + "/" + fd.Name())
			if err != nil {
				continue
			}
			if v, ok := strings.CutPrefix(link, "socket:["); ok {
				if ino, err := strconv.ParseUint(strings.TrimSuffix(v, "]"), 10, 32); err == nil {
					held[uint32(ino)] = true
				}
			}
		}
	}
	return held, nil
}

type unixDiag struct {
	inodes map[uint32]bool
	peers  []uint32
	queued int
}

// diagUnix lists the unix sockets of the netlink socket's namespace.
func diagUnix(fd int) (unixDiag, error) {
	d := unixDiag{inodes: map[uint32]bool{}}
	req := make([]byte, unix.NLMSG_HDRLEN+unixDiagReqLen)
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], sockDiagByFamily)
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	body := req[unix.NLMSG_HDRLEN:]
	body[0] = unix.AF_UNIX
	binary.NativeEndian.PutUint32(body[4:], 0xffffffff) // every state
	binary.NativeEndian.PutUint32(body[12:], udiagShowPeer|udiagShowIcons)
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return d, fmt.Errorf("sock_diag request: %w", err)
	}
	buf := make([]byte, 32<<10)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return d, fmt.Errorf("sock_diag reply: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return d, fmt.Errorf("sock_diag reply: %w", err)
		}
		for _, m := range msgs {
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return d, nil
			case unix.NLMSG_ERROR:
				return d, fmt.Errorf("sock_diag: netlink error")
			}
			if len(m.Data) < unixDiagMsgLen {
				continue
			}
			d.inodes[binary.NativeEndian.Uint32(m.Data[4:])] = true
			attrs := m.Data[unixDiagMsgLen:]
			for len(attrs) >= unix.SizeofRtAttr {
				l := int(binary.NativeEndian.Uint16(attrs[0:]))
				typ := binary.NativeEndian.Uint16(attrs[2:])
				if l < unix.SizeofRtAttr || l > len(attrs) {
					break
				}
				val := attrs[unix.SizeofRtAttr:l]
				switch typ {
				case unixDiagPeer:
					if len(val) >= 4 {
						if p := binary.NativeEndian.Uint32(val); p != 0 {
							d.peers = append(d.peers, p)
						}
					}
				case unixDiagIcons:
					d.queued += len(val) / 4
				}
				next := (l + unix.RTA_ALIGNTO - 1) &^ (unix.RTA_ALIGNTO - 1)
				if next > len(attrs) {
					break
				}
				attrs = attrs[next:]
			}
		}
	}
}

// waitUnixSettled polls until the sandbox has no unix socket CRIU would
// refuse, or until timeout (the dump then decides). It reports how many
// remained.
func waitUnixSettled(ctx context.Context, pid uint32, procs string, timeout time.Duration) (int, error) {
	w, err := newUnixWatcher(pid, procs)
	if err != nil {
		return 0, err
	}
	defer w.Close()
	deadline := time.Now().Add(timeout)
	delay := 200 * time.Microsecond
	for {
		n, err := w.unsettled()
		if err != nil || n == 0 || time.Now().After(deadline) {
			return n, err
		}
		select {
		case <-ctx.Done():
			return n, ctx.Err()
		case <-time.After(delay):
		}
		delay = min(delay*2, 5*time.Millisecond)
	}
}
