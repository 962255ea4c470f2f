//go:build linux

package network

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/netnsfile"
	"github.com/forkfleet/forkfleet/controld/internal/atomicfile"
)

// The in-sandbox side, the same in every sandbox (and so in every fork).
var (
	SandboxAddr = netip.MustParsePrefix("10.201.0.2/30")
	GatewayAddr = netip.MustParsePrefix("10.201.0.1/30")
)

// Defaults of Config.
const (
	DefaultRunDir   = "/run/forkfleet/net"
	DefaultShareDir = "/run/forkfleet/share"
	DefaultTable    = "forkfleet"
	DefaultIfPrefix = "ffh"
)

// DefaultUplinkCIDR holds the host side of every sandbox's uplink, a /30
// each: 16384 sandboxes.
var DefaultUplinkCIDR = netip.MustParsePrefix("10.202.0.0/16")

// Names inside the namespaces.
const (
	sandboxIf = "eth0" // in the sandbox
	routerIn  = "sb"   // router side of the sandbox link
	routerUp  = "up"   // router side of the uplink
)

// Config configures a Manager. Every field has a default.
type Config struct {
	// RunDir holds the namespace bind mounts (ns/) and one state file per
	// sandbox; it belongs on a tmpfs (namespaces do not outlive a reboot).
	RunDir string
	// ShareDir holds what sandboxes bind-mount from the host (the resolver
	// file of egress sandboxes, and the runtime's empty directory over
	// masked paths): any sandbox's root reaches it by path (CRIU binds them
	// from inside a restored sandbox's user namespace), so it is
	// world-readable and holds nothing else; the same for every manager on
	// the host (its content is constant).
	ShareDir string
	// Table is the host's nftables table (family inet) owned by this
	// manager; IfPrefix starts the names of its host-side interfaces;
	// UplinkCIDR is split into the sandboxes' /30 uplinks. Two managers on
	// one host (tests) must not share any of the three.
	Table      string
	IfPrefix   string
	UplinkCIDR netip.Prefix
	// MTU of the sandbox links; 0: the MTU of the host's default route's
	// device (1500 without one).
	MTU int
	// DNSUpstream are the resolvers the DNS stub forwards to; empty: the
	// nameservers of /etc/resolv.conf.
	DNSUpstream []netip.AddrPort
	// NoEgress limits the manager to mode none: no table, no links (tests
	// of other packages, runtimes without a network configuration).
	NoEgress bool
	Logger   *slog.Logger
}

// Manager sets up and tears down sandbox networks. Safe for concurrent use.
type Manager struct {
	cfg    Config
	log    *slog.Logger
	nsDir  string
	resolv string // resolv.conf bind-mounted into egress sandboxes

	egressErr error // why egress cannot be set up here (nil: it can)
	hostMu    sync.Mutex
	hostLock  *os.File // held while this manager owns its table (ownHost)

	mu    sync.Mutex
	state map[string]*sandboxState
	used  map[int]bool // uplink indexes taken
	dns   map[string]*dnsStub
}

// sandboxState is <RunDir>/<id>.json: what Release and Prune need after a
// controld restart.
type sandboxState struct {
	Mode   Mode   `json:"mode"`
	Index  int    `json:"index"` // uplink index; -1 in mode none
	Policy Policy `json:"policy"`
}

// Sandbox is what the runtime puts into a sandbox's OCI spec.
type Sandbox struct {
	// NetNS is where the sandbox's network namespace is pinned once its
	// hook ran (see Attach): what CloseOutside, DialPort and tests enter.
	NetNS string
	// HookArgs are the arguments of the sandbox's createRuntime hook,
	// forkfleet-nethook (RunHook), after its name.
	HookArgs   []string
	ResolvConf string // bind-mount over /etc/resolv.conf ("" in mode none)
}

