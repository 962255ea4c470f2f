package fleet_test

import (
	"bytes"
	"context"
	"testing"

	"google.golang.org/grpc/codes"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/rules"
	"github.com/forkfleet/forkfleet/controld/internal/fleet/fleettest"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// poolCheckpoints lists the checkpoints labelled as pool id's.
func poolCheckpoints(t *testing.T, e *env, id string) []*controldv1.Checkpoint {
	t.Helper()
	l, _, err := e.m.ListCheckpoints(context.Background(), &controldv1.ListCheckpointsRequest{Labels: map[string]string{rules.PoolIDLabel: id}})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// claimMiss claims from pool id until a claim misses (a refill may have
// made the pool full again meanwhile) and returns the missed sandbox.
func claimMiss(t *testing.T, e *env, id string) *controldv1.Sandbox {
	t.Helper()
	for range 8 {
		s, _, hit, _, err := e.m.ClaimPool(context.Background(), &controldv1.ClaimPoolRequest{PoolId: id})
		if err != nil {
			t.Fatalf("claim: %v", err)
		}
		if !hit {
			return s
		}
	}
	t.Fatal("no claim missed")
	return nil
}

// An image pool checkpoints one of its members once it is full and forks
// its misses from that checkpoint (verified like any fork) instead of
// booting them; the checkpoint is shown as the pool's, only the pool
// deletes it, a new one replaces it when the image name moves, and a
// retired one goes with the last fork of it.
func TestImagePoolMissForksFromItsCheckpoint(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	p, err := e.m.CreatePool(ctx, &controldv1.CreatePoolRequest{Source: &controldv1.CreatePoolRequest_Image{Image: "img:latest"}, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	var ck *controldv1.Checkpoint
	eventually(t, "image pool full with its checkpoint", func() bool {
		got, _ := e.m.GetPool(ctx, p.Id)
		l := poolCheckpoints(t, e, p.Id)
		if len(l) == 1 {
			ck = l[0]
		}
		return got.Available == 1 && len(l) == 1
	})
	if ck.Tier != controldv1.CheckpointTier_CHECKPOINT_TIER_MEMORY || ck.Image != "img:latest" || len(ck.VerifyLevels) < 3 {
		t.Fatalf("pool checkpoint %+v", ck)
	}
	_, err = e.m.DeleteCheckpoint(ctx, ck.Id, false)
	wantCode(t, err, codes.FailedPrecondition, "")

	// The pool's own checkpoint survives a restart as the pool's.
	e.restart()
	eventually(t, "image pool full after a restart", func() bool {
		got, _ := e.m.GetPool(ctx, p.Id)
		return got.Available == 1
	})
	if l := poolCheckpoints(t, e, p.Id); len(l) != 1 || l[0].Id != ck.Id {
		t.Fatalf("pool checkpoints after a restart: %v, want only %s", l, ck.Id)
	}
	_, err = e.m.DeleteCheckpoint(ctx, ck.Id, false)
	wantCode(t, err, codes.FailedPrecondition, "")

	restores := e.rt.Calls("restore")
	miss := claimMiss(t, e, p.Id)
	if miss.CheckpointId != ck.Id || miss.PoolId != p.Id || miss.Labels[rules.PoolIDLabel] != p.Id ||
		miss.State != controldv1.SandboxState_SANDBOX_STATE_READY || miss.Generation != 1 {
		t.Fatalf("missed claim not a verified fork of the pool's checkpoint: %+v", miss)
	}
	if got := e.rt.Calls("restore"); got != restores+1 {
		t.Fatalf("%d restores for one missed claim", got-restores)
	}

	// The name moves to another image: the old checkpoint is retired and
	// the next is of the new image.
	e.rt.SetImageDigest("img:latest", "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
	hit, _, _, _, err := e.m.ClaimPool(ctx, &controldv1.ClaimPoolRequest{PoolId: p.Id})
	if err != nil {
		t.Fatal(err)
	}
	var next *controldv1.Checkpoint
	eventually(t, "a checkpoint of the new image", func() bool {
		for _, c := range poolCheckpoints(t, e, p.Id) {
			if c.Id != ck.Id {
				next = c
			}
		}
		got, _ := e.m.GetPool(ctx, p.Id)
		return next != nil && got.Available == 1
	})
	// The retired one stays while its fork lives, and goes with it.
	if _, err := e.m.GetCheckpoint(ctx, ck.Id); err != nil {
		t.Fatalf("retired checkpoint with a live fork: %v", err)
	}
	if err := e.m.DeleteSandbox(ctx, miss.Id); err != nil {
		t.Fatal(err)
	}
	eventually(t, "retired checkpoint deleted with its last fork", func() bool {
		_, err := e.m.GetCheckpoint(ctx, ck.Id)
		return err != nil
	})
	miss2 := claimMiss(t, e, p.Id)
	if miss2.CheckpointId != next.Id {
		t.Fatalf("miss after the image moved forked %q, want %q", miss2.CheckpointId, next.Id)
	}

	// DeletePool retires its checkpoint; a claimed fork keeps it until it
	// is deleted.
	if err := e.m.DeletePool(ctx, p.Id); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.GetCheckpoint(ctx, next.Id); err != nil {
		t.Fatalf("pool checkpoint with a live fork after DeletePool: %v", err)
	}
	for _, id := range []string{miss2.Id, hit.Id} {
		if err := e.m.DeleteSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "pool checkpoint deleted after the pool and its forks", func() bool {
		_, err := e.m.GetCheckpoint(ctx, next.Id)
		return err != nil
	})
}

// An image pool checkpoints a still screen. Its desktops are still
// painting when they report ready (a shell's prompt, focus decorations):
// the checkpoint's frame is hashed at once (under the X server grab), so a
// source checkpointed then leaves forks that finish the paint after their
// first frame. A miss's fork must pass a later VerifySandbox, which
// compares its settled screen (the flake of TestRealStackImagePoolMissForks).
func TestImagePoolCheckpointsStillScreen(t *testing.T) {
	e := newEnv(t, nil)
	final := []byte("prompt-drawn-0123")
	e.rt.OnBoot = func(_ runtime.BootSpec, g *fleettest.Guestd) { g.SetPainting(final) }
	ctx := context.Background()
	p, err := e.m.CreatePool(ctx, &controldv1.CreatePoolRequest{Source: &controldv1.CreatePoolRequest_Image{Image: "img:latest"}, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "image pool full with its checkpoint", func() bool {
		got, _ := e.m.GetPool(ctx, p.Id)
		return got.Available == 1 && len(poolCheckpoints(t, e, p.Id)) == 1
	})
	miss := claimMiss(t, e, p.Id)
	if got := e.rt.Guest(miss.Id).FrameNow(); !bytes.Equal(got, final) {
		t.Fatalf("the miss's fork shows frame %x, want the source's finished paint %x", got, final)
	}
	res, err := e.m.VerifySandbox(ctx, &controldv1.VerifySandboxRequest{Id: miss.Id})
	if err != nil || len(res) == 0 {
		t.Fatalf("verify the miss's fork: %v %v", res, err)
	}
	for _, r := range res {
		if !r.GetOk() {
			t.Errorf("miss's fork: %s: %s", r.GetLevel(), r.GetDetail())
		}
	}
}

// An image pool's waiting members are of the build its image's name names:
// once the name moves to another build, they are replaced (members from
// before a restart too), so a hit serves what a miss or a create would.
func TestImagePoolReplacesOldBuilds(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	p, err := e.m.CreatePool(ctx, &controldv1.CreatePoolRequest{Source: &controldv1.CreatePoolRequest_Image{Image: "img:latest"}, Size: 2})
	if err != nil {
		t.Fatal(err)
	}
	// The pool's members are all the fake runtime holds (the source of the
	// pool's checkpoint is deleted once it is taken).
	members := func() []string { return e.rt.IDs() }
	eventually(t, "image pool full with its checkpoint", func() bool {
		got, _ := e.m.GetPool(ctx, p.Id)
		return got.Available == 2 && len(poolCheckpoints(t, e, p.Id)) == 1 && len(members()) == 2
	})
	before := members()
	// What each member runs is the runtime's to say, also after a restart.
	e.restart()
	eventually(t, "image pool full after a restart", func() bool {
		got, _ := e.m.GetPool(ctx, p.Id)
		return got.Available == 2
	})
	const newBuild = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	e.rt.SetImageDigest("img:latest", newBuild)
	eventually(t, "members of the new build", func() bool {
		got, _ := e.m.GetPool(ctx, p.Id)
		if got.Available != 2 {
			return false
		}
		ids := members()
		for _, id := range ids {
			if e.rt.RunningDigest(id) != newBuild {
				return false
			}
		}
		return len(ids) == 2
	})
	if len(before) != 2 {
		t.Fatalf("members before the move %v", before)
	}
	for _, id := range before {
		if e.rt.Has(id) {
			t.Errorf("member %s of the old build is still there", id)
		}
	}
	hit, _, ok, _, err := e.m.ClaimPool(ctx, &controldv1.ClaimPoolRequest{PoolId: p.Id})
	if err != nil || !ok || e.rt.RunningDigest(hit.Id) != newBuild {
		t.Fatalf("claim after the move: hit %v, %v, running %q", ok, err, e.rt.RunningDigest(hit.GetId()))
	}
}
