package fleet_test

import (
	"context"
	"sync"
	"testing"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/guestsock"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// frozenPool makes a checkpoint pool of size n and waits until it is full.
func frozenPool(t *testing.T, e *env, n uint32) *controldv1.Pool {
	t.Helper()
	ctx := context.Background()
	src := e.ready(nil)
	ck, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id})
	if err != nil {
		t.Fatal(err)
	}
	p, err := e.m.CreatePool(ctx, &controldv1.CreatePoolRequest{Source: &controldv1.CreatePoolRequest_CheckpointId{CheckpointId: ck.Id}, Size: n})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "checkpoint pool filled", func() bool {
		got, _ := e.m.GetPool(ctx, p.Id)
		return got.Available == n
	})
	return p
}

// A burst of concurrent claims gets distinct thawed sandboxes, each claim
// durable with its hit counted: after a restart none of them is back in the
// pool or handed out again.
func TestPoolClaimBurstIsDurable(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	const n = 4
	p := frozenPool(t, e, n)
	var mu sync.Mutex
	claimed := map[string]bool{}
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, _, hit, _, err := e.m.ClaimPool(ctx, &controldv1.ClaimPoolRequest{PoolId: p.Id, Labels: map[string]string{"who": "burst"}})
			if err != nil || !hit {
				t.Errorf("claim: hit=%v err=%v", hit, err)
				return
			}
			if s.State != controldv1.SandboxState_SANDBOX_STATE_READY || e.rt.Status(s.Id) != runtime.StatusRunning {
				t.Errorf("claimed %s: state %v, runtime %v", s.Id, s.State, e.rt.Status(s.Id))
			}
			mu.Lock()
			defer mu.Unlock()
			if claimed[s.Id] {
				t.Errorf("sandbox %s handed out twice", s.Id)
			}
			claimed[s.Id] = true
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	got, _ := e.m.GetPool(ctx, p.Id)
	if got.Hits != n || got.Misses != 0 {
		t.Fatalf("counters after the burst: hits %d misses %d, want %d 0", got.Hits, got.Misses, n)
	}

	e.restart()
	got, err := e.m.GetPool(ctx, p.Id)
	if err != nil || got.Hits != n {
		t.Fatalf("pool after restart: %+v %v (want %d hits)", got, err, n)
	}
	for id := range claimed {
		s, err := e.m.GetSandbox(ctx, id)
		if err != nil || s.State != controldv1.SandboxState_SANDBOX_STATE_READY || s.Labels["who"] != "burst" {
			t.Fatalf("claimed %s after restart: %+v %v", id, s, err)
		}
	}
	eventually(t, "pool refilled after restart", func() bool {
		got, _ := e.m.GetPool(ctx, p.Id)
		return got.Available == n
	})
	s, _, hit, _, err := e.m.ClaimPool(ctx, &controldv1.ClaimPoolRequest{PoolId: p.Id})
	if err != nil || !hit || claimed[s.Id] {
		t.Fatalf("claim after restart: %v hit=%v err=%v (already claimed: %v)", s.GetId(), hit, err, claimed[s.GetId()])
	}
}

// A warm sandbox that cannot be thawed is removed, the claim is served by
// the next one, and only the served claim counts as a hit.
func TestPoolClaimSkipsBrokenReplica(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	p := frozenPool(t, e, 2)
	var frozen []string
	for _, id := range e.rt.IDs() {
		if e.rt.Status(id) == runtime.StatusFrozen {
			frozen = append(frozen, id)
		}
	}
	if len(frozen) != 2 {
		t.Fatalf("%d frozen replicas, want 2", len(frozen))
	}
	// The one a claim takes first (the oldest) is gone from the runtime.
	a, err := e.m.GetSandbox(ctx, frozen[0])
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.m.GetSandbox(ctx, frozen[1])
	if err != nil {
		t.Fatal(err)
	}
	if b.ReadyAt.AsTime().Before(a.ReadyAt.AsTime()) {
		frozen[0], frozen[1] = frozen[1], frozen[0]
	}
	e.rt.Vanish(frozen[0])
	s, _, hit, _, err := e.m.ClaimPool(ctx, &controldv1.ClaimPoolRequest{PoolId: p.Id})
	if err != nil {
		t.Fatal(err)
	}
	if hit && s.Id != frozen[1] {
		t.Fatalf("claimed %s, want the intact replica %s", s.Id, frozen[1])
	}
	if _, err := e.m.GetSandbox(ctx, frozen[0]); err == nil {
		t.Fatalf("broken replica %s still listed", frozen[0])
	}
	got, _ := e.m.GetPool(ctx, p.Id)
	if hit && got.Hits != 1 || !hit && got.Hits != 0 {
		t.Fatalf("hit=%v but the pool counts %d hits", hit, got.Hits)
	}
}

