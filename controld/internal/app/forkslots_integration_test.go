package app_test

import (
	"slices"
	"testing"
	"time"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// TestRealStackForkSlotsFollowTheForkWidth: a checkpoint forked 3 ways
// keeps 3 fork slots (containers created, not started) with one configured,
// and its next 3-way fork starts exactly those, every replica verified and
// usable.
func TestRealStackForkSlotsFollowTheForkWidth(t *testing.T) {
	s := newBootStack(t)
	ctx := s.ctx
	s.launch(1)
	src, err := s.sbc.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true})
	if err != nil {
		t.Fatal(err)
	}
	s.deleteSandboxAtEnd(src.Sandbox.Id)
	ck, err := s.ckc.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Sandbox.Id})
	if err != nil {
		t.Fatal(err)
	}
	s.deleteCheckpointAtEnd(ck.Checkpoint.Id)
	fork := func() []*controldv1.ForkReplica {
		t.Helper()
		r, err := s.ckc.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Checkpoint.Id, Count: 3})
		if err != nil {
			t.Fatal(err)
		}
		for _, rep := range r.Replicas {
			if rep.ErrorCode != 0 {
				t.Fatalf("replica failed: %s", rep.ErrorMessage)
			}
			s.deleteSandboxAtEnd(rep.Sandbox.Id)
			for _, v := range rep.Verification {
				if !v.Ok {
					t.Fatalf("%s: %s: %s", rep.Sandbox.Id, v.Level, v.Detail)
				}
			}
		}
		return r.Replicas
	}
	first := fork()
	var isFirst []string
	for _, r := range first {
		isFirst = append(isFirst, r.Sandbox.Id)
	}
	// One boot slot of the default image, three fork slots.
	var created []string
	deadline := time.Now().Add(60 * time.Second)
	for {
		created = s.runtimeIDs(runtime.StatusCreated)
		if len(created) >= 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("precreated containers %v, want a boot slot and three fork slots", created)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, r := range fork() {
		if !slices.Contains(created, r.Sandbox.Id) || slices.Contains(isFirst, r.Sandbox.Id) {
			t.Errorf("replica %s is not one of the slots %v", r.Sandbox.Id, created)
		}
		if _, err := firstShot(ctx, r.Endpoint); err != nil {
			t.Errorf("%s: %v", r.Sandbox.Id, err)
		}
	}
}
