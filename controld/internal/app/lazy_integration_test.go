package app_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/config"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
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

// TestRealStackLazyHotSetSurvivesRestart: a checkpoint's working set (the
// pages its verified lazy replicas touched) is persisted in controld's state
// and survives a restart of controld and its runtime (its page server):
// the first lazy fork after the restart copies it in ahead of faults
// instead of learning it again. A truncated file is ignored and the set
// relearned, the fork unharmed; deleting the checkpoint removes the file.
func TestRealStackLazyHotSetSurvivesRestart(t *testing.T) {
	s := newStackIn(t, "forkfleet-lazyhot-it", func(c *config.Config) { c.Fork.LazyMinBytes = 1 << 40 })
	ctx := s.ctx
	runtimeDir := filepath.Join(s.cfg.StateDir, "runtime")
	s.launch(0)
	src, err := s.sbc.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true})
	if err != nil {
		t.Fatal(err)
	}
	// What the test made goes before the controld of the last launch stops
	// (cleanups run last registered first): registered after every launch,
	// the first run deletes, the others find nothing.
	var id string
	var replicas []string
	removeAll := func() {
		bg := context.Background()
		for _, r := range replicas {
			s.sbc.DeleteSandbox(bg, &controldv1.DeleteSandboxRequest{Id: r})
		}
		replicas = nil
		if id != "" {
			s.ckc.DeleteCheckpoint(bg, &controldv1.DeleteCheckpointRequest{Id: id})
		}
		s.sbc.DeleteSandbox(bg, &controldv1.DeleteSandboxRequest{Id: src.Sandbox.Id})
	}
	t.Cleanup(removeAll)
	if err := waitStill(ctx, src.Endpoint); err != nil {
		t.Fatal(err)
	}
	ck, err := s.ckc.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Sandbox.Id})
	if err != nil {
		t.Fatal(err)
	}
	id = ck.Checkpoint.Id
	fork := func() *controldv1.LazyRestoreStats {
		t.Helper()
		r, err := s.ckc.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: id, Count: 1,
			RestoreMode: controldv1.RestoreMode_RESTORE_MODE_LAZY})
		if err != nil {
			t.Fatalf("lazy fork: %v", err)
		}
		rep := r.Replicas[0]
		if rep.ErrorCode != 0 {
			t.Fatalf("replica failed: %s", rep.ErrorMessage)
		}
		replicas = append(replicas, rep.Sandbox.Id)
		for _, v := range rep.Verification {
			if !v.Ok {
				t.Fatalf("%s: %s: %s", rep.Sandbox.Id, v.Level, v.Detail)
			}
		}
		if len(rep.Verification) < 3 || rep.GetRestoreMode() != controldv1.RestoreMode_RESTORE_MODE_LAZY {
			t.Fatalf("%s: %v, verified at %d levels; want LAZY and marker, memory and pixels", rep.Sandbox.Id, rep.GetRestoreMode(), len(rep.Verification))
		}
		t.Logf("lazy replica %s: %v", rep.Sandbox.Id, rep.GetLazyRestore())
		return rep.GetLazyRestore()
	}
	// hotFile waits for the checkpoint's persisted set (written a second
	// after its replica was verified) and returns its path and size.
	hotFile := func(notSize int64) (string, int64) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			m, _ := filepath.Glob(filepath.Join(runtimeDir, "hotsets", id+"-*.hot"))
			if len(m) == 1 {
				if st, err := os.Stat(m[0]); err == nil && st.Size() != notSize {
					return m[0], st.Size()
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("no hot set file for %s in %s: %v", id, runtimeDir, m)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// restart stops controld and its runtime (the page server, whose
	// in-memory sets go with it), runs between while both are down, and
	// starts both again on the same state.
	restart := func(between func()) {
		t.Helper()
		s.stop()
		s.rt.Close()
		between()
		s.rt = realStackRuntime(t, ctx, s.cfg, runtimeDir)
		s.launch(0)
		t.Cleanup(removeAll)
	}

	// The page server's counters (controld.md, "Metrics"): this runtime's
	// reads by result, and its writes.
	reads := func(result string) float64 {
		return s.metric(`forkfleet_controld_lazy_hot_set_reads_total{result="` + result + `"}`)
	}
	written := func() bool { return s.metric(`forkfleet_controld_lazy_hot_set_writes_total{result="written"}`) >= 1 }

	first := fork()
	if first.GetHotPages() != 0 || first.GetFaults() == 0 {
		t.Fatalf("the first lazy replica: %v; want faults and no hot set to copy", first)
	}
	path, size := hotFile(-1)
	eventually(t, "the hot set's write counted", written)
	if reads("absent") != 1 || reads("loaded") != 0 {
		t.Errorf("hot set reads absent %v, loaded %v; want 1 and 0 (no file before the first fork)", reads("absent"), reads("loaded"))
	}
	restart(func() {})
	after := fork()
	if after.GetHotPages() < first.GetFaultPages()/2 || after.GetFaults() >= first.GetFaults() {
		t.Errorf("the first lazy replica after a restart: %v; want the %d pages its checkpoint's first replica faulted for ahead of faults",
			after, first.GetFaultPages())
	}
	if reads("loaded") != 1 || reads("absent") != 0 {
		t.Errorf("after the restart, hot set reads loaded %v, absent %v; want 1 and 0", reads("loaded"), reads("absent"))
	}

	// A truncated file: ignored, the fork as the first one, the set relearned.
	// Truncated while controld is down: until its runtime closed, the set
	// could still be written (a second after the replica above grew it, or
	// by Close when it grew since): a truncation before that was undone,
	// and the next start loaded the whole set.
	restart(func() {
		if err := os.Truncate(path, size/2); err != nil {
			t.Fatal(err)
		}
	})
	relearn := fork()
	if relearn.GetHotPages() != 0 || relearn.GetFaults() == 0 {
		t.Errorf("after a truncated hot set file: %v; want it ignored (no hot pages)", relearn)
	}
	if _, got := hotFile(size / 2); got != size {
		t.Errorf("relearned hot set file of %d bytes, want %d", got, size)
	}
	if reads("truncated") != 1 || reads("loaded") != 0 {
		t.Errorf("after the truncation, hot set reads truncated %v, loaded %v; want 1 and 0", reads("truncated"), reads("loaded"))
	}
	eventually(t, "the relearned hot set's write counted", written)

	for _, r := range replicas {
		if _, err := s.sbc.DeleteSandbox(ctx, &controldv1.DeleteSandboxRequest{Id: r}); err != nil {
			t.Fatalf("delete %s: %v", r, err)
		}
	}
	replicas = nil
	if _, err := s.ckc.DeleteCheckpoint(ctx, &controldv1.DeleteCheckpointRequest{Id: id}); err != nil {
		t.Fatalf("delete checkpoint: %v", err)
	}
	id = ""
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("hot set file after its checkpoint was deleted: %v", err)
	}
}