// New prepares RunDir and the host's table, and restarts the DNS stubs of
// the egress sandboxes a previous controld set up.
func New(cfg Config) (*Manager, error) {
	if cfg.RunDir == "" {
		cfg.RunDir = DefaultRunDir
	}
	if cfg.ShareDir == "" {
		cfg.ShareDir = DefaultShareDir
	}
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	if cfg.IfPrefix == "" {
		cfg.IfPrefix = DefaultIfPrefix
	}
	if !cfg.UplinkCIDR.IsValid() {
		cfg.UplinkCIDR = DefaultUplinkCIDR
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if len(cfg.IfPrefix) > 6 || strings.ContainsAny(cfg.IfPrefix, "*/ \"") {
		return nil, errdefs.InvalidField("network.if_prefix", "%q: at most 6 plain characters", cfg.IfPrefix)
	}
	if b := cfg.UplinkCIDR.Bits(); !cfg.UplinkCIDR.Addr().Is4() || b > 28 || b < 8 {
		return nil, errdefs.InvalidField("network.uplink_cidr", "%s: an IPv4 prefix of /8 to /28", cfg.UplinkCIDR)
	}
	cfg.UplinkCIDR = cfg.UplinkCIDR.Masked()
	m := &Manager{
		cfg: cfg, log: cfg.Logger, nsDir: filepath.Join(cfg.RunDir, "ns"),
		resolv: filepath.Join(cfg.ShareDir, "resolv.conf"),
		state:  map[string]*sandboxState{}, used: map[int]bool{}, dns: map[string]*dnsStub{},
	}
	if err := os.MkdirAll(m.nsDir, 0o700); err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	// Searchable by every sandbox's root whatever controld's umask (0077
	// under its unit).
	if err := os.MkdirAll(cfg.ShareDir, 0o755); err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	if err := os.Chmod(cfg.ShareDir, 0o755); err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	if err := atomicfile.Write(m.resolv, []byte("nameserver "+GatewayAddr.Addr().String()+"\noptions edns0\n"), 0o644); err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	if m.cfg.MTU <= 0 {
		m.cfg.MTU = defaultRouteMTU()
	}
	if len(m.cfg.DNSUpstream) == 0 {
		m.cfg.DNSUpstream = resolvConfNameservers("/etc/resolv.conf")
	}
	if cfg.NoEgress {
		m.egressErr = errdefs.WithReason(errdefs.ErrFailedPrecondition, "EGRESS_UNAVAILABLE", "this runtime has no egress networking configured")
	} else {
		m.egressErr = m.checkEgress()
	}
	if m.egressErr != nil && !cfg.NoEgress {
		m.log.Info("sandbox network mode egress is unavailable on this host", "reason", m.egressErr)
	}
	if err := m.load(); err != nil {
		return nil, err
	}
	return m, nil
}

// EgressError says why ModeEgress cannot be set up on this host (nil: it
// can). The first call that finds egress possible makes this manager the
// owner of its table (see ownHost): a controld that never sets up egress
// never takes the host's table from another.
func (m *Manager) EgressError() error {
	if m.egressErr != nil {
		return m.egressErr
	}
	return m.ownHost()
}

// ownHost takes the host lock of this manager's table and builds the
// table's base chains, once; it fails while another process owns them.
func (m *Manager) ownHost() error {
	m.hostMu.Lock()
	defer m.hostMu.Unlock()
	if m.hostLock != nil {
		return nil
	}
	if err := m.lockHost(); err != nil {
		return err
	}
	if err := m.ensureTable(); err != nil {
		m.hostLock.Close()
		m.hostLock = nil
		return err
	}
	return nil
}

func (m *Manager) ownsHost() bool {
	m.hostMu.Lock()
	defer m.hostMu.Unlock()
	return m.hostLock != nil
}

func (m *Manager) checkEgress() error {
	if _, err := exec.LookPath("nft"); err != nil {
		return errdefs.WithReason(errdefs.ErrFailedPrecondition, "EGRESS_UNAVAILABLE", "no nft on this host (deploy/host-setup.sh installs nftables)")
	}
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil || strings.TrimSpace(string(b)) != "1" {
		return errdefs.WithReason(errdefs.ErrFailedPrecondition, "EGRESS_UNAVAILABLE", "the host does not forward IPv4 (net.ipv4.ip_forward=0; deploy/host-setup.sh sets it)")
	}
	if len(m.cfg.DNSUpstream) == 0 {
		return errdefs.WithReason(errdefs.ErrFailedPrecondition, "EGRESS_UNAVAILABLE", "no DNS upstream (none configured, none in /etc/resolv.conf)")
	}
	return nil
}

// load reads the state files a previous controld left and restarts the
// DNS stubs of the egress sandboxes.
func (m *Manager) load() error {
	ents, err := os.ReadDir(m.cfg.RunDir)
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(m.cfg.RunDir, e.Name()))
		var st sandboxState
		if err == nil {
			err = json.Unmarshal(b, &st)
		}
		if err != nil {
			m.log.Warn("network: unreadable state file; the sandbox's network is pruned", "sandbox", id, "err", err)
			continue
		}
		m.state[id] = &st
		if st.Mode == ModeEgress {
			m.used[st.Index] = true
			if m.EgressError() == nil {
				if d, err := startDNS(m.routerPath(id), m.cfg.DNSUpstream, m.log.With("sandbox", id)); err != nil {
					m.log.Warn("network: restart DNS stub", "sandbox", id, "err", err)
				} else {
					m.dns[id] = d
				}
			}
		}
	}
	return nil
}

