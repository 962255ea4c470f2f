package fleet_test

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
	"github.com/forkfleet/forkfleet/controld/internal/fleet/fleettest"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/store"
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

// TestReconcileAdoptsEachRecordByItsState pins what a restart makes of each
// stored sandbox, by its record's state and what the runtime still holds:
// interrupted deletes, unwarmed pool members and interrupted forks that
// never ran are dropped; an interrupted fork that runs, and a record whose
// container vanished, are FAILED (the container removed); a failed record
// keeps only its record; a task that exited is STOPPED; a live sandbox
// takes the runtime's word on frozen-ness; an interrupted cold boot is
// waited for again until READY.
func TestReconcileAdoptsEachRecordByItsState(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	const (
		creating  = controldv1.SandboxState_SANDBOX_STATE_CREATING
		booting   = controldv1.SandboxState_SANDBOX_STATE_BOOTING
		ready     = controldv1.SandboxState_SANDBOX_STATE_READY
		suspended = controldv1.SandboxState_SANDBOX_STATE_SUSPENDED
		stopping  = controldv1.SandboxState_SANDBOX_STATE_STOPPING
		stopped   = controldv1.SandboxState_SANDBOX_STATE_STOPPED
		failed    = controldv1.SandboxState_SANDBOX_STATE_FAILED
	)
	type tc struct {
		name string
		// the record as the killed controld left it, and the runtime
		state    controldv1.SandboxState
		fork     bool // a replica (its record names a checkpoint)
		pooled   bool
		runtime  string // "running", "gone", "exited", "frozen"
		wantGone bool   // the record dropped
		want     controldv1.SandboxState
		wantMsg  string
		wantRT   bool // the runtime still holds it
	}
	cases := []tc{
		{name: "delete interrupted", state: stopping, runtime: "running", wantGone: true},
		{name: "deleted", state: controldv1.SandboxState_SANDBOX_STATE_DELETED, runtime: "gone", wantGone: true},
		{name: "pool member not warm", state: booting, pooled: true, runtime: "running", wantGone: true},
		{name: "pool member vanished", state: ready, pooled: true, runtime: "gone", wantGone: true},
		{name: "fork that never ran", state: creating, fork: true, runtime: "gone", wantGone: true},
		{name: "fork interrupted", state: booting, fork: true, runtime: "running", want: failed, wantMsg: "fork interrupted by a controld restart"},
		{name: "failed", state: failed, runtime: "running", want: failed},
		{name: "stopped, kept", state: stopped, runtime: "exited", want: stopped, wantRT: true},
		{name: "vanished", state: ready, runtime: "gone", want: failed, wantMsg: "container vanished while controld was down"},
		{name: "lazy replica incomplete", state: ready, fork: true, runtime: "lazy", want: failed,
			wantMsg: "lazy restore incomplete when controld restarted: its pages were lost with the page server"},
		{name: "exited", state: ready, runtime: "exited", want: stopped, wantRT: true},
		{name: "suspended, running", state: suspended, runtime: "running", want: ready, wantRT: true},
		{name: "ready, frozen by a suspend", state: suspended, runtime: "frozen", want: suspended, wantRT: true},
		{name: "cold boot interrupted", state: booting, runtime: "running", want: ready, wantRT: true},
	}
	ids := make([]string, len(cases))
	for i := range cases {
		ids[i] = e.ready(nil).Id
	}
	e.stop()
	st, err := store.Open(filepath.Join(e.dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	recs, err := st.Sandboxes()
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]*store.SandboxRecord{}
	for _, r := range recs {
		byID[r.Sandbox.Id] = r
	}
	for i, c := range cases {
		r := byID[ids[i]]
		r.Sandbox.State, r.Pooled = c.state, c.pooled
		if c.pooled {
			r.Sandbox.PoolId = "pool-gone"
		}
		if c.fork {
			r.Sandbox.CheckpointId = "ck-interrupted"
		}
		if err := st.PutSandbox(r); err != nil {
			t.Fatal(err)
		}
		switch c.runtime {
		case "gone":
			e.rt.Vanish(ids[i])
		case "exited":
			e.rt.Exit(ids[i], 1)
		case "lazy":
			e.rt.SetLazyPending(ids[i])
		case "frozen":
			if err := e.rt.Freeze(ctx, ids[i]); err != nil {
				t.Fatal(err)
			}
		}
	}
	st.Close()
	e.start()

	for i, c := range cases {
		id := ids[i]
		got, err := e.m.GetSandbox(ctx, id)
		if c.wantGone {
			if err == nil {
				t.Errorf("%s: record kept (%v), want it dropped", c.name, got.State)
			}
			if e.rt.Has(id) {
				t.Errorf("%s: the runtime still holds it", c.name)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if c.want == ready && got.State != ready {
			eventually(t, c.name+" READY", func() bool {
				got, err = e.m.GetSandbox(ctx, id)
				return err == nil && got.State == ready
			})
		}
		if got.State != c.want || c.wantMsg != "" && got.StatusMessage != c.wantMsg {
			t.Errorf("%s: %v %q, want %v %q", c.name, got.State, got.StatusMessage, c.want, c.wantMsg)
		}
		if e.rt.Has(id) != c.wantRT {
			t.Errorf("%s: the runtime holds it: %v, want %v", c.name, e.rt.Has(id), c.wantRT)
		}
	}
}
