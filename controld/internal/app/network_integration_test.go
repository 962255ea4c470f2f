//go:build linux

package app_test

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/forkfleet/forkfleet/api/aci"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/app"
	"github.com/forkfleet/forkfleet/controld/internal/config"
	"github.com/forkfleet/forkfleet/controld/internal/containerdrt"
	"github.com/forkfleet/forkfleet/controld/internal/network"
	"github.com/forkfleet/forkfleet/controld/internal/network/nettest"
	"github.com/forkfleet/forkfleet/controld/internal/testenv"
)

// netEnv is controld on the real stack with egress networking of its own
// (table, interface prefix, uplink range: never the host's controld's),
// whose sandboxes' DNS goes to the test's outside host. Nothing talks to any
// address but the loopback and the namespaces the test makes.
type netEnv struct {
	t       *testing.T
	cfg     *config.Config
	netCfg  network.Config
	out     *nettest.Outside
	answer  netip.Addr
	log     *slog.Logger
	probe   []byte // the netprobe binary
	nm      *network.Manager
	rt      *containerdrt.Runtime
	stop    func()
	gateway string
	conn    *grpc.ClientConn
	sbc     controldv1.SandboxServiceClient
	ckc     controldv1.CheckpointServiceClient
}

func newNetEnv(t *testing.T) *netEnv {
	cfg, _, _ := realStackConfig(t, "forkfleet-net-it")
	cfg.Boot.Precreate = 0 // every sandbox a cold boot: the test counts networks
	answer := netip.MustParseAddr("198.18.255.254")
	e := &netEnv{t: t, cfg: cfg, answer: answer, out: nettest.NewOutside(t, answer)}
	var b [2]byte
	crand.Read(b[:])
	tag := hex.EncodeToString(b[:])
	e.netCfg = network.Config{
		RunDir: filepath.Join(t.TempDir(), "net"), Table: "forkfleet_app_" + tag, IfPrefix: "a" + tag,
		UplinkCIDR:  netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 205, b[0] & 0xfe, 0}), 23),
		DNSUpstream: []netip.AddrPort{e.out.DNS},
	}
	e.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		e.log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	bin := filepath.Join(t.TempDir(), "netprobe")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./testdata/netprobe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build netprobe: %v\n%s", err, out)
	}
	var err error
	if e.probe, err = os.ReadFile(bin); err != nil {
		t.Fatal(err)
	}
	// Last: whatever a failed run left of its networks (sandboxes still
	// running are deleted by the next run's reconciliation).
	t.Cleanup(func() {
		m, err := network.New(e.netCfg)
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		m.Prune(context.Background(), func(string) bool { return false })
		m.Close()
		m.RemoveTable()
	})
	return e
}

// start runs controld with a fresh network manager and runtime (as a
// restarted controld has).
func (e *netEnv) start(ctx context.Context) {
	t := e.t
	nm, err := network.New(e.netCfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := nm.EgressError(); err != nil {
		t.Fatalf("egress unavailable (deploy/host-setup.sh sets the host up): %v", err)
	}
	rt, err := containerdrt.New(ctx, containerdrt.Config{
		Address: e.cfg.Containerd.Address, Namespace: e.cfg.Containerd.Namespace,
		CheckpointRoot: e.cfg.CheckpointDir, StateDir: filepath.Join(e.cfg.StateDir, "runtime"),
		LogWriter: testenv.LogWriter(t), NetHook: testenv.NetHook(t), LayersDir: testenv.LayersDir(), Network: nm,
		UserNamespaces: testenv.UserNamespaces(t, e.cfg.UserNS.Enabled),
	})
	if err != nil {
		t.Fatalf("runtime: %v", err)
	}
	e.cfg.DefaultImage = testenv.Image(t, ctx, rt.Client(), e.cfg.Containerd.Namespace, testenv.Desktop)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	ready := make(chan app.Addrs, 1)
	go func() {
		done <- app.Run(runCtx, e.cfg, app.Deps{Runtime: rt, Logger: e.log, OnReady: func(a app.Addrs) { ready <- a }})
	}()
	var addrs app.Addrs
	select {
	case addrs = <-ready:
	case err := <-done:
		t.Fatalf("controld: %v", err)
	}
	conn, err := grpc.NewClient("unix://"+addrs.GRPCUnix, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	e.nm, e.rt, e.gateway, e.conn = nm, rt, addrs.Gateway, conn
	e.sbc, e.ckc = controldv1.NewSandboxServiceClient(conn), controldv1.NewCheckpointServiceClient(conn)
	e.stop = func() {
		conn.Close()
		stop()
		if err := <-done; err != nil {
			t.Errorf("shutdown: %v", err)
		}
		rt.Close()
		nm.Close()
	}
}

func (e *netEnv) create(ctx context.Context, n *controldv1.Network) *controldv1.CreateSandboxResponse {
	e.t.Helper()
	r, err := e.sbc.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true, Network: n})
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

// session opens an ACI session and puts netprobe into the sandbox.
func (e *netEnv) session(ctx context.Context, ep *controldv1.Endpoint) *aci.Session {
	e.t.Helper()
	s, err := aci.Dial(ctx, ep.Url, ep.Token)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { s.Close() })
	if err := s.PutFile(ctx, "/tmp/netprobe", e.probe, aci.FileMode(0o755)); err != nil {
		e.t.Fatal(err)
	}
	return s
}