// countingDialer counts the sessions opened per socket.
type countingDialer struct {
	fleet.GuestDialer
	mu    sync.Mutex
	dials map[string]int
}

func (d *countingDialer) DialGuest(ctx context.Context, addr guestsock.Addr, token string) (fleet.Guest, error) {
	d.mu.Lock()
	d.dials[addr.Path]++
	d.mu.Unlock()
	return d.GuestDialer.DialGuest(ctx, addr, token)
}

func (d *countingDialer) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, c := range d.dials {
		n += c
	}
	return n
}

// A claim from a frozen pool pings over the session its member kept across
// the freeze instead of opening one; without it (controld restarted) the
// claim dials.
func TestPoolClaimUsesHeldSession(t *testing.T) {
	var cd *countingDialer
	e := newEnv(t, func(o *fleet.Options) {
		if cd == nil {
			cd = &countingDialer{GuestDialer: o.Dialer, dials: map[string]int{}}
		} else {
			cd.GuestDialer = o.Dialer
		}
		o.Dialer = cd
	})
	ctx := context.Background()
	p := frozenPool(t, e, 2)
	before := cd.count()
	s, _, hit, _, err := e.m.ClaimPool(ctx, &controldv1.ClaimPoolRequest{PoolId: p.Id})
	if err != nil || !hit || e.rt.Status(s.Id) != runtime.StatusRunning {
		t.Fatalf("claim: %v hit=%v err=%v", s.GetId(), hit, err)
	}
	if n := cd.count() - before; n != 0 {
		t.Fatalf("claim opened %d sessions, want 0 (ping over the held one)", n)
	}

	e.restart()
	before = cd.count()
	s, _, hit, _, err = e.m.ClaimPool(ctx, &controldv1.ClaimPoolRequest{PoolId: p.Id})
	if err != nil || !hit || e.rt.Status(s.Id) != runtime.StatusRunning {
		t.Fatalf("claim after restart: %v hit=%v err=%v", s.GetId(), hit, err)
	}
	if n := cd.count() - before; n < 1 {
		t.Fatal("claim after a restart did not dial (no held session can exist)")
	}
}

// A frozen pool's members wait with their apps held stopped (restored with
// HoldApps): a claim lets them run, over the held session and, after a
// restart, over a fresh one. A fork of one runs its apps at once; a fan-out
// holds them until every replica is verified.
func TestPoolMemberAppsHeldUntilClaim(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	p := frozenPool(t, e, 2)
	var members []string
	for _, id := range e.rt.IDs() {
		if e.rt.Status(id) == runtime.StatusFrozen {
			members = append(members, id)
			if !e.rt.Guest(id).AppsHeld() {
				t.Fatalf("member %s waits with its apps running", id)
			}
		}
	}
	if len(members) != 2 {
		t.Fatalf("%d frozen members, want 2", len(members))
	}
	for range 2 {
		s, _, hit, _, err := e.m.ClaimPool(ctx, &controldv1.ClaimPoolRequest{PoolId: p.Id})
		if err != nil || !hit {
			t.Fatalf("claim: hit=%v err=%v", hit, err)
		}
		if e.rt.Guest(s.Id).AppsHeld() {
			t.Fatalf("claimed %s with its apps still held", s.Id)
		}
		e.restart() // the second claim has no held session
	}

	// A fan-out holds its replicas' apps until all are verified, and
	// returns them running.
	for _, n := range []uint32{1, 3} {
		resp, err := e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: p.CheckpointId, Count: n})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range resp.Replicas {
			if r.ErrorCode != 0 {
				t.Fatalf("fork %d: %s", n, r.ErrorMessage)
			}
			if g := e.rt.Guest(r.Sandbox.Id); g.AppsHeld() || (n > 1) != (g.Restored() == 1 && g.AppsResumed()) {
				t.Fatalf("fork %d: replica %s held %v, resumed %v", n, r.Sandbox.Id, g.AppsHeld(), g.AppsResumed())
			}
		}
	}
}