// lockHost takes the host-wide lock of this manager's table: two managers
// with one table, interface prefix and uplink range (two controlds on a
// host configured alike) would hand out the same uplinks and prune each
// other's. The second one gets no egress.
func (m *Manager) lockHost() error {
	path := filepath.Join(hostLockDir, "forkfleet-net-"+m.cfg.Table+".lock")
	if err := os.MkdirAll(hostLockDir, 0o755); err != nil {
		return fmt.Errorf("network: host lock: %w", err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("network: host lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return errdefs.WithReason(errdefs.ErrFailedPrecondition, "EGRESS_UNAVAILABLE",
			"another process owns nftables table %s and its sandbox links (%s): give this controld its own network.table, if_prefix and uplink_cidr", m.cfg.Table, path)
	}
	m.hostLock = f
	return nil
}

// hostLockDir holds the managers' host locks (a tmpfs: they die with the
// boot, like what they guard).
const hostLockDir = "/run/lock"

// Close stops the DNS stubs and releases the host lock. Namespaces, links
// and rules stay: sandboxes keep running, and the next Manager adopts them.
func (m *Manager) Close() {
	m.hostMu.Lock()
	if m.hostLock != nil {
		m.hostLock.Close()
		m.hostLock = nil
	}
	m.hostMu.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, d := range m.dns {
		d.close()
		delete(m.dns, id)
	}
}

func (m *Manager) netnsPath(id string) string  { return filepath.Join(m.nsDir, id) }
func (m *Manager) routerPath(id string) string { return filepath.Join(m.nsDir, id+".rt") }
func (m *Manager) statePath(id string) string  { return filepath.Join(m.cfg.RunDir, id+".json") }

func (m *Manager) hostIf(index int) string { return m.cfg.IfPrefix + strconv.Itoa(index) }

// uplink returns the host and router addresses of uplink index.
func (m *Manager) uplink(index int) (host, router netip.Prefix) {
	base := m.cfg.UplinkCIDR.Addr().As4()
	n := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	n += uint32(index) * 4
	at := func(v uint32) netip.Addr {
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	return netip.PrefixFrom(at(n+1), 30), netip.PrefixFrom(at(n+2), 30)
}

func (m *Manager) maxIndex() int { return 1 << (32 - m.cfg.UplinkCIDR.Bits() - 2) }

// ShareDir returns the directory of what sandboxes bind-mount from the
// host (Config.ShareDir).
func (m *Manager) ShareDir() string { return m.cfg.ShareDir }

// NetNS returns the path of a sandbox's network namespace.
func (m *Manager) NetNS(id string) string { return m.netnsPath(id) }

// Setup prepares sandbox id's network: the pin its namespace will be bound
// to, and in mode egress its router namespace, uplink, NAT, DNS stub and
// policy, with the sandbox's end of its link parked in the router
// namespace. The namespace itself is made by runc (boot) or CRIU (restore)
// inside the sandbox's user namespace, and the hook (Sandbox.HookArgs)
// finishes the network there (Attach). On error nothing is left. An id set
// up already is ErrAlreadyExists.
//
// With hold, the sandbox's link is held down at its router until
// FinishRestore or Connect. A restore needs that: a restored TCP connection
// announces itself to its peer the moment CRIU lets it go (a window probe),
// and the peer, which knows only the source, would answer with a reset;
// held down, nothing leaves before FinishRestore has closed such
// connections. A pooled sandbox stays held until its claim.
func (m *Manager) Setup(ctx context.Context, id string, mode Mode, policy Policy, hold bool) (sb Sandbox, err error) {
	if mode == ModeEgress {
		if err := m.EgressError(); err != nil {
			return sb, err
		}
	}
	st := &sandboxState{Mode: mode, Index: -1, Policy: policy}
	m.mu.Lock()
	if _, ok := m.state[id]; ok {
		m.mu.Unlock()
		return sb, fmt.Errorf("network of %s: %w", id, errdefs.ErrAlreadyExists)
	}
	if mode == ModeEgress {
		for i := 0; i < m.maxIndex(); i++ {
			if !m.used[i] {
				st.Index = i
				break
			}
		}
		if st.Index < 0 {
			m.mu.Unlock()
			return sb, errdefs.WithReason(errdefs.ErrResourceExhausted, "UPLINKS_EXHAUSTED", "all %d sandbox uplinks of %s are taken", m.maxIndex(), m.cfg.UplinkCIDR)
		}
		m.used[st.Index] = true
	}
	m.state[id] = st
	m.mu.Unlock()
	defer func() {
		if err != nil {
			m.release(context.WithoutCancel(ctx), id, st)
		}
	}()
	// The state file first: a crash half way leaves something Prune finds.
	if err := m.writeState(id, st); err != nil {
		return sb, err
	}
	if err := newPin(m.netnsPath(id)); err != nil {
		return sb, fmt.Errorf("network of %s: %w: %w", id, errdefs.ErrInternal, err)
	}
	sb.NetNS = m.netnsPath(id)
	sb.HookArgs = []string{"-pin", sb.NetNS}
	if mode == ModeEgress {
		if err := m.setupEgress(id, st, hold); err != nil {
			return sb, fmt.Errorf("network of %s: %w: %w", id, errdefs.ErrInternal, err)
		}
		sb.ResolvConf = m.resolv
		sb.HookArgs = append(sb.HookArgs, "-router", m.routerPath(id))
	}
	return sb, nil
}

func (m *Manager) writeState(id string, st *sandboxState) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	if err := atomicfile.Write(m.statePath(id), b, 0o600); err != nil {
		return fmt.Errorf("network of %s: state: %w: %w", id, errdefs.ErrInternal, err)
	}
	return nil
}

func withHandle(path string, fn func(*netlink.Handle) error) error {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", path, err)
	}
	defer ns.Close()
	h, err := routeHandle(ns)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", path, err)
	}
	defer h.Close()
	return fn(h)
}

