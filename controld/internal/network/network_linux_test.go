//go:build linux

package network

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/api/netnsfile"
	"github.com/forkfleet/forkfleet/controld/internal/network/nettest"
)

func rootTest(t *testing.T) {
	t.Helper()
	if os.Getenv("FORKFLEET_INTEGRATION") != "1" {
		t.Skip("set FORKFLEET_INTEGRATION=1 to run the root network tests")
	}
	if os.Geteuid() != 0 {
		t.Fatal("FORKFLEET_INTEGRATION=1 needs root (namespaces, links, nftables)")
	}
}

// testConfig gives a test its own table, interface prefix and uplink range,
// so it never meets controld's (or another test's) sandboxes.
func testConfig(t *testing.T, dns netip.AddrPort) Config {
	var b [2]byte
	rand.Read(b[:])
	tag := hex.EncodeToString(b[:])
	return Config{
		RunDir:      t.TempDir(),
		Table:       "forkfleet_test_" + tag,
		IfPrefix:    "t" + tag,
		UplinkCIDR:  netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 203, b[0], b[1] & 0xc0}), 26),
		DNSUpstream: []netip.AddrPort{dns},
	}
}

func newTestManager(t *testing.T, cfg Config) *Manager {
	t.Helper()
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.EgressError(); err != nil {
		t.Fatalf("egress unavailable (deploy/host-setup.sh sets the host up): %v", err)
	}
	t.Cleanup(func() {
		m.Close()
		m.Prune(context.Background(), func(string) bool { return false })
		m.RemoveTable()
	})
	return m
}

// get fetches url from inside the namespace at ns.
func get(ns, url string) (string, error) {
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (conn net.Conn, err error) {
			err = netnsfile.Run(ns, func() error {
				var d net.Dialer
				conn, err = d.DialContext(ctx, network, addr)
				return err
			})
			return conn, err
		},
	}}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func dialFrom(ns, addr string) error {
	return netnsfile.Run(ns, func() error {
		c, err := net.DialTimeout("tcp", addr, 700*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err
	})
}

func listenIn(t *testing.T, ns, addr string) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := netnsfile.Run(ns, func() (err error) { ln, err = net.Listen("tcp4", addr); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, "hello")
			c.Close()
		}
	}()
	return ln
}

// attach does what runc and the network hook do for a sandbox: a process
// in network and user namespaces of its own (a sandbox's init, root mapped
// to an unprivileged host id), then the hook with its pid, as runc runs it.
func attach(t *testing.T, sb Sandbox) {
	t.Helper()
	cmd := exec.Command("sleep", "3600")
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWNET | syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 3 << 28, Size: 65536}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 3 << 28, Size: 65536}},
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	state := fmt.Sprintf(`{"ociVersion":"1.0.2","id":"x","status":"creating","pid":%d,"bundle":"/b"}`, cmd.Process.Pid)
	if err := RunHook(sb.HookArgs, strings.NewReader(state)); err != nil {
		t.Fatalf("hook %v: %v", sb.HookArgs, err)
	}
	// Run again (runc never does), the hook refuses: the pin is taken.
	if err := RunHook(sb.HookArgs, strings.NewReader(state)); !errors.Is(err, errPinned) {
		t.Errorf("second hook run: %v, want %v", err, errPinned)
	}
}