// probe runs netprobe in the sandbox and returns its output and whether it
// succeeded.
func probe(ctx context.Context, t *testing.T, s *aci.Session, args ...string) (string, bool) {
	t.Helper()
	r, err := s.Exec(ctx, &aciv1.ExecRequest{Argv: append([]string{"/tmp/netprobe"}, args...), TimeoutMs: 10000})
	if err != nil {
		t.Fatalf("exec netprobe %v: %v", args, err)
	}
	return strings.TrimSpace(string(r.GetStdout()) + string(r.GetStderr())), r.GetExitCode() == 0
}

// portGet fetches path from an exposed port through the gateway.
func portGet(t *testing.T, method, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestRealStackNetworking covers issue 13 on the real stack: egress allowed
// and denied by policy (and changed while running), DNS through the stub,
// the host, link-local addresses and other sandboxes unreachable, an exposed
// port through the gateway, 16 replicas with every proof (network and
// filesystem included) each answering through its own exposed port and
// diverging, and cleanup after delete and after a controld restart.
func TestRealStackNetworking(t *testing.T) {
	e := newNetEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e.start(ctx)
	stopped := false
	defer func() {
		if !stopped {
			e.stop()
		}
	}()
	egress := controldv1.NetworkMode_NETWORK_MODE_EGRESS
	outsideURL := "http://" + e.out.Addr.String() + "/"

	// A sandbox in mode egress reaches the outside host and resolves names
	// through its stub; a denied destination is refused until the policy
	// changes.
	a := e.create(ctx, &controldv1.Network{Mode: egress})
	sa := e.session(ctx, a.Endpoint)
	if out, ok := probe(ctx, t, sa, "get", outsideURL); !ok || !strings.HasPrefix(out, "200 outside ") {
		t.Errorf("egress allowed: %q", out)
	}
	if out, ok := probe(ctx, t, sa, "lookup", "www.example.test"); !ok || out != e.answer.String() {
		t.Errorf("DNS through the stub: %q", out)
	}
	deny := &controldv1.NetworkPolicy{Deny: []*controldv1.NetworkRule{{Cidr: e.out.Addr.String(), Protocol: controldv1.NetworkProtocol_NETWORK_PROTOCOL_TCP,
		Ports: []*controldv1.PortRange{{First: 80}}}}}
	b := e.create(ctx, &controldv1.Network{Mode: egress, Policy: deny})
	sbb := e.session(ctx, b.Endpoint)
	if out, ok := probe(ctx, t, sbb, "get", outsideURL); ok {
		t.Errorf("egress denied by policy got through: %q", out)
	}

	// The host (any of its addresses, any port), link-local addresses and
	// other sandboxes are out of reach.
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
	hostPort := hostLn.Addr().(*net.TCPAddr).Port
	gwPort := strings.TrimPrefix(e.gateway[strings.LastIndex(e.gateway, ":"):], ":")
	for _, target := range []string{
		fmt.Sprintf("%s:%d", e.out.HostAddr, hostPort), // the host, on the outside link's address
		e.out.HostAddr.String() + ":" + gwPort,         // controld's gateway port, on a host address
		"169.254.169.254:80",                           // metadata
	} {
		if out, ok := probe(ctx, t, sa, "dial", target); ok {
			t.Errorf("sandbox reached %s: %q", target, out)
		}
	}
	if _, err := sbb.Launch(ctx, &aciv1.LaunchRequest{Argv: []string{"/tmp/netprobe", "serve", "0.0.0.0:8081"}}); err != nil {
		t.Fatal(err)
	}
	bOutside, _ := e.nm.Outside(b.Sandbox.Id)
	if out, ok := probe(ctx, t, sa, "dial", bOutside.String()+":8081"); ok {
		t.Errorf("a sandbox reached another sandbox's outside address: %q", out)
	}
	if _, err := e.sbc.UpdateSandboxNetwork(ctx, &controldv1.UpdateSandboxNetworkRequest{Id: b.Sandbox.Id, Policy: &controldv1.NetworkPolicy{}}); err != nil {
		t.Fatal(err)
	}
	if out, ok := probe(ctx, t, sbb, "get", outsideURL); !ok || !strings.HasPrefix(out, "200 ") {
		t.Errorf("egress after the policy allowed it: %q", out)
	}

	// An exposed port through the gateway: a server on the sandbox's
	// loopback only.
	if _, err := sa.Launch(ctx, &aciv1.LaunchRequest{Argv: []string{"/tmp/netprobe", "serve", "127.0.0.1:8080"}}); err != nil {
		t.Fatal(err)
	}
	ep, err := e.sbc.ExposePort(ctx, &controldv1.ExposePortRequest{SandboxId: a.Sandbox.Id, Port: 8080})
	if err != nil {
		t.Fatal(err)
	}
	var code int
	var body string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if code, body = portGet(t, "GET", ep.Url, ep.Token); code == 200 {
			break
		}
	}
	if code != 200 || body != "value initial" {
		t.Fatalf("exposed port: %d %q", code, body)
	}
	if code, _ := portGet(t, "GET", ep.Url, ""); code != http.StatusUnauthorized {
		t.Errorf("exposed port without a token: %d", code)
	}
	sa.Close()
	sbb.Close()

	// 16 replicas: every proof passes; each answers through its own port
	// and diverges; each has its own outside address and reaches the
	// outside host.
	ck, err := e.ckc.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: a.Sandbox.Id})
	if err != nil {
		t.Fatal(err)
	}
	levels := []controldv1.VerifyLevel{controldv1.VerifyLevel_VERIFY_LEVEL_MARKER, controldv1.VerifyLevel_VERIFY_LEVEL_MEMORY,
		controldv1.VerifyLevel_VERIFY_LEVEL_PIXELS, controldv1.VerifyLevel_VERIFY_LEVEL_NETWORK, controldv1.VerifyLevel_VERIFY_LEVEL_FILESYSTEM}
	t0 := time.Now()
	fr, err := e.ckc.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Checkpoint.Id, Count: 16, Verify: levels})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("16 egress replicas verified at 5 levels in %v", time.Since(t0))
	var replicas []string
	outsides := map[netip.Addr]bool{}
	for _, r := range fr.Replicas {
		if r.ErrorCode != 0 {
			t.Fatalf("replica failed: %s", r.ErrorMessage)
		}
		replicas = append(replicas, r.Sandbox.Id)
		for _, v := range r.Verification {
			if !v.Ok {
				t.Errorf("%s %s: %s", r.Sandbox.Id, v.Level, v.Detail)
			}
		}
		o, _ := e.nm.Outside(r.Sandbox.Id)
		outsides[o] = true
	}
	if len(outsides) != 16 {
		t.Errorf("16 replicas have %d distinct outside addresses", len(outsides))
	}
	urls := make([]*controldv1.ExposePortResponse, len(replicas))
	var wg sync.WaitGroup
	for i, id := range replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := e.sbc.ExposePort(ctx, &controldv1.ExposePortRequest{SandboxId: id, Port: 8080})
			if err != nil {
				t.Error(err)
				return
			}
			urls[i] = p
			if code, body := portGet(t, "POST", p.Url+"set?v=replica"+fmt.Sprint(i), p.Token); code != 200 {
				t.Errorf("%s: set: %d %q", id, code, body)
			}
		}()
	}
	wg.Wait()
	for i, p := range urls {
		if p == nil {
			continue
		}
		if code, body := portGet(t, "GET", p.Url, p.Token); code != 200 || body != fmt.Sprintf("value replica%d", i) {
			t.Errorf("replica %d through its port: %d %q", i, code, body)
		}
		if p.Token == ep.Token {
			t.Errorf("replica %d shares the source's port token", i)
		}
	}
	if _, body := portGet(t, "GET", ep.Url, ep.Token); body != "value initial" {
		t.Errorf("the source changed with its replicas: %q", body)
	}
	r0, err := e.sbc.GetSandboxEndpoint(ctx, &controldv1.GetSandboxEndpointRequest{Id: replicas[0]})
	if err != nil {
		t.Fatal(err)
	}
	s0 := e.session(ctx, r0.Endpoint)
	if out, ok := probe(ctx, t, s0, "get", outsideURL); !ok || !strings.HasPrefix(out, "200 outside ") {
		t.Errorf("replica egress: %q", out)
	}
	s0.Close()

	// Delete leaves nothing of a sandbox's network.
	for _, id := range replicas {
		if _, err := e.sbc.DeleteSandbox(ctx, &controldv1.DeleteSandboxRequest{Id: id}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.sbc.DeleteSandbox(ctx, &controldv1.DeleteSandboxRequest{Id: b.Sandbox.Id}); err != nil {
		t.Fatal(err)
	}
	if got := e.nm.Sandboxes(); len(got) != 1 || got[0] != a.Sandbox.Id {
		t.Errorf("networks after the deletes: %v, want only %s's", got, a.Sandbox.Id)
	}
	if n := countLinks(e.netCfg.IfPrefix); n != 1 {
		t.Errorf("%d host links after the deletes, want 1", n)
	}

	// A controld restart: sandboxes keep their networks (and DNS); what
	// no sandbox owns (a crash between a network's setup and its
	// container) is pruned.
	e.stop()
	stopped = true
	orphan, err := network.New(e.netCfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := orphan.Setup(ctx, "sb-orphanaaaaaaaaaaa", network.ModeEgress, network.Policy{}, false); err != nil {
		t.Fatal(err)
	}
	orphan.Close()
	e.start(ctx)
	stopped = false
	if got := e.nm.Sandboxes(); len(got) != 1 || got[0] != a.Sandbox.Id {
		t.Errorf("networks after the restart: %v, want only %s's", got, a.Sandbox.Id)
	}
	aep, err := e.sbc.GetSandboxEndpoint(ctx, &controldv1.GetSandboxEndpointRequest{Id: a.Sandbox.Id})
	if err != nil {
		t.Fatal(err)
	}
	sa = e.session(ctx, aep.Endpoint) // the new controld's gateway
	if out, ok := probe(ctx, t, sa, "lookup", "www.example.test"); !ok || out != e.answer.String() {
		t.Errorf("DNS after a controld restart: %q", out)
	}
	sa.Close()
	if _, err := e.sbc.DeleteSandbox(ctx, &controldv1.DeleteSandboxRequest{Id: a.Sandbox.Id}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.ckc.DeleteCheckpoint(ctx, &controldv1.DeleteCheckpointRequest{Id: ck.Checkpoint.Id}); err != nil {
		t.Fatal(err)
	}
	e.stop()
	stopped = true
	assertNoNetworks(t, e.netCfg)
}

func countLinks(prefix string) int {
	links, _ := netlink.LinkList()
	n := 0
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, prefix) {
			n++
		}
	}
	return n
}

// assertNoNetworks checks that nothing of cfg's sandbox networks is left:
// host links, namespaces, state files, sandbox chains.
func assertNoNetworks(t *testing.T, cfg network.Config) {
	t.Helper()
	if n := countLinks(cfg.IfPrefix); n != 0 {
		t.Errorf("%d host links left", n)
	}
	if ents, _ := os.ReadDir(filepath.Join(cfg.RunDir, "ns")); len(ents) != 0 {
		t.Errorf("%d namespaces left", len(ents))
	}
	if ents, _ := filepath.Glob(filepath.Join(cfg.RunDir, "*.json")); len(ents) != 0 {
		t.Errorf("state files left: %v", ents)
	}
	out, err := exec.Command("nft", "list", "table", "inet", cfg.Table).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list table: %v %s", err, out)
	}
	if strings.Contains(string(out), "chain sb_") {
		t.Errorf("sandbox chains left:\n%s", out)
	}
}