// setupEgress builds the router namespace and both links (see the package
// doc; the sandbox's end of its link stays in the router namespace, down,
// until Attach moves it in), the router's NAT, the host's chain for the
// sandbox and its DNS stub.
func (m *Manager) setupEgress(id string, st *sandboxState, holdDown bool) error {
	rtPath := m.routerPath(id)
	if err := netnsfile.New(rtPath); err != nil {
		return err
	}
	rtNS, err := netns.GetFromPath(rtPath)
	if err != nil {
		return err
	}
	defer rtNS.Close()
	hostUp, routerAddr := m.uplink(st.Index)
	mtu := m.cfg.MTU

	// Host side: the uplink, its router end moved into the router namespace.
	host, err := routeHandle(netns.None())
	if err != nil {
		return err
	}
	defer host.Close()
	hostName := m.hostIf(st.Index)
	if old, err := host.LinkByName(hostName); err == nil {
		host.LinkDel(old) // a leftover of a crash; its index is ours now
	}
	if err := host.LinkAdd(&netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{Name: hostName, MTU: mtu},
		PeerName:  routerUp, PeerMTU: uint32(mtu), PeerNamespace: netlink.NsFd(rtNS),
	}); err != nil {
		return fmt.Errorf("uplink %s: %w", hostName, err)
	}
	if err := linkAddr(host, hostName, hostUp, true); err != nil {
		return err
	}

	// Router side: the sandbox link (its other end parked here until the
	// sandbox's namespace exists), addresses, default route to the host,
	// forwarding.
	err = withHandle(rtPath, func(h *netlink.Handle) error {
		if err := h.LinkAdd(&netlink.Veth{
			LinkAttrs: netlink.LinkAttrs{Name: routerIn, MTU: mtu},
			PeerName:  sandboxIf, PeerMTU: uint32(mtu),
		}); err != nil {
			return fmt.Errorf("sandbox link: %w", err)
		}
		for _, l := range []struct {
			name string
			addr netip.Prefix
			up   bool
		}{{"lo", netip.Prefix{}, true}, {routerIn, GatewayAddr, !holdDown}, {routerUp, routerAddr, true}} {
			if err := linkAddr(h, l.name, l.addr, l.up); err != nil {
				return err
			}
		}
		return h.RouteAdd(&netlink.Route{Gw: net.IP(hostUp.Addr().AsSlice())})
	})
	if err != nil {
		return fmt.Errorf("router: %w", err)
	}
	err = netnsfile.Run(rtPath, func() error {
		for name, v := range map[string]string{
			"net/ipv4/ip_forward":                "1",
			"net/ipv6/conf/all/disable_ipv6":     "1",
			"net/ipv6/conf/default/disable_ipv6": "1",
		} {
			if err := writeSysctl(name, v); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		// The outside address of this sandbox is its uplink's.
		err = routerNAT(rtPath)
	}
	if err != nil {
		return fmt.Errorf("router: %w", err)
	}

	if err := m.setChain(st.Index, st.Policy, true); err != nil {
		return err
	}
	d, err := startDNS(rtPath, m.cfg.DNSUpstream, m.log.With("sandbox", id))
	if err != nil {
		return fmt.Errorf("dns stub: %w", err)
	}
	m.mu.Lock()
	m.dns[id] = d
	m.mu.Unlock()
	return nil
}

func linkAddr(h *netlink.Handle, name string, addr netip.Prefix, up bool) error {
	l, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("link %s: %w", name, err)
	}
	if addr.IsValid() {
		ipn := &net.IPNet{IP: net.IP(addr.Addr().AsSlice()), Mask: net.CIDRMask(addr.Bits(), 32)}
		if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipn}); err != nil {
			return fmt.Errorf("address %s on %s: %w", addr, name, err)
		}
	}
	if !up {
		return nil
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("link %s up: %w", name, err)
	}
	return nil
}

