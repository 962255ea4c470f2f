package app_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/config"
)

// TestRealStackLazyFork forks the desktop lazily (controld's page server,
// vm.unprivileged_userfaultfd left as it is): one replica and a fan-out of
// three, each verified at every level (marker, memory, pixels) and usable;
// its pages come in the background once it is verified, and every replica
// verifies again after; the checkpoint cannot be deleted while they live
// (the runtime's pin on its images is TestIntegrationLazyRestore*'s). AUTO
// below fork.lazy_min_bytes restores eagerly.
func TestRealStackLazyFork(t *testing.T) {
	s := newStackIn(t, "forkfleet-lazy-it", func(c *config.Config) { c.Fork.LazyMinBytes = 1 << 40 })
	ctx := s.ctx
	s.launch(1) // fork slots: made for lazy restores after the first lazy fork
	src, err := s.sbc.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true})
	if err != nil {
		t.Fatal(err)
	}
	s.deleteSandboxAtEnd(src.Sandbox.Id)
	// Every replica is verified again at the end: checkpoint a still screen.
	if err := waitStill(ctx, src.Endpoint); err != nil {
		t.Fatal(err)
	}
	ck, err := s.ckc.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Sandbox.Id})
	if err != nil {
		t.Fatal(err)
	}
	s.deleteCheckpointAtEnd(ck.Checkpoint.Id)
	fork := func(n uint32, mode controldv1.RestoreMode) []*controldv1.ForkReplica {
		t.Helper()
		r, err := s.ckc.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Checkpoint.Id, Count: n, RestoreMode: mode})
		if err != nil {
			t.Fatalf("fork %d %v: %v", n, mode, err)
		}
		for _, rep := range r.Replicas {
			if rep.ErrorCode != 0 {
				t.Fatalf("replica failed: %s", rep.ErrorMessage)
			}
			s.deleteSandboxAtEnd(rep.Sandbox.Id)
			if len(rep.Verification) < 3 {
				t.Errorf("%s: verified at %d levels, want marker, memory and pixels", rep.Sandbox.Id, len(rep.Verification))
			}
			for _, v := range rep.Verification {
				if !v.Ok {
					t.Fatalf("%s: %s: %s", rep.Sandbox.Id, v.Level, v.Detail)
				}
			}
			if _, err := firstShot(ctx, rep.Endpoint); err != nil {
				t.Errorf("%s: %v", rep.Sandbox.Id, err)
			}
		}
		return r.Replicas
	}
	lazy := controldv1.RestoreMode_RESTORE_MODE_LAZY
	one := fork(1, lazy)
	if m := one[0].GetRestoreMode(); m != lazy {
		t.Fatalf("replica restored %v, want LAZY", m)
	}
	if st := one[0].GetLazyRestore(); st.GetLazyPages() == 0 || st.GetFaults() == 0 {
		t.Errorf("lazy replica's page server stats %v: want lazy pages and the faults of its verification", st)
	}
	three := fork(3, lazy)
	if m := fork(1, controldv1.RestoreMode_RESTORE_MODE_AUTO)[0].GetRestoreMode(); m != controldv1.RestoreMode_RESTORE_MODE_EAGER {
		t.Errorf("AUTO below fork.lazy_min_bytes restored %v, want EAGER", m)
	}
	last := fork(2, lazy)
	if _, err := s.ckc.DeleteCheckpoint(ctx, &controldv1.DeleteCheckpointRequest{Id: ck.Checkpoint.Id}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("delete a checkpoint with live lazy replicas: %v, want FAILED_PRECONDITION", err)
	}
	for _, rep := range append(append(one, three...), last...) {
		vctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		v, err := s.sbc.VerifySandbox(vctx, &controldv1.VerifySandboxRequest{Id: rep.Sandbox.Id})
		cancel()
		if err != nil {
			t.Errorf("%s: verify after its pages came in: %v", rep.Sandbox.Id, err)
			continue
		}
		for _, r := range v.GetResults() {
			if !r.GetOk() {
				t.Errorf("%s: %s after its pages came in: %s", rep.Sandbox.Id, r.GetLevel(), r.GetDetail())
			}
		}
	}
}