// An egress create that finds an egress warm slot gets a working network
// (the slot's namespaces, links, chain and DNS stub were made ahead).
func TestRealStackEgressWarmSlot(t *testing.T) {
	e := newNetEnv(t)
	e.cfg.Boot.Precreate = 1
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e.start(ctx)
	defer e.stop()
	egress := &controldv1.Network{Mode: controldv1.NetworkMode_NETWORK_MODE_EGRESS}
	// The first egress create boots cold and asks for egress slots.
	first := e.create(ctx, egress)
	var slot *controldv1.CreateSandboxResponse
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		time.Sleep(time.Second)
		r := e.create(ctx, egress)
		if r.Sandbox.GetBoot()[0].GetAt().AsDuration() == 0 { // create phase 0: a warm slot
			slot = r
			break
		}
		e.sbc.DeleteSandbox(ctx, &controldv1.DeleteSandboxRequest{Id: r.Sandbox.Id})
	}
	if slot == nil {
		t.Fatal("no egress create took a warm slot in 30 s")
	}
	for _, r := range []*controldv1.CreateSandboxResponse{first, slot} {
		s := e.session(ctx, r.Endpoint)
		if out, ok := probe(ctx, t, s, "get", "http://"+e.out.Addr.String()+"/"); !ok || !strings.HasPrefix(out, "200 outside ") {
			t.Errorf("%s egress: %q", r.Sandbox.Id, out)
		}
		s.Close()
		e.sbc.DeleteSandbox(ctx, &controldv1.DeleteSandboxRequest{Id: r.Sandbox.Id})
	}
}

