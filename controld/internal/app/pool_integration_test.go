package app_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/rules"
	"github.com/forkfleet/forkfleet/controld/internal/testenv"
)

// TestRealStackImagePoolMissForks checks an image pool's misses on the real
// stack: once full, the pool has its own memory-tier checkpoint (shown with
// its label, refused to DeleteCheckpoint); a claim beyond the pool is a
// fork of it, verified at every level the checkpoint records and usable
// through the gateway with its own token. When the image name moves to
// another digest (a new manifest in containerd), the pool makes a checkpoint
// of the new image, its misses fork from that one, and the retired one
// stays while its fork lives and goes with it; its member of the old build
// is replaced, so a hit runs the new one too. DeletePool leaves the pool's
// checkpoint to its claimed fork and it goes with that fork.
func TestRealStackImagePoolMissForks(t *testing.T) {
	s := newStackIn(t, "forkfleet-pool-it")
	s.launch(0)
	ctx := s.ctx
	pl, err := s.plc.CreatePool(ctx, &controldv1.CreatePoolRequest{Source: &controldv1.CreatePoolRequest_Image{Image: s.image}, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	poolID := pl.Pool.Id
	t.Cleanup(func() {
		if _, err := s.plc.DeletePool(context.Background(), &controldv1.DeletePoolRequest{Id: poolID}); err != nil && status.Code(err) != codes.NotFound {
			t.Errorf("delete pool: %v", err)
		}
	})
	var ck *controldv1.Checkpoint
	deadline := time.Now().Add(3 * time.Minute)
	for ck == nil {
		g, err := s.plc.GetPool(ctx, &controldv1.GetPoolRequest{Id: poolID})
		if err != nil {
			t.Fatal(err)
		}
		l, err := s.ckc.ListCheckpoints(ctx, &controldv1.ListCheckpointsRequest{Labels: map[string]string{rules.PoolIDLabel: poolID}})
		if err != nil {
			t.Fatal(err)
		}
		if g.Pool.Available == 1 && len(l.Checkpoints) == 1 {
			ck = l.Checkpoints[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool never full with its checkpoint: available %d, checkpoints %d", g.Pool.Available, len(l.Checkpoints))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if ck.Tier != controldv1.CheckpointTier_CHECKPOINT_TIER_MEMORY {
		t.Fatalf("pool checkpoint of tier %s", ck.Tier)
	}
	if _, err := s.ckc.DeleteCheckpoint(ctx, &controldv1.DeleteCheckpointRequest{Id: ck.Id}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("DeleteCheckpoint of the pool's own: %v, want FAILED_PRECONDITION", err)
	}

	// Two claims at once on a pool of one: one hit, one miss.
	type claim struct {
		r   *controldv1.ClaimPoolResponse
		err error
	}
	got := make(chan claim, 2)
	for range 2 {
		go func() {
			r, err := s.plc.ClaimPool(ctx, &controldv1.ClaimPoolRequest{PoolId: poolID})
			got <- claim{r, err}
		}()
	}
	var hit, miss *controldv1.ClaimPoolResponse
	for range 2 {
		c := <-got
		if c.err != nil {
			t.Fatalf("claim: %v", c.err)
		}
		id := c.r.Sandbox.Id
		t.Cleanup(func() {
			if _, err := s.sbc.DeleteSandbox(context.Background(), &controldv1.DeleteSandboxRequest{Id: id}); err != nil && status.Code(err) != codes.NotFound {
				t.Errorf("delete %s: %v", id, err)
			}
		})
		if c.r.Hit {
			hit = c.r
		} else {
			miss = c.r
		}
	}
	if hit == nil || miss == nil {
		t.Fatalf("claims of a full pool of one: hit %v, miss %v", hit != nil, miss != nil)
	}
	t.Logf("hit %v, miss %v", hit.Took.AsDuration(), miss.Took.AsDuration())
	m := miss.Sandbox
	if m.CheckpointId != ck.Id || m.PoolId != poolID || m.Labels[rules.PoolIDLabel] != poolID || m.Generation != 1 ||
		m.State != controldv1.SandboxState_SANDBOX_STATE_READY {
		t.Fatalf("miss is not a fork of the pool's checkpoint: %+v", m)
	}
	if miss.Endpoint.Token == hit.Endpoint.Token {
		t.Fatal("the miss's fork accepts the hit's token")
	}
	v, err := s.sbc.VerifySandbox(ctx, &controldv1.VerifySandboxRequest{Id: m.Id})
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Results) != len(ck.VerifyLevels)-1 { // all but filesystem, which is opt-in
		t.Errorf("miss verified %d levels; the checkpoint records %v", len(v.Results), ck.VerifyLevels)
	}
	for _, r := range v.Results {
		if !r.Ok {
			t.Errorf("miss: %s: %s", r.Level, r.Detail)
		}
	}
	for _, c := range []*controldv1.ClaimPoolResponse{hit, miss} {
		if _, err := firstShot(ctx, c.Endpoint); err != nil {
			t.Errorf("claimed %s (hit %v): %v", c.Sandbox.Id, c.Hit, err)
		}
	}

	// The name moves to another image: the next checkpoint is of it, and
	// the retired one stays for its fork.
	moved := testenv.Rebuild(t, ctx, s.rt.Client(), s.cfg.Containerd.Namespace, s.image, s.image, "moved-"+randomLower(8)).Digest
	var next *controldv1.Checkpoint
	deadline = time.Now().Add(3 * time.Minute)
	for next == nil {
		l, err := s.ckc.ListCheckpoints(ctx, &controldv1.ListCheckpointsRequest{Labels: map[string]string{rules.PoolIDLabel: poolID}})
		if err != nil {
			t.Fatal(err)
		}
		g, err := s.plc.GetPool(ctx, &controldv1.GetPoolRequest{Id: poolID})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range l.Checkpoints {
			if c.Id != ck.Id && g.Pool.Available == 1 {
				next = c
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoint of the moved image (%s): %v", moved, l.Checkpoints)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := s.ckc.GetCheckpoint(ctx, &controldv1.GetCheckpointRequest{Id: ck.Id}); err != nil {
		t.Fatalf("retired checkpoint with a live fork: %v", err)
	}
	var miss2 *controldv1.ClaimPoolResponse
	for range 4 {
		r, err := s.plc.ClaimPool(ctx, &controldv1.ClaimPoolRequest{PoolId: poolID})
		if err != nil {
			t.Fatalf("claim after the image moved: %v", err)
		}
		id := r.Sandbox.Id
		t.Cleanup(func() {
			if _, err := s.sbc.DeleteSandbox(context.Background(), &controldv1.DeleteSandboxRequest{Id: id}); err != nil && status.Code(err) != codes.NotFound {
				t.Errorf("delete %s: %v", id, err)
			}
		})
		if !r.Hit {
			miss2 = r
			break
		}
		// The member of the old build was replaced before the checkpoint
		// was made again.
		if got := s.runningDigest(id); got != moved.String() {
			t.Errorf("hit %s after the image moved runs %s, want %s", id, got, moved)
		}
	}
	if miss2 == nil || miss2.Sandbox.CheckpointId != next.Id {
		t.Fatalf("miss after the image moved: %+v, want a fork of %s", miss2.GetSandbox(), next.Id)
	}
	if _, err := firstShot(ctx, miss2.Endpoint); err != nil {
		t.Errorf("fork of the moved image's checkpoint: %v", err)
	}
	if _, err := s.sbc.DeleteSandbox(ctx, &controldv1.DeleteSandboxRequest{Id: m.Id}); err != nil {
		t.Fatal(err)
	}
	waitCheckpointGone(t, s, ck.Id, "retired pool checkpoint after its last fork")

	// The pool goes; its checkpoint stays for the claimed fork, then goes
	// with it.
	if _, err := s.plc.DeletePool(ctx, &controldv1.DeletePoolRequest{Id: poolID}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ckc.GetCheckpoint(ctx, &controldv1.GetCheckpointRequest{Id: next.Id}); err != nil {
		t.Fatalf("pool checkpoint with a live fork after DeletePool: %v", err)
	}
	if _, err := s.sbc.DeleteSandbox(ctx, &controldv1.DeleteSandboxRequest{Id: miss2.Sandbox.Id}); err != nil {
		t.Fatal(err)
	}
	waitCheckpointGone(t, s, next.Id, "pool checkpoint after the pool and its fork")
}

// waitCheckpointGone waits until checkpoint id is deleted.
func waitCheckpointGone(t *testing.T, s *bootStack, id, what string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := s.ckc.GetCheckpoint(s.ctx, &controldv1.GetCheckpointRequest{Id: id})
		if status.Code(err) == codes.NotFound {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still there: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