// SetPolicy replaces sandbox id's policy (mode egress; mode none has
// nothing to reach and takes any policy as a no-op).
func (m *Manager) SetPolicy(_ context.Context, id string, p Policy) error {
	m.mu.Lock()
	st, ok := m.state[id]
	var cur sandboxState
	if ok {
		cur = *st
	}
	m.mu.Unlock()
	if !ok {
		return fmt.Errorf("network of %s: %w", id, errdefs.ErrNotFound)
	}
	if cur.Mode != ModeEgress || cur.Policy.Equal(p) {
		return nil
	}
	if err := m.setChain(cur.Index, p, false); err != nil {
		return fmt.Errorf("network of %s: %w", id, err)
	}
	cur.Policy = p
	m.mu.Lock()
	if st, ok := m.state[id]; ok {
		st.Policy = p
	}
	m.mu.Unlock()
	return m.writeState(id, &cur)
}

// Release tears sandbox id's network down. Unknown ids are not an error.
func (m *Manager) Release(ctx context.Context, id string) error {
	m.mu.Lock()
	st := m.state[id]
	m.mu.Unlock()
	return m.release(ctx, id, st)
}

func (m *Manager) release(_ context.Context, id string, st *sandboxState) error {
	var errs []error
	m.mu.Lock()
	if d := m.dns[id]; d != nil {
		d.close() // its sockets hold the router namespace
		delete(m.dns, id)
	}
	m.mu.Unlock()
	if st != nil && st.Mode == ModeEgress && st.Index >= 0 {
		if err := m.dropChain(st.Index); err != nil {
			errs = append(errs, err)
		}
		if err := m.dropHostIf(m.hostIf(st.Index)); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range []string{m.routerPath(id), m.netnsPath(id)} {
		if err := netnsfile.Remove(p); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.Remove(m.statePath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("network of %s: release: %w", id, err)
	}
	m.mu.Lock()
	if cur, ok := m.state[id]; ok && cur == st {
		delete(m.state, id)
	}
	if st != nil && st.Index >= 0 {
		delete(m.used, st.Index)
	}
	m.mu.Unlock()
	return nil
}

func (m *Manager) dropHostIf(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return err
	}
	return netlink.LinkDel(l)
}

// Prune releases every sandbox network for which keep is false: after a
// controld restart, what sandboxes without a record, discarded slots and
// crashes left (state files, namespaces, host links, chains).
func (m *Manager) Prune(ctx context.Context, keep func(id string) bool) error {
	m.mu.Lock()
	ids := make(map[string]*sandboxState, len(m.state))
	for id, st := range m.state {
		ids[id] = st
	}
	m.mu.Unlock()
	var errs []error
	kept := map[int]bool{}
	for id, st := range ids {
		if keep(id) {
			if st.Mode == ModeEgress {
				kept[st.Index] = true
			}
			continue
		}
		m.log.Info("network: pruning the network of a sandbox controld does not know", "sandbox", id)
		if err := m.release(ctx, id, st); err != nil {
			errs = append(errs, err)
		}
	}
	// Namespaces without a state file (a crash between the two).
	if ents, err := os.ReadDir(m.nsDir); err == nil {
		for _, e := range ents {
			id := strings.TrimSuffix(e.Name(), ".rt")
			if _, ok := ids[id]; ok && keep(id) {
				continue
			}
			if err := netnsfile.Remove(filepath.Join(m.nsDir, e.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	// Host links and chains of no kept sandbox: only a manager that owns
	// the table, prefix and uplink range (egress on, host lock held) may
	// touch them; another controld's are not its to prune.
	if !m.ownsHost() {
		return errors.Join(errs...)
	}
	if links, err := netlink.LinkList(); err == nil {
		for _, l := range links {
			name := l.Attrs().Name
			n, ok := m.indexOf(name)
			if ok && !kept[n] {
				if err := netlink.LinkDel(l); err != nil {
					errs = append(errs, fmt.Errorf("delete %s: %w", name, err))
				}
			}
		}
	}
	chains, err := m.sandboxChains()
	if err != nil {
		errs = append(errs, err)
	}
	for _, n := range chains {
		if !kept[n] {
			if err := m.dropChain(n); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// indexOf parses a host-side interface name of this manager.
func (m *Manager) indexOf(name string) (int, bool) {
	s, ok := strings.CutPrefix(name, m.cfg.IfPrefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil && n >= 0 && strconv.Itoa(n) == s
}

// Forget drops every bind mount and state file of this manager's run
// directory, leaving the namespaces to the processes in them: for a
// manager that lives and dies with one runtime in a temporary directory
// (tests, tools), whose sandboxes may outlive it. Nothing on the host is
// touched (a manager that owns the host's table must not call it).
func (m *Manager) Forget() error {
	var errs []error
	if ents, err := os.ReadDir(m.nsDir); err == nil {
		for _, e := range ents {
			if err := netnsfile.Remove(filepath.Join(m.nsDir, e.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if ents, err := filepath.Glob(filepath.Join(m.cfg.RunDir, "*.json")); err == nil {
		for _, p := range ents {
			os.Remove(p)
		}
	}
	m.mu.Lock()
	m.state = map[string]*sandboxState{}
	m.used = map[int]bool{}
	m.mu.Unlock()
	return errors.Join(errs...)
}

// Sandboxes returns the ids with a network set up (for tests and checks).
func (m *Manager) Sandboxes() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.state))
	for id := range m.state {
		out = append(out, id)
	}
	return out
}

// Outside returns the address a sandbox's traffic leaves its router with
// (its identity on the host's side), or false in mode none.
func (m *Manager) Outside(id string) (netip.Addr, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	st, ok := m.state[id]
	if !ok || st.Mode != ModeEgress {
		return netip.Addr{}, false
	}
	_, r := m.uplink(st.Index)
	return r.Addr(), true
}

// DialPort connects to TCP port inside sandbox id, as a process of the
// sandbox would: on its loopback (where servers usually listen), then on
// its own address.
func (m *Manager) DialPort(ctx context.Context, id string, port uint16) (net.Conn, error) {
	m.mu.Lock()
	st, ok := m.state[id]
	mode := ModeNone
	if ok {
		mode = st.Mode
	}
	m.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("network of %s: %w", id, errdefs.ErrNotFound)
	}
	targets := []netip.Addr{netip.MustParseAddr("127.0.0.1")}
	if mode == ModeEgress {
		targets = append(targets, SandboxAddr.Addr())
	}
	var conn net.Conn
	err := netnsfile.Run(m.netnsPath(id), func() error {
		var d net.Dialer
		var errs []error
		for _, a := range targets {
			c, err := d.DialContext(ctx, "tcp", netip.AddrPortFrom(a, port).String())
			if err == nil {
				conn = c
				return nil
			}
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	})
	if err != nil {
		return nil, errdefs.WithReason(errdefs.ErrUnavailable, "PORT_UNREACHABLE", "sandbox %s: nothing accepts on port %d: %v", id, port, err)
	}
	return conn, nil
}

// nft runs one nft script (atomically: a batch applies whole or not at all).
func nft(script string) error {
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("nft: %w: %s", err, strings.TrimSpace(out.String()))
	}
	return nil
}

func defaultRouteMTU() int {
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err == nil {
		for _, r := range routes {
			if r.Dst == nil || r.Dst.IP.IsUnspecified() {
				if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil && l.Attrs().MTU > 0 {
					return l.Attrs().MTU
				}
			}
		}
	}
	return 1500
}

// resolvConfNameservers returns the IPv4 nameservers of a resolv.conf.
func resolvConfNameservers(path string) []netip.AddrPort {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []netip.AddrPort
	s := bufio.NewScanner(f)
	for s.Scan() {
		fs := strings.Fields(s.Text())
		if len(fs) >= 2 && fs[0] == "nameserver" {
			if a, err := netip.ParseAddr(fs[1]); err == nil && a.Is4() {
				out = append(out, netip.AddrPortFrom(a, 53))
			}
		}
	}
	return out
}

// tcpStatesToClose are the TCP states of a connection that may still talk
// to its peer (all but LISTEN, TIME_WAIT and CLOSE).
var tcpStatesToClose = map[uint8]bool{1: true, 2: true, 3: true, 4: true, 5: true, 8: true, 9: true, 11: true}

// FinishRestore closes a restored sandbox's connections to the outside
// (CloseOutside) and then, with connect, lets its traffic out (the link
// Setup held down for a restore); without, the link stays down until
// Connect (a pooled replica, connected at its claim). It returns how many
// connections it closed.
func (m *Manager) FinishRestore(id string, connect bool) (int, error) {
	m.mu.Lock()
	st, ok := m.state[id]
	egress := ok && st.Mode == ModeEgress
	m.mu.Unlock()
	if !egress {
		return 0, nil // loopback only: every peer is inside the sandbox
	}
	n, err := m.CloseOutside(id)
	if err != nil || !connect {
		return n, err
	}
	return n, m.setLink(id, true)
}

// Connect applies policy to a sandbox and brings up the link Setup held
// down (Setup's hold, FinishRestore without connect): the sandbox reaches
// what the policy allows from then on. Idempotent; a no-op in mode none.
func (m *Manager) Connect(ctx context.Context, id string, policy Policy) error {
	if err := m.SetPolicy(ctx, id, policy); err != nil {
		return err
	}
	return m.setLink(id, true)
}

// setLink sets the router's side of the sandbox link up or down (egress).
func (m *Manager) setLink(id string, up bool) error {
	m.mu.Lock()
	st, ok := m.state[id]
	egress := ok && st.Mode == ModeEgress
	m.mu.Unlock()
	if !ok {
		return fmt.Errorf("network of %s: %w", id, errdefs.ErrNotFound)
	}
	if !egress {
		return nil
	}
	err := withHandle(m.routerPath(id), func(h *netlink.Handle) error {
		l, err := h.LinkByName(routerIn)
		if err != nil {
			return err
		}
		if up {
			return h.LinkSetUp(l)
		}
		return h.LinkSetDown(l)
	})
	if err != nil {
		return fmt.Errorf("network of %s: link: %w: %w", id, errdefs.ErrInternal, err)
	}
	return nil
}

// CloseOutside aborts, in a freshly restored sandbox, every TCP connection
// whose peer is outside the sandbox (not on its loopback nor its own
// address): its peer knows only the source, and N replicas cannot all be
// that source. The applications see ECONNABORTED and reconnect; listening
// sockets and connections within the sandbox stay. It returns how many it
// closed.
func (m *Manager) CloseOutside(id string) (int, error) {
	n := 0
	err := netnsfile.Run(m.netnsPath(id), func() error {
		socks, err := netlink.SocketDiagTCP(unix.AF_INET)
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			return fmt.Errorf("list tcp sockets: %w", err)
		}
		var errs []error
		for _, s := range socks {
			remote, ok := netip.AddrFromSlice(s.ID.Destination.To4())
			if !ok || !tcpStatesToClose[s.State] || remote.IsLoopback() || remote == SandboxAddr.Addr() {
				continue
			}
			local := &net.TCPAddr{IP: s.ID.Source, Port: int(s.ID.SourcePort)}
			peer := &net.TCPAddr{IP: s.ID.Destination, Port: int(s.ID.DestinationPort)}
			if err := netlink.SocketDestroy(local, peer); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("close %v -> %v: %w", local, peer, err))
				continue
			}
			n++
		}
		return errors.Join(errs...)
	})
	if err != nil {
		return n, fmt.Errorf("network of %s: close outside connections: %w: %w", id, errdefs.ErrInternal, err)
	}
	return n, nil
}