// TestRealStackLazyForkSlotAfterRestart: fork slots do not survive a
// controld restart; the restarted controld makes them again at once for its
// newest checkpoints, for lazy restores when the checkpoint's working set
// was persisted (it was forked lazily), so the first lazy fork after the
// restart starts a slot (its container, snapshot and shim made ahead) and
// copies the persisted set ahead of faults.
func TestRealStackLazyForkSlotAfterRestart(t *testing.T) {
	s := newStackIn(t, "forkfleet-lazyslot-it", func(c *config.Config) { c.Fork.LazyMinBytes = 1 << 40 })
	ctx := s.ctx
	runtimeDir := filepath.Join(s.cfg.StateDir, "runtime")
	s.launch(1)
	src, err := s.sbc.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true})
	if err != nil {
		t.Fatal(err)
	}
	var id string
	var replicas []string
	removeAll := func() {
		bg := context.Background()
		for _, r := range replicas {
			s.sbc.DeleteSandbox(bg, &controldv1.DeleteSandboxRequest{Id: r})
		}
		replicas = nil
		if id != "" {
			s.ckc.DeleteCheckpoint(bg, &controldv1.DeleteCheckpointRequest{Id: id})
		}
		s.sbc.DeleteSandbox(bg, &controldv1.DeleteSandboxRequest{Id: src.Sandbox.Id})
	}
	t.Cleanup(removeAll)
	if err := waitStill(ctx, src.Endpoint); err != nil {
		t.Fatal(err)
	}
	ck, err := s.ckc.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Sandbox.Id})
	if err != nil {
		t.Fatal(err)
	}
	id = ck.Checkpoint.Id
	fork := func() *controldv1.ForkReplica {
		t.Helper()
		r, err := s.ckc.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: id, Count: 1,
			RestoreMode: controldv1.RestoreMode_RESTORE_MODE_LAZY})
		if err != nil {
			t.Fatalf("lazy fork: %v", err)
		}
		rep := r.Replicas[0]
		if rep.ErrorCode != 0 {
			t.Fatalf("replica failed: %s", rep.ErrorMessage)
		}
		replicas = append(replicas, rep.Sandbox.Id)
		for _, v := range rep.Verification {
			if !v.Ok {
				t.Fatalf("%s: %s: %s", rep.Sandbox.Id, v.Level, v.Detail)
			}
		}
		if len(rep.Verification) < 3 || rep.GetRestoreMode() != controldv1.RestoreMode_RESTORE_MODE_LAZY {
			t.Fatalf("%s: %v, verified at %d levels; want LAZY and marker, memory and pixels", rep.Sandbox.Id, rep.GetRestoreMode(), len(rep.Verification))
		}
		return rep
	}
	fork()
	eventually(t, "the persisted hot set", func() bool {
		m, _ := filepath.Glob(filepath.Join(runtimeDir, "hotsets", id+"-*.hot"))
		return len(m) == 1
	})

	s.stop()
	s.rt.Close()
	s.rt = realStackRuntime(t, ctx, s.cfg, runtimeDir)
	s.launch(1)
	t.Cleanup(removeAll)
	// A boot slot of the default image and the checkpoint's fork slot.
	var created []string
	deadline := time.Now().Add(60 * time.Second)
	for {
		created = s.runtimeIDs(runtime.StatusCreated)
		if len(created) >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("precreated containers after the restart %v, want a boot slot and a fork slot", created)
		}
		time.Sleep(50 * time.Millisecond)
	}
	rep := fork()
	if !slices.Contains(created, rep.Sandbox.Id) {
		t.Errorf("the first lazy fork after the restart made %s, not one of the slots %v", rep.Sandbox.Id, created)
	}
	if st := rep.GetLazyRestore(); st.GetHotPages() == 0 {
		t.Errorf("the first lazy fork after the restart: %v; want the persisted set copied ahead of faults", st)
	}
	for _, p := range rep.GetSandbox().GetBoot() {
		t.Logf("phase %s at %v", p.GetName(), p.GetAt().AsDuration())
	}
}
