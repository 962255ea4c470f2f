package app_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// TestRealStackRequestIDsAcrossCrash: the four creating calls with request
// ids, repeated after controld was SIGKILLed and restarted on the real
// stack, return what the first calls made (nothing is created twice); a
// pool grows and shrinks; a sandbox's TTL is extended; lists page.
func TestRealStackRequestIDsAcrossCrash(t *testing.T) {
	s := newProcStack(t)
	src := s.startWithSandbox("request-ids")
	ctx := s.ctx
	plc := controldv1.NewPoolServiceClient(s.conn)
	labels := map[string]string{"rid": "1"} // what the four calls make (not the source, not the pool's warm members)

	create := &controldv1.CreateSandboxRequest{WaitReady: true, Labels: labels, RequestId: "it-create"}
	first, err := s.sbc.CreateSandbox(ctx, create)
	if err != nil {
		t.Fatal(err)
	}
	ext, err := s.sbc.ExtendSandbox(ctx, &controldv1.ExtendSandboxRequest{Id: first.Sandbox.Id, Ttl: durationpb.New(time.Hour)})
	if err != nil || ext.Sandbox.ExpiresAt == nil {
		t.Fatalf("extend: %v %v", ext, err)
	}
	ckReq := &controldv1.CreateCheckpointRequest{SandboxId: src, RequestId: "it-ck"}
	ck, err := s.ckc.CreateCheckpoint(ctx, ckReq)
	if err != nil {
		t.Fatal(err)
	}
	forkReq := &controldv1.ForkCheckpointRequest{CheckpointId: ck.Checkpoint.Id, Count: 1, RequestId: "it-fork", Labels: labels}
	fork, err := s.ckc.ForkCheckpoint(ctx, forkReq)
	if err != nil || fork.Replicas[0].ErrorCode != 0 {
		t.Fatalf("fork: %v %v", fork, err)
	}
	pool, err := plc.CreatePool(ctx, &controldv1.CreatePoolRequest{Source: &controldv1.CreatePoolRequest_Image{Image: s.cfg.DefaultImage}, Size: 1,
		Labels: map[string]string{"pool": "rid"}})
	if err != nil {
		t.Fatal(err)
	}
	available := func(n uint32) func() bool {
		return func() bool {
			p, err := plc.GetPool(ctx, &controldv1.GetPoolRequest{Id: pool.Pool.Id})
			return err == nil && p.Pool.Available == n
		}
	}
	eventuallyWithin(t, time.Minute, "pool filled", available(1))
	if up, err := plc.UpdatePool(ctx, &controldv1.UpdatePoolRequest{Id: pool.Pool.Id, Size: 2}); err != nil || up.Pool.Size != 2 {
		t.Fatalf("grow: %v %v", up, err)
	}
	eventuallyWithin(t, time.Minute, "pool grown to 2", available(2))
	if down, err := plc.UpdatePool(ctx, &controldv1.UpdatePoolRequest{Id: pool.Pool.Id, Size: 1}); err != nil || down.Pool.Available > 1 {
		t.Fatalf("shrink: %v %v", down, err)
	}
	claimReq := &controldv1.ClaimPoolRequest{PoolId: pool.Pool.Id, RequestId: "it-claim", Labels: labels}
	claim, err := plc.ClaimPool(ctx, claimReq)
	if err != nil || !claim.Hit {
		t.Fatalf("claim: %v %v", claim, err)
	}

	s.kill() // a crash: nothing of the shutdown sequence runs
	s.start()
	plc = controldv1.NewPoolServiceClient(s.conn)
	if again, err := s.sbc.CreateSandbox(ctx, create); err != nil || again.Sandbox.Id != first.Sandbox.Id {
		t.Fatalf("create after the crash: %v %v", again, err)
	}
	if again, err := s.ckc.CreateCheckpoint(ctx, ckReq); err != nil || again.Checkpoint.Id != ck.Checkpoint.Id {
		t.Fatalf("checkpoint after the crash: %v %v", again, err)
	}
	if again, err := s.ckc.ForkCheckpoint(ctx, forkReq); err != nil || again.Replicas[0].GetSandbox().GetId() != fork.Replicas[0].Sandbox.Id {
		t.Fatalf("fork after the crash: %v %v", again, err)
	}
	if again, err := plc.ClaimPool(ctx, claimReq); err != nil || again.Sandbox.Id != claim.Sandbox.Id || !again.Hit {
		t.Fatalf("claim after the crash: %v %v", again, err)
	}
	got, err := s.sbc.GetSandbox(ctx, &controldv1.GetSandboxRequest{Id: first.Sandbox.Id})
	if err != nil || !got.Sandbox.ExpiresAt.AsTime().Equal(ext.Sandbox.ExpiresAt.AsTime()) {
		t.Fatalf("the extended TTL after the crash: %v %v", got, err)
	}
	// created, the replica, the claimed one; pages of one.
	var ids []string
	token := ""
	for range 10 {
		l, err := s.sbc.ListSandboxes(ctx, &controldv1.ListSandboxesRequest{Labels: labels, PageSize: 1, PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range l.Sandboxes {
			ids = append(ids, sb.Id)
		}
		if token = l.NextPageToken; token == "" {
			break
		}
	}
	if len(ids) != 3 {
		t.Fatalf("sandboxes of the test after repeats: %v (want the created, the replica and the claimed)", ids)
	}
	if _, err := plc.DeletePool(ctx, &controldv1.DeletePoolRequest{Id: pool.Pool.Id}); err != nil {
		t.Fatal(err)
	}
}

func eventuallyWithin(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
