package client_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/forkfleet/forkfleet/api/client"
	"github.com/forkfleet/forkfleet/api/controldfake"
	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/limits"
)

// fakeHost starts a fake standing in for one host named name that admits
// maxMem bytes of sandbox memory.
func fakeHost(t *testing.T, name string, maxMem int64) *controldfake.Server {
	t.Helper()
	srv := controldfake.Start(t)
	srv.Host = name
	lim := limits.Default()
	lim.MaxMemoryBytes = maxMem
	srv.Limits = lim
	return srv
}

func dialHosts(t *testing.T, targets ...string) (*client.Client, context.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	c, err := client.DialHosts(ctx, targets, client.WithToken(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, ctx
}

func TestSpread(t *testing.T) {
	st := func(admitted, maxMem, avail int64, n, maxN uint32) *controldv1.GetHostStatusResponse {
		return &controldv1.GetHostStatusResponse{AdmittedMemoryBytes: admitted, MaxMemoryBytes: maxMem, MemoryAvailableBytes: avail,
			Sandboxes: n, MaxSandboxes: maxN, DefaultMemoryBytes: 1 << 30}
	}
	for _, tc := range []struct {
		name  string
		hosts []*controldv1.GetHostStatusResponse
		mem   int64
		n     int
		want  []int
	}{
		{"most admission room", []*controldv1.GetHostStatusResponse{st(0, 4<<30, 64<<30, 0, 10), st(0, 8<<30, 64<<30, 0, 10)}, 1 << 30, 1, []int{1}},
		{"kernel memory bounds the room", []*controldv1.GetHostStatusResponse{st(0, 4<<30, 64<<30, 0, 10), st(0, 8<<30, 2<<30, 0, 10)}, 1 << 30, 1, []int{0}},
		{"replicas even out", []*controldv1.GetHostStatusResponse{st(0, 8<<30, 64<<30, 0, 10), st(0, 8<<30, 64<<30, 0, 10)}, 1 << 30, 4, []int{0, 1, 0, 1}},
		{"fill the larger first", []*controldv1.GetHostStatusResponse{st(0, 2<<30, 64<<30, 0, 10), st(0, 5<<30, 64<<30, 0, 10)}, 1 << 30, 4, []int{1, 1, 1, 0}},
		{"no slot", []*controldv1.GetHostStatusResponse{st(0, 8<<30, 64<<30, 10, 10), st(0, 2<<30, 64<<30, 0, 10)}, 1 << 30, 2, []int{1, 1}},
		{"host default memory", []*controldv1.GetHostStatusResponse{st(0, 3<<30, 64<<30, 0, 10), st(0, 2<<30, 64<<30, 0, 10)}, 0, 3, []int{0, 1, 0}},
		{"all full: most admission room", []*controldv1.GetHostStatusResponse{st(4<<30, 4<<30, 64<<30, 1, 10), st(7<<30, 8<<30, 64<<30, 1, 10)}, 2 << 30, 1, []int{1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := client.Spread(tc.hosts, tc.mem, tc.n); !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// New sandboxes go to the host with room; every later call reaches the host
// that owns the record, also from a client that never saw it.
func TestHostsPlacementAndRouting(t *testing.T) {
	a := fakeHost(t, "host-a", 3<<30)
	b := fakeHost(t, "host-b", 8<<30)
	c, ctx := dialHosts(t, a.Target, b.Target)

	hosts, err := c.Hosts(ctx)
	if err != nil || len(hosts) != 2 || hosts[0].Status.GetHost() != "host-a" || hosts[1].Status.GetHost() != "host-b" {
		t.Fatalf("hosts %v, %v", hosts, err)
	}

	var onA, onB []*client.Sandbox
	for range 6 {
		sb, err := c.CreateSandbox(ctx, client.WithResources(&controldv1.Resources{MemoryBytes: 1 << 30}))
		if err != nil {
			t.Fatal(err)
		}
		switch sb.Info().GetHost() {
		case "host-a":
			onA = append(onA, sb)
		case "host-b":
			onB = append(onB, sb)
		default:
			t.Fatalf("host %q", sb.Info().GetHost())
		}
	}
	// 8 GiB and 3 GiB of room: b takes the first five, then they are even.
	if len(onA) != 1 || len(onB) != 5 {
		t.Fatalf("placed %d on a, %d on b", len(onA), len(onB))
	}
	// Full hosts: the one with the most room refuses, as it would alone.
	var extra []*client.Sandbox
	for range 5 {
		sb, err := c.CreateSandbox(ctx, client.WithResources(&controldv1.Resources{MemoryBytes: 1 << 30}))
		if err != nil {
			t.Fatal(err)
		}
		extra = append(extra, sb)
	}
	_, err = c.CreateSandbox(ctx, client.WithResources(&controldv1.Resources{MemoryBytes: 1 << 30}))
	if !errors.Is(err, errdefs.ErrResourceExhausted) || errdefs.Reason(err) != limits.ReasonHostFull {
		t.Fatalf("full fleet: %v", err)
	}
	for _, sb := range extra {
		if err := sb.Delete(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// Routing: a checkpoint and a fork of b's sandbox happen on b.
	ck, err := onB[0].Checkpoint(ctx, client.WithName("base"))
	if err != nil || ck.Info().GetHost() != "host-b" {
		t.Fatalf("checkpoint %v, %v", ck.Info(), err)
	}
	if err := onB[1].Delete(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := ck.Fork(ctx, 1)
	if err != nil || res[0].Err != nil || res[0].Sandbox.Info().GetHost() != "host-b" {
		t.Fatalf("fork %v, %v", res, err)
	}

	// A second client knows none of the ids: it finds their hosts.
	c2, _ := dialHosts(t, b.Target, a.Target)
	got, err := c2.GetSandbox(ctx, onA[0].ID())
	if err != nil || got.Info().GetHost() != "host-a" {
		t.Fatalf("get a's sandbox: %v, %v", got, err)
	}
	if err := c2.Sandbox(onA[0].ID()).Suspend(ctx); err != nil {
		t.Fatal(err)
	}
	if info, _ := a.Fake.GetSandbox(ctx, &controldv1.GetSandboxRequest{Id: onA[0].ID()}); info.GetSandbox().GetState() != controldv1.SandboxState_SANDBOX_STATE_SUSPENDED {
		t.Fatalf("a's sandbox: %v", info)
	}
	if byName, err := c2.GetCheckpoint(ctx, "base"); err != nil || byName.ID() != ck.ID() {
		t.Fatalf("checkpoint by name: %v", err)
	}
	if _, err := c2.GetSandbox(ctx, "sb-aaaaaaaaaaaaaaaa"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown id: %v", err)
	}
	if _, err := c2.GetSandbox(ctx, "nope"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("bad id: %v", err)
	}

	// Lists merge every host's records, oldest first, page by page.
	all, err := c2.ListSandboxes(ctx)
	if err != nil || len(all) != 6 {
		t.Fatalf("list: %d, %v", len(all), err)
	}
	for i := 1; i < len(all); i++ {
		if all[i].GetCreatedAt().AsTime().Before(all[i-1].GetCreatedAt().AsTime()) {
			t.Fatalf("list out of order at %d", i)
		}
	}
	var paged []*controldv1.Sandbox
	token := ""
	for {
		page, next, err := c2.ListSandboxesPage(ctx, token, client.WithPageSize(2))
		if err != nil {
			t.Fatal(err)
		}
		paged = append(paged, page...)
		if next == "" {
			break
		}
		token = next
	}
	if len(paged) != 6 {
		t.Fatalf("paged list: %d", len(paged))
	}
	if _, _, err := c2.ListSandboxesPage(ctx, "garbage"); !errors.Is(err, errdefs.ErrInvalidArgument) || errdefs.Field(err) != "page_token" {
		t.Fatalf("foreign token: %v", err)
	}

	// An image pool goes where the room is; a checkpoint pool to its checkpoint.
	pl, err := c.CreatePool(ctx, "warm", 1, client.FromCheckpoint(ck.ID()))
	if err != nil || pl.GetHost() != "host-b" {
		t.Fatalf("checkpoint pool %v, %v", pl, err)
	}
	claim, err := c2.ClaimPool(ctx, pl.GetId())
	if err != nil || claim.Sandbox.Info().GetHost() != "host-b" {
		t.Fatalf("claim %v, %v", claim, err)
	}
}

// A watch through a client of many hosts sees every host's events.
func TestHostsWatch(t *testing.T) {
	a := fakeHost(t, "host-a", 8<<30)
	b := fakeHost(t, "host-b", 8<<30)
	c, ctx := dialHosts(t, a.Target, b.Target)
	sa, err := c.CreateSandbox(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := c.CreateSandbox(ctx)
	if err != nil || sa.Info().GetHost() == sb.Info().GetHost() {
		t.Fatalf("second sandbox on %q: %v", sb.Info().GetHost(), err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	seen := map[string]bool{}
	for ev, err := range c.Watch(wctx) {
		if err != nil {
			t.Fatal(err)
		}
		seen[ev.GetSandbox().GetHost()] = true
		if len(seen) == 2 {
			break
		}
	}
}

// A host that goes away: calls for its records fail with
// ReasonHostUnreachable, the other host keeps serving, placement skips it.
func TestHostsHostLoss(t *testing.T) {
	a := fakeHost(t, "host-a", 8<<30)
	b := fakeHost(t, "host-b", 4<<30)
	c, ctx := dialHosts(t, a.Target, b.Target)
	onA, err := c.CreateSandbox(ctx)
	if err != nil || onA.Info().GetHost() != "host-a" {
		t.Fatal(onA.Info(), err)
	}
	onB, err := c.CreateSandbox(ctx, client.WithResources(&controldv1.Resources{MemoryBytes: 64 << 20}))
	if err != nil {
		t.Fatal(err)
	}
	if onB.Info().GetHost() != "host-a" {
		// a has 7 GiB left, b 4: both went to a; ask for b directly.
		onB = nil
	}
	a.Close()
	_, err = onA.Get(ctx)
	if !errors.Is(err, errdefs.ErrUnavailable) || errdefs.Reason(err) != client.ReasonHostUnreachable {
		t.Fatalf("lost host: %v", err)
	}
	sb, err := c.CreateSandbox(ctx)
	if err != nil || sb.Info().GetHost() != "host-b" {
		t.Fatalf("placement after the loss: %v, %v", sb, err)
	}
	if _, err := sb.Get(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListSandboxes(ctx); !errors.Is(err, errdefs.ErrUnavailable) || errdefs.Reason(err) != client.ReasonHostUnreachable {
		t.Fatalf("list with a host lost: %v", err)
	}
	c2, _ := dialHosts(t, a.Target, b.Target)
	if _, err := c2.GetSandbox(ctx, onA.ID()); !errors.Is(err, errdefs.ErrUnavailable) || errdefs.Reason(err) != client.ReasonHostUnreachable {
		t.Fatalf("lookup with a host lost: %v", err)
	}
}

// dns:/// targets: one controld per address, resolved again when a route
// is missing; a host reached at two addresses counts once.
func TestHostsDNS(t *testing.T) {
	serve := func(name string) (*controldfake.Fake, string) {
		f := controldfake.New()
		f.Host = name
		gs := grpc.NewServer(f.ServerOptions()...)
		f.Register(gs)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go gs.Serve(ln)
		t.Cleanup(func() { f.Close(); gs.Stop() })
		return f, ln.Addr().String()
	}
	_, addrA := serve("host-a")
	fb, addrB := serve("host-b")
	_, portA, _ := net.SplitHostPort(addrA)
	_, portB, _ := net.SplitHostPort(addrB)
	if portA == portB {
		t.Skip("same port twice")
	}
	// Two names of one port each stand in for a Service's pods (both
	// fakes listen on 127.0.0.1, on ports of their own).
	resolved := map[string][]string{"a.svc": {"127.0.0.1"}, "b.svc": {}}
	lookup := func(_ context.Context, host string) ([]string, error) {
		ips, ok := resolved[host]
		if !ok {
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		}
		return ips, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := client.DialHosts(ctx, []string{"dns:///a.svc:" + portA, "dns:///b.svc:" + portB}, client.WithToken(""), client.WithLookupHost(lookup))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	hosts, err := c.Hosts(ctx)
	if err != nil || len(hosts) != 1 || hosts[0].Status.GetHost() != "host-a" {
		t.Fatalf("hosts %v, %v", hosts, err)
	}
	// b's pod appears; a sandbox made there is found by the lookup's
	// re-resolution.
	resolved["b.svc"] = []string{"127.0.0.1"}
	r, err := fb.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.GetSandbox(ctx, r.GetSandbox().GetId()); err != nil || got.Info().GetHost() != "host-b" {
		t.Fatalf("after the pod appeared: %v, %v", got, err)
	}
	if hosts, err := c.Hosts(ctx); err != nil || len(hosts) != 2 {
		t.Fatalf("hosts %v, %v", hosts, err)
	}
	// a's pod leaves: its records' calls fail as a lost host.
	sa, err := c.CreateSandbox(ctx, client.WithResources(&controldv1.Resources{MemoryBytes: 64 << 20}))
	if err != nil {
		t.Fatal(err)
	}
	owner := sa.Info().GetHost()
	if owner == "host-a" {
		resolved["a.svc"] = nil
	} else {
		resolved["b.svc"] = nil
	}
	c.Close()
	c3, err := client.DialHosts(ctx, []string{"dns:///a.svc:" + portA, "dns:///b.svc:" + portB}, client.WithToken(""), client.WithLookupHost(lookup))
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if _, err := c3.GetSandbox(ctx, sa.ID()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("sandbox of a pod gone from the Service: %v", err)
	}
	if _, err := client.DialHosts(ctx, []string{"dns:///gone.svc:1"}, client.WithToken(""), client.WithLookupHost(lookup)); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("unresolvable name: %v", err)
	}
}

// With a registry, a fork spreads its replicas over the hosts with room:
// the checkpoint's host forks its share, the others pull the checkpoint
// (pushed once) and fork theirs.
func TestHostsForkAcross(t *testing.T) {
	reg := controldfake.NewRegistry()
	a := fakeHost(t, "host-a", 3<<30)
	b := fakeHost(t, "host-b", 4<<30)
	a.Registry, b.Registry = reg, reg
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := client.DialHosts(ctx, []string{a.Target, b.Target}, client.WithToken(""),
		client.WithCheckpointRegistry("127.0.0.1:5000/forkfleet/checkpoints"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The source lands on b (more room); its checkpoint is b's.
	src, err := c.CreateSandbox(ctx)
	if err != nil || src.Info().GetHost() != "host-b" {
		t.Fatalf("source on %q: %v", src.Info().GetHost(), err)
	}
	ck, err := src.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// 1 GiB replicas: a has room for 3, b for 3 more.
	res, err := ck.Fork(ctx, 5, client.WithRequestID("fork-1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := client.FirstError(res); err != nil {
		t.Fatal(err)
	}
	hosts := map[string]int{}
	for _, r := range res {
		hosts[r.Sandbox.Info().GetHost()]++
	}
	if hosts["host-a"] != 3 || hosts["host-b"] != 2 {
		t.Fatalf("replicas per host %v", hosts)
	}
	// b's replicas come first and fork the checkpoint itself; a's its import.
	if res[0].Sandbox.Info().GetCheckpointId() != ck.ID() || res[4].Sandbox.Info().GetCheckpointId() == ck.ID() {
		t.Fatalf("checkpoints forked: %s, %s", res[0].Sandbox.Info().GetCheckpointId(), res[4].Sandbox.Info().GetCheckpointId())
	}
	// Later calls reach each replica's host.
	for _, r := range res {
		if err := r.Sandbox.Delete(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A second fork pulls nothing again: a forks its import once more.
	res2, err := ck.Fork(ctx, 5)
	if err != nil || client.FirstError(res2) != nil {
		t.Fatalf("second fork: %v %v", err, client.FirstError(res2))
	}
	if res2[4].Sandbox.Info().GetCheckpointId() != res[4].Sandbox.Info().GetCheckpointId() {
		t.Fatal("a pulled the checkpoint again")
	}
	// A host that fails its share fails its replicas only.
	a.FailReplica = func(string, int) error { return errdefs.ErrInternal }
	for _, r := range res2 {
		r.Sandbox.Delete(ctx)
	}
	res3, err := ck.Fork(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	failed := 0
	for _, r := range res3 {
		if r.Err != nil {
			if r.Replica.GetErrorCode() == 0 {
				t.Fatalf("failed replica without its code: %v", r.Replica)
			}
			failed++
		} else {
			r.Sandbox.Delete(ctx)
		}
	}
	if failed != 3 {
		t.Fatalf("%d replicas failed, want a's 3", failed)
	}
}

// A host whose share fails as a whole (here it cannot pull: no shared
// registry) fails each of its replicas with that error; the others fork.
func TestHostsForkShareFails(t *testing.T) {
	a := fakeHost(t, "host-a", 4<<30)
	b := fakeHost(t, "host-b", 4<<30)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := client.DialHosts(ctx, []string{a.Target, b.Target}, client.WithToken(""), client.WithCheckpointRegistry("127.0.0.1:5000/ff/ck"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	src, err := c.CreateSandbox(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := src.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := ck.Fork(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	var ok, failed int
	for _, r := range res {
		switch {
		case r.Err == nil && r.Sandbox.Info().GetHost() == src.Info().GetHost():
			ok++
		case errors.Is(r.Err, errdefs.ErrNotFound) && r.Replica.GetErrorCode() != 0:
			failed++
		default:
			t.Fatalf("replica %v: %v", r.Replica, r.Err)
		}
	}
	if ok == 0 || failed == 0 || ok+failed != 4 {
		t.Fatalf("%d forked on the checkpoint's host, %d failed", ok, failed)
	}
}