func loUp(t *testing.T, ns string) bool {
	t.Helper()
	up := false
	err := withHandle(ns, func(h *netlink.Handle) error {
		l, err := h.LinkByName("lo")
		if err == nil {
			up = l.Attrs().Flags&net.FlagUp != 0
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return up
}

func TestRootSandboxNetworks(t *testing.T) {
	rootTest(t)
	answer := netip.MustParseAddr("198.18.255.254")
	out := nettest.NewOutside(t, answer)
	cfg := testConfig(t, out.DNS)
	m := newTestManager(t, cfg)
	ctx := context.Background()

	none, err := m.Setup(ctx, "none", ModeNone, Policy{}, false)
	if err != nil {
		t.Fatal(err)
	}
	attach(t, none)
	if !loUp(t, none.NetNS) {
		t.Error("mode none: lo is down")
	}
	if err := dialFrom(none.NetNS, out.Addr.String()+":80"); err == nil {
		t.Error("mode none reached the outside host")
	}

	open, err := m.Setup(ctx, "open", ModeEgress, Policy{}, false)
	if err != nil {
		t.Fatal(err)
	}
	deny := Policy{Deny: []Rule{{CIDR: netip.PrefixFrom(out.Addr, 32), Proto: ProtoTCP, Ports: []PortRange{{80, 80}}}}}
	closed, err := m.Setup(ctx, "closed", ModeEgress, deny, false)
	if err != nil {
		t.Fatal(err)
	}
	attach(t, open)
	attach(t, closed)
	if !loUp(t, open.NetNS) || open.ResolvConf == "" {
		t.Errorf("egress sandbox: lo up %v, resolv.conf %q", loUp(t, open.NetNS), open.ResolvConf)
	}
	if body, err := get(open.NetNS, out.HTTPURL); err != nil || !strings.HasPrefix(body, "outside ") {
		t.Errorf("egress allowed: %q, %v", body, err)
	}
	if _, err := get(closed.NetNS, out.HTTPURL); err == nil {
		t.Error("egress denied by policy got through")
	}
	// An allow list that does not name the outside host denies it too.
	if err := m.SetPolicy(ctx, "closed", Policy{Allow: []Rule{{CIDR: netip.MustParsePrefix("192.0.2.0/24")}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := get(closed.NetNS, out.HTTPURL); err == nil {
		t.Error("egress outside the allow list got through")
	}
	if err := m.SetPolicy(ctx, "closed", Policy{Allow: []Rule{{CIDR: netip.PrefixFrom(out.Addr, 32), Proto: ProtoTCP, Ports: []PortRange{{80, 80}}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := get(closed.NetNS, out.HTTPURL); err != nil {
		t.Errorf("egress allowed after the policy changed: %v", err)
	}

	// The host itself, other sandboxes and link-local addresses are never
	// reachable: a host listener on every address, a sandbox listener.
	hostLn, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hostLn.Close()
	go func() {
		for {
			c, err := hostLn.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := hostLn.Addr().(*net.TCPAddr).Port
	if err := dialFrom(m.netnsPath("none"), "127.0.0.1:1"); err == nil {
		t.Error("unexpected listener")
	}
	hostUp, _ := m.uplink(m.state["open"].Index)
	for _, a := range []netip.Addr{out.HostAddr, hostUp.Addr(), netip.MustParseAddr("169.254.169.254")} {
		if err := dialFrom(open.NetNS, fmt.Sprintf("%s:%d", a, port)); err == nil {
			t.Errorf("sandbox reached %s:%d", a, port)
		}
	}
	listenIn(t, closed.NetNS, "0.0.0.0:8080")
	other, _ := m.Outside("closed")
	if err := dialFrom(open.NetNS, other.String()+":8080"); err == nil {
		t.Error("a sandbox reached another sandbox's outside address")
	}
	if a, b := mustOutside(t, m, "open"), mustOutside(t, m, "closed"); a == b {
		t.Errorf("two sandboxes share the outside address %s", a)
	}

	// DNS through the stub, as the sandbox's resolv.conf says.
	// The query is sent on the namespace's thread itself: a resolver's
	// own goroutines would dial from the host's namespace.
	got, err := queryA(open.NetNS, GatewayAddr.Addr().String()+":53", "www.example.test")
	if err != nil || got != answer {
		t.Errorf("DNS through the stub: %v, %v", got, err)
	}

	// A port inside a sandbox, dialed as the gateway does.
	listenIn(t, none.NetNS, "127.0.0.1:9000")
	c, err := m.DialPort(ctx, "none", 9000)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(c)
	c.Close()
	if string(b) != "hello\n" {
		t.Errorf("DialPort read %q", b)
	}

	// Release leaves nothing; a restarted manager adopts and prunes.
	for _, id := range []string{"none", "open"} {
		if err := m.Release(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	m.Close()
	m2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := m2.Sandboxes(); len(got) != 1 || got[0] != "closed" {
		t.Errorf("restarted manager adopted %v, want [closed]", got)
	}
	if _, err := get(closed.NetNS, out.HTTPURL); err != nil {
		t.Errorf("egress after a restart: %v", err)
	}
	if err := m2.Prune(ctx, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	m2.Close()
	assertClean(t, cfg)
}

func mustOutside(t *testing.T, m *Manager, id string) netip.Addr {
	a, ok := m.Outside(id)
	if !ok {
		t.Fatalf("%s has no outside address", id)
	}
	return a
}

// assertClean checks nothing of a manager is left on the host.
func assertClean(t *testing.T, cfg Config) {
	t.Helper()
	links, _ := netlink.LinkList()
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, cfg.IfPrefix) {
			t.Errorf("host link %s left", l.Attrs().Name)
		}
	}
	ents, _ := os.ReadDir(cfg.RunDir + "/ns")
	for _, e := range ents {
		t.Errorf("namespace %s left", e.Name())
	}
	m := &Manager{cfg: cfg}
	if chains, err := m.sandboxChains(); err != nil || len(chains) > 0 {
		t.Errorf("sandbox chains left: %v %v", chains, err)
	}
}

// queryA asks server for the A record of name from inside ns and returns
// the first answer.
func queryA(ns, server, name string) (netip.Addr, error) {
	q := []byte{0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0}
	for _, l := range strings.Split(name, ".") {
		q = append(q, byte(len(l)))
		q = append(q, l...)
	}
	q = append(q, 0, 0, 1, 0, 1)
	var resp []byte
	err := netnsfile.Run(ns, func() error {
		c, err := net.Dial("udp", server)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write(q); err != nil {
			return err
		}
		buf := make([]byte, 512)
		n, err := c.Read(buf)
		resp = buf[:n]
		return err
	})
	if err != nil {
		return netip.Addr{}, err
	}
	if len(resp) < len(q)+16 || resp[0] != 0x12 || resp[1] != 0x34 || resp[7] == 0 {
		return netip.Addr{}, fmt.Errorf("no answer in %x", resp)
	}
	a, _ := netip.AddrFromSlice(resp[len(resp)-4:])
	return a, nil
}

// Two managers of one table: the second gets no egress and prunes nothing
// of the first's host links and chains.
func TestRootOneOwnerPerTable(t *testing.T) {
	rootTest(t)
	out := nettest.NewOutside(t, netip.MustParseAddr("198.18.255.254"))
	cfg := testConfig(t, out.DNS)
	m := newTestManager(t, cfg)
	if _, err := m.Setup(context.Background(), "first", ModeEgress, Policy{}, false); err != nil {
		t.Fatal(err)
	}
	second := cfg
	second.RunDir = t.TempDir()
	m2, err := New(second)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	if m2.EgressError() == nil {
		t.Fatal("a second manager of the same table got egress")
	}
	if err := m2.Prune(context.Background(), func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if n := countPrefixed(cfg.IfPrefix); n != 1 {
		t.Errorf("the second manager's prune left %d of the first's links, want 1", n)
	}
}

func countPrefixed(prefix string) int {
	links, _ := netlink.LinkList()
	n := 0
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, prefix) {
			n++
		}
	}
	return n
}

func TestServfail(t *testing.T) {
	q := []byte{0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 1,
		3, 'w', 'w', 'w', 0, 0, 1, 0, 1, // www. A IN
		0, 0, 41, 16, 0, 0, 0, 0, 0, 0, 0} // OPT
	got := servfail(q)
	want := []byte{0xab, 0xcd, 0x81, 0x02, 0, 1, 0, 0, 0, 0, 0, 0, 3, 'w', 'w', 'w', 0, 0, 1, 0, 1}
	if !slices.Equal(got, want) {
		t.Errorf("servfail\n got %x\nwant %x", got, want)
	}
}

// TestRootRouteHandle: the handles the network hook and Setup use in a
// namespace speak rtnetlink only; netlink's default handle also opened XFRM
// and NETFILTER sockets there, and a new namespace's first XFRM socket held
// up every memory-tier restore's hook.
func TestRootRouteHandle(t *testing.T) {
	rootTest(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	host, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	ns, err := netns.New() // and the thread is in it
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := netns.Set(host); err != nil {
		t.Fatal(err)
	}
	for name, nsh := range map[string]netns.NsHandle{"sandbox": ns, "host": netns.None()} {
		h, err := routeHandle(nsh)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !h.SupportsNetlinkFamily(unix.NETLINK_ROUTE) || h.SupportsNetlinkFamily(unix.NETLINK_XFRM) || h.SupportsNetlinkFamily(unix.NETLINK_NETFILTER) {
			t.Errorf("%s: the handle speaks more than rtnetlink", name)
		}
		if _, err := h.LinkByName("lo"); err != nil {
			t.Errorf("%s: lo: %v", name, err)
		}
		h.Close()
	}
}