// A pooled egress replica is held off the network until its claim, which
// connects it under the claim's policy without a restore.
func TestRealStackEgressPoolClaim(t *testing.T) {
	e := newNetEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e.start(ctx)
	defer e.stop()
	src := e.create(ctx, &controldv1.Network{Mode: controldv1.NetworkMode_NETWORK_MODE_EGRESS})
	s := e.session(ctx, src.Endpoint) // netprobe goes into the checkpoint's layer
	s.Close()
	ck, err := e.ckc.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Sandbox.Id})
	if err != nil {
		t.Fatal(err)
	}
	plc := controldv1.NewPoolServiceClient(e.conn)
	pl, err := plc.CreatePool(ctx, &controldv1.CreatePoolRequest{Source: &controldv1.CreatePoolRequest_CheckpointId{CheckpointId: ck.Checkpoint.Id}, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer plc.DeletePool(context.Background(), &controldv1.DeletePoolRequest{Id: pl.Pool.Id})
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		g, err := plc.GetPool(ctx, &controldv1.GetPoolRequest{Id: pl.Pool.Id})
		if err != nil {
			t.Fatal(err)
		}
		if g.Pool.Available == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("pool not filled in a minute")
		}
	}
	deny := &controldv1.NetworkPolicy{Deny: []*controldv1.NetworkRule{{Cidr: "192.0.2.0/24"}}}
	cr, err := plc.ClaimPool(ctx, &controldv1.ClaimPoolRequest{PoolId: pl.Pool.Id, NetworkPolicy: deny})
	if err != nil || !cr.Hit {
		t.Fatalf("claim: hit %v, %v", cr.GetHit(), err)
	}
	if got := cr.Sandbox.GetNetwork().GetPolicy().GetDeny(); len(got) != 1 {
		t.Errorf("claimed sandbox's policy %v", cr.Sandbox.GetNetwork())
	}
	sc := e.session(ctx, cr.Endpoint)
	if out, ok := probe(ctx, t, sc, "get", "http://"+e.out.Addr.String()+"/"); !ok || !strings.HasPrefix(out, "200 outside ") {
		t.Errorf("claimed replica's egress: %q", out)
	}
	sc.Close()
	for _, id := range []string{cr.Sandbox.Id, src.Sandbox.Id} {
		e.sbc.DeleteSandbox(ctx, &controldv1.DeleteSandboxRequest{Id: id})
	}
}
