//go:build linux

package network

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"path/filepath"

	"github.com/forkfleet/forkfleet/api/netnsfile"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// A sandbox's network namespace is made by runc when it creates the
// sandbox, and by CRIU when it restores one, inside the sandbox's user
// namespace: only its owner may mount sysfs for it, and CRIU dumps only
// namespaces that belong to the user namespace it dumps (a namespace
// controld made would be the host's). runc runs the sandbox's createRuntime
// hook, forkfleet-nethook, as soon as the namespaces exist: at a boot
// before the sandbox's process runs, at a restore on CRIU's
// setup-namespaces notification, before any restored process runs and
// before CRIU restores the sockets that are bound to the sandbox's
// addresses. The hook calls Attach, which makes that namespace the
// sandbox's network as Setup prepared it.

// RunHook is forkfleet-nethook: args are Sandbox.HookArgs, state is the
// OCI state runc writes on the hook's stdin (the pid of the process whose
// namespaces were just made: runc's init, or CRIU's first restored task).
func RunHook(args []string, state io.Reader) error {
	fs := flag.NewFlagSet("forkfleet-nethook", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	pin := fs.String("pin", "", "where the sandbox's network namespace is bound")
	router := fs.String("router", "", "the sandbox's router namespace (mode egress)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var st struct {
		Pid int `json:"pid"`
	}
	if err := json.NewDecoder(io.LimitReader(state, 1<<20)).Decode(&st); err != nil {
		return fmt.Errorf("OCI state on stdin: %w", err)
	}
	if st.Pid <= 0 {
		return fmt.Errorf("OCI state on stdin names no process (pid %d)", st.Pid)
	}
	return Attach(st.Pid, *pin, *router)
}

// Attach makes the network namespace of process pid a sandbox's: it binds
// it at pin (the file Setup made, where controld enters it from then on),
// brings lo up (runc does at a boot; nothing does at a restore, and a
// replica without loopback is not a copy) and, with router (mode egress),
// moves the sandbox's end of its link from the router namespace in, with
// the sandbox's address and default route and without IPv6.
func Attach(pid int, pin, router string) error {
	if !filepath.IsAbs(pin) || (router != "" && !filepath.IsAbs(router)) {
		return fmt.Errorf("pin %q and router %q must be absolute paths", pin, router)
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/net", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("network namespace of process %d: %w", pid, err)
	}
	defer unix.Close(fd)
	var ns, host unix.Stat_t
	if err := unix.Fstat(fd, &ns); err != nil {
		return err
	}
	// The calling thread's: a Go program's main thread may be parked in
	// another namespace (a locked goroutine that exited on it).
	if err := unix.Stat("/proc/thread-self/ns/net", &host); err != nil {
		return err
	}
	if ns.Dev == host.Dev && ns.Ino == host.Ino {
		return fmt.Errorf("process %d runs in the host's network namespace, not one of its own", pid)
	}
	if err := pinNetns(fd, pin); err != nil {
		return err
	}
	h, err := routeHandle(netns.NsHandle(fd))
	if err != nil {
		return fmt.Errorf("netlink in the sandbox's namespace: %w", err)
	}
	defer h.Close()
	if err := linkAddr(h, "lo", netip.Prefix{}, true); err != nil {
		return err
	}
	if router == "" {
		return nil
	}
	err = withHandle(router, func(rt *netlink.Handle) error {
		l, err := rt.LinkByName(sandboxIf)
		if err != nil {
			return fmt.Errorf("the sandbox's link in its router namespace: %w", err)
		}
		return rt.LinkSetNsFd(l, fd)
	})
	if err != nil {
		return err
	}
	if err := linkAddr(h, sandboxIf, SandboxAddr, true); err != nil {
		return err
	}
	if err := h.RouteAdd(&netlink.Route{Gw: net.IP(GatewayAddr.Addr().AsSlice())}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	// A device gets its new namespace's defaults when it moves in.
	return netnsfile.Run(pin, func() error { return writeSysctl("net/ipv6/conf/"+sandboxIf+"/disable_ipv6", "1") })
}

// pinNetns binds the namespace open at fd to pin, an empty file on the
// filesystem of its directory: one that is bound already (a hook run twice)
// is refused.
func pinNetns(fd int, pin string) error {
	var st, dir unix.Stat_t
	if err := unix.Lstat(pin, &st); err != nil {
		return fmt.Errorf("pin %s: %w", pin, err)
	}
	if err := unix.Stat(filepath.Dir(pin), &dir); err != nil {
		return fmt.Errorf("pin %s: %w", pin, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Dev != dir.Dev {
		return fmt.Errorf("pin %s: %w", pin, errPinned)
	}
	if err := unix.Mount(fmt.Sprintf("/proc/self/fd/%d", fd), pin, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind the network namespace at %s: %w", pin, err)
	}
	return nil
}

var errPinned = errors.New("not an unbound pin (the namespace is bound already)")

// routeHandle is a netlink handle in namespace ns (the calling thread's
// when ns is netns.None()) for links, addresses and routes only. netlink's
// default handle also opens XFRM and NETFILTER sockets in the namespace:
// in a sandbox's new namespace the first XFRM socket took up to 7 ms, on
// the hook's path, inside every memory-tier restore (CRIU's setup-namespaces
// notification waits for it).
func routeHandle(ns netns.NsHandle) (*netlink.Handle, error) {
	if ns == netns.None() {
		return netlink.NewHandle(unix.NETLINK_ROUTE)
	}
	return netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
}
