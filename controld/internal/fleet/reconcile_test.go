package fleet_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
	"github.com/forkfleet/forkfleet/controld/internal/fleet/fleettest"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// recoveringRuntime is the fake runtime with runtime.CheckpointRecoverer.
type recoveringRuntime struct {
	*fleettest.Runtime
	mu    sync.Mutex
	calls [][]runtime.CheckpointRef
	// frozenAtRecover records, per call, which sandboxes were still frozen
	// when the runtime was asked to recover (reconcile must not thaw first).
	frozenAtRecover []runtime.InstanceStatus
	watch           string
}

func (r *recoveringRuntime) RecoverCheckpoints(_ context.Context, keep []runtime.CheckpointRef) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, slices.Clone(keep))
	if r.watch != "" {
		r.frozenAtRecover = append(r.frozenAtRecover, r.Status(r.watch))
	}
	return nil
}

// TestReconcileThawsInterruptedCheckpointSource: a controld killed while a
// checkpoint held its source frozen leaves a READY record and a frozen
// sandbox. The restart thaws it (after the runtime recovered the
// interrupted dump) and keeps a SUSPENDED sandbox frozen.
func TestReconcileThawsInterruptedCheckpointSource(t *testing.T) {
	rr := &recoveringRuntime{}
	e := newEnv(t, func(o *fleet.Options) { rr.Runtime = o.Runtime.(*fleettest.Runtime); o.Runtime = rr })
	ctx := context.Background()
	src := e.ready(nil)
	susp := e.ready(nil)
	ck, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.SuspendSandbox(ctx, susp.Id); err != nil {
		t.Fatal(err)
	}
	e.stop()
	// What a SIGKILL during the dump leaves: the source frozen under a
	// READY record.
	if err := e.rt.Freeze(ctx, src.Id); err != nil {
		t.Fatal(err)
	}
	rr.mu.Lock()
	rr.calls, rr.frozenAtRecover, rr.watch = nil, nil, src.Id
	rr.mu.Unlock()
	e.start()

	rr.mu.Lock()
	calls, frozen := rr.calls, rr.frozenAtRecover
	rr.mu.Unlock()
	if len(calls) != 1 {
		t.Fatalf("RecoverCheckpoints called %d times at start, want 1", len(calls))
	}
	if len(calls[0]) != 1 || calls[0][0].Dir == "" || calls[0][0].Snapshot == "" {
		t.Fatalf("RecoverCheckpoints keep = %+v, want the one recorded checkpoint's ref", calls[0])
	}
	if frozen[0] != runtime.StatusFrozen {
		t.Errorf("source status when the runtime recovered: %v, want still frozen (thaw comes after)", frozen[0])
	}
	if got := e.rt.Status(src.Id); got != runtime.StatusRunning {
		t.Errorf("source after restart: runtime status %v, want running", got)
	}
	got, err := e.m.GetSandbox(ctx, src.Id)
	if err != nil || got.State != controldv1.SandboxState_SANDBOX_STATE_READY {
		t.Fatalf("source after restart: %v %v, want READY", got, err)
	}
	if got := e.rt.Status(susp.Id); got != runtime.StatusFrozen {
		t.Errorf("suspended sandbox after restart: runtime status %v, want frozen", got)
	}
	got, err = e.m.GetSandbox(ctx, susp.Id)
	if err != nil || got.State != controldv1.SandboxState_SANDBOX_STATE_SUSPENDED {
		t.Fatalf("suspended sandbox after restart: %v %v, want SUSPENDED", got, err)
	}
	if _, err := e.m.GetCheckpoint(ctx, ck.Id); err != nil {
		t.Fatalf("recorded checkpoint lost: %v", err)
	}
	// The source works as a source again.
	if _, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id}); err != nil {
		t.Fatalf("checkpoint after recovery: %v", err)
	}
}
