package app_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/forkfleet/forkfleet/api/client"
	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/app"
	"github.com/forkfleet/forkfleet/controld/internal/config"
	"github.com/forkfleet/forkfleet/controld/internal/testenv"
)

// TestRealStackHosts runs two controlds on the real stack, each with its
// own state, sockets, ports and containerd namespace (two hosts on one
// machine), behind one client.DialHosts: new sandboxes go to the host with
// room, every later call (ACI, checkpoint, fork, a lookup by a client that
// never saw the id) reaches the owner, and a host that stops answering
// fails the calls for its records with HOST_UNREACHABLE while the other
// host serves on.
func TestRealStackHosts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// The default sandbox asks for 1 GiB: a admits 2, b admits 3.
	a := startHost(t, ctx, "a", 2<<30)
	b := startHost(t, ctx, "b", 3<<30)
	c, err := client.DialHosts(ctx, []string{"unix://" + a.addrs.GRPCUnix, "unix://" + b.addrs.GRPCUnix}, client.WithToken(""))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var cleanup []func()
	defer func() {
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
	}()
	gone := map[string]bool{}
	del := func(sb *client.Sandbox) {
		cleanup = append(cleanup, func() {
			if gone[sb.ID()] {
				return
			}
			if err := sb.Delete(context.Background()); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("delete %s: %v", sb.ID(), err)
			}
		})
	}

	hosts, err := c.Hosts(ctx)
	if err != nil || len(hosts) != 2 {
		t.Fatalf("hosts %v, %v", hosts, err)
	}
	for i, want := range []string{"host-a", "host-b"} {
		st := hosts[i].Status
		if hosts[i].Err != nil || st.GetHost() != want || st.GetMemoryAvailableBytes() <= 0 || st.GetSandboxes() != 0 {
			t.Fatalf("host %d: %v %v", i, st, hosts[i].Err)
		}
	}

	// Placement by room: b (3 GiB free) first, then a tie that the earlier
	// host takes.
	first, err := c.CreateSandbox(ctx, client.WithWaitReady())
	if err != nil {
		t.Fatal(err)
	}
	del(first)
	second, err := c.CreateSandbox(ctx, client.WithWaitReady())
	if err != nil {
		t.Fatal(err)
	}
	del(second)
	if first.Info().GetHost() != "host-b" || second.Info().GetHost() != "host-a" {
		t.Fatalf("placed on %s, then %s", first.Info().GetHost(), second.Info().GetHost())
	}
	for _, sb := range []*client.Sandbox{first, second} {
		s, err := sb.ACI(ctx)
		if err != nil {
			t.Fatalf("ACI of %s on %s: %v", sb.ID(), sb.Info().GetHost(), err)
		}
		if _, err := s.Ping(ctx, nil); err != nil {
			t.Fatalf("ping %s: %v", sb.ID(), err)
		}
		s.Close()
	}

	// Checkpoint and fork on the owner: a's sandbox, a's checkpoint, a's
	// verified replica.
	ck, err := second.Checkpoint(ctx, client.WithName("hosts-base"))
	if err != nil || ck.Info().GetHost() != "host-a" {
		t.Fatalf("checkpoint %v: %v", ck.Info(), err)
	}
	cleanup = append(cleanup, func() {
		if _, err := ck.Delete(context.Background(), client.WithCascade()); err != nil {
			t.Errorf("delete checkpoint: %v", err)
		}
	})
	res, err := ck.Fork(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Sandbox != nil {
			del(r.Sandbox)
		}
	}
	if err := client.FirstError(res); err != nil {
		t.Fatalf("fork: %v", err)
	}
	replica := res[0].Sandbox
	if replica.Info().GetHost() != "host-a" {
		t.Fatalf("replica on %s", replica.Info().GetHost())
	}

	// A client that never saw these ids finds their hosts.
	c2, err := client.DialHosts(ctx, []string{"unix://" + b.addrs.GRPCUnix, "unix://" + a.addrs.GRPCUnix}, client.WithToken(""))
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	for _, sb := range []*client.Sandbox{first, second, replica} {
		got, err := c2.GetSandbox(ctx, sb.ID())
		if err != nil || got.Info().GetHost() != sb.Info().GetHost() {
			t.Fatalf("lookup of %s: %v, %v", sb.ID(), got, err)
		}
	}
	if got, err := c2.GetCheckpoint(ctx, "hosts-base"); err != nil || got.ID() != ck.ID() {
		t.Fatalf("checkpoint by name: %v", err)
	}
	all, err := c2.ListSandboxes(ctx)
	if err != nil || len(all) != 3 {
		t.Fatalf("list: %d, %v", len(all), err)
	}
	st, err := c2.Hosts(ctx)
	if err != nil || st[0].Status.GetSandboxes() != 1 || st[0].Status.GetAdmittedMemoryBytes() != 1<<30 ||
		st[1].Status.GetSandboxes() != 2 || st[1].Status.GetCheckpoints() != 1 {
		t.Fatalf("statuses %v, %v", st, err)
	}

	// b goes away (its sandbox deleted first: a stopped controld leaves
	// its sandboxes running for the next start to adopt).
	if err := first.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	gone[first.ID()] = true
	b.stop()
	lostCtx, lostCancel := context.WithTimeout(ctx, 30*time.Second)
	defer lostCancel()
	_, err = first.Get(lostCtx)
	if !errors.Is(err, errdefs.ErrUnavailable) || errdefs.Reason(err) != client.ReasonHostUnreachable {
		t.Fatalf("a call for the lost host's sandbox: %v", err)
	}
	if _, err := second.Get(ctx); err != nil {
		t.Fatalf("the other host: %v", err)
	}
	if _, err := c.ListSandboxes(lostCtx); errdefs.Reason(err) != client.ReasonHostUnreachable {
		t.Fatalf("list without b: %v", err)
	}
}

// startHost runs a controld standing in for host "host-"+name: its own
// state, sockets, ports and containerd namespace, admitting admitMemory
// bytes of sandbox memory, no warm slots.
func startHost(t *testing.T, ctx context.Context, name string, admitMemory config.Size) *daemon {
	t.Helper()
	cfg, _, _ := realStackConfig(t, "forkfleet-hosts-"+name)
	cfg.Host = "host-" + name
	cfg.Admission.MaxMemory = config.Share{Bytes: admitMemory}
	cfg.Boot.Precreate = 0
	rt := realStackRuntime(t, ctx, cfg, filepath.Join(cfg.StateDir, "runtime"))
	// After controld stops: the checkpoint images exported and pulled go
	// (the namespace is the test's; its desktop image stays for the next run).
	t.Cleanup(func() {
		bg := namespaces.WithNamespace(context.Background(), cfg.Containerd.Namespace)
		imgs, err := rt.Client().ImageService().List(bg)
		if err != nil {
			t.Errorf("list images: %v", err)
			return
		}
		for _, img := range imgs {
			if img.Name != cfg.DefaultImage {
				if err := rt.Client().ImageService().Delete(bg, img.Name, images.SynchronousDelete()); err != nil {
					t.Errorf("delete image %s: %v", img.Name, err)
				}
			}
		}
	})
	return startWith(t, cfg, app.Deps{Runtime: rt})
}

// TestRealStackHostsForkAcross forks one checkpoint over two controlds
// through a real registry (Debian's docker-registry on the loopback): the
// checkpoint's host forks its share, the other pulls the checkpoint pushed
// once and forks its own; every replica passes every verification level
// the checkpoint supports, and later calls reach each replica's host.
func TestRealStackHostsForkAcross(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	reg := testenv.Registry(t)
	// Room for the source and two replicas on a, two replicas on b: the
	// tie goes to a, the earlier host, and the third replica to b.
	a := startHost(t, ctx, "fa", 3<<30)
	b := startHost(t, ctx, "fb", 2<<30)
	c, err := client.DialHosts(ctx, []string{"unix://" + a.addrs.GRPCUnix, "unix://" + b.addrs.GRPCUnix}, client.WithToken(""),
		client.WithCheckpointRegistry(reg+"/forkfleet/hosts"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var cleanup []func()
	defer func() {
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
	}()
	src, err := c.CreateSandbox(ctx, client.WithWaitReady())
	if err != nil {
		t.Fatal(err)
	}
	cleanup = append(cleanup, func() { src.Delete(context.Background()) })
	if src.Info().GetHost() != "host-fa" {
		t.Fatalf("source on %s", src.Info().GetHost())
	}
	ck, err := src.Checkpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cleanup = append(cleanup, func() {
		if _, err := ck.Delete(context.Background(), client.WithCascade()); err != nil {
			t.Errorf("delete checkpoint: %v", err)
		}
	})
	// b's import of the checkpoint goes with it.
	cleanup = append(cleanup, func() {
		cks, err := c.ListCheckpoints(context.Background())
		if err != nil {
			t.Errorf("list checkpoints: %v", err)
			return
		}
		for _, k := range cks {
			if k.GetHost() == "host-fb" {
				if _, err := c.Checkpoint(k.GetId()).Delete(context.Background(), client.WithCascade()); err != nil {
					t.Errorf("delete b's import: %v", err)
				}
			}
		}
	})
	levels := ck.Info().GetVerifyLevels()
	res, err := ck.Fork(ctx, 3, client.WithVerify(levels...))
	if err != nil {
		t.Fatal(err)
	}
	perHost := map[string]int{}
	for _, r := range res {
		if r.Sandbox != nil {
			cleanup = append(cleanup, func() { r.Sandbox.Delete(context.Background()) })
			perHost[r.Sandbox.Info().GetHost()]++
		}
	}
	if err := client.FirstError(res); err != nil {
		t.Fatalf("fork: %v", err)
	}
	if perHost["host-fa"] != 2 || perHost["host-fb"] != 1 {
		t.Fatalf("replicas per host %v", perHost)
	}
	// Each replica was verified at every level the checkpoint supports
	// before the fork returned it.
	for _, r := range res {
		if len(r.Verification) != len(levels) {
			t.Fatalf("replica %s on %s: verified %v, want %v", r.Sandbox.ID(), r.Sandbox.Info().GetHost(), r.Verification, levels)
		}
		for _, v := range r.Verification {
			if !v.GetOk() {
				t.Fatalf("replica %s on %s: %s failed: %s", r.Sandbox.ID(), r.Sandbox.Info().GetHost(), v.GetLevel(), v.GetDetail())
			}
		}
		s, err := r.Sandbox.ACI(ctx)
		if err != nil {
			t.Fatalf("ACI of %s: %v", r.Sandbox.ID(), err)
		}
		if _, err := s.Ping(ctx, nil); err != nil {
			t.Fatalf("ping %s: %v", r.Sandbox.ID(), err)
		}
		s.Close()
	}
}
