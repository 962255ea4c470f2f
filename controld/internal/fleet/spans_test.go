package fleet_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// spanTree indexes recorded spans by id, to ask for a span's ancestors.
type spanTree struct {
	byID map[string]sdktrace.ReadOnlySpan
}

func newSpanTree(spans []sdktrace.ReadOnlySpan) spanTree {
	t := spanTree{byID: map[string]sdktrace.ReadOnlySpan{}}
	for _, s := range spans {
		t.byID[s.SpanContext().SpanID().String()] = s
	}
	return t
}

// named returns the spans called name.
func (t spanTree) named(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range t.byID {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// under reports whether s has an ancestor called name.
func (t spanTree) under(s sdktrace.ReadOnlySpan, name string) bool {
	for p, ok := t.byID[s.Parent().SpanID().String()]; ok; p, ok = t.byID[p.Parent().SpanID().String()] {
		if p.Name() == name {
			return true
		}
	}
	return false
}

// TestCheckpointAndForkSpans pins the traces of a checkpoint and of a fork
// (their names and nesting, which trace readers and benchd's exports rely
// on), the error a failed checkpoint records on its span, and what a
// checkpoint with stop does to its source.
func TestCheckpointAndForkSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	e := newEnv(t, func(o *fleet.Options) { o.Tracer = tp.Tracer("test") })
	ctx := context.Background()
	src := e.ready(nil)

	ck, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id})
	if err != nil {
		t.Fatal(err)
	}
	reps, err := replicasOf(e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Id, Count: 2}))
	if err != nil || len(reps) != 2 || reps[0].ErrorCode != 0 || reps[1].ErrorCode != 0 {
		t.Fatalf("fork: %v %v", reps, err)
	}
	tree := newSpanTree(rec.Ended())
	for _, want := range []struct {
		name, parent string
		n            int
	}{
		{"checkpoint.create", "", 1},
		{"checkpoint.runtime", "checkpoint.create", 1},
		{"checkpoint.before_freeze", "checkpoint.create", 1},
		{"checkpoint.fork", "", 1},
		{"fork.replica", "checkpoint.fork", 2},
		{"fork.restored", "fork.replica", 2},
		{"boot.guestd_listening", "fork.replica", 2},
		{"boot.usable", "fork.replica", 2},
	} {
		n := 0
		for _, s := range tree.named(want.name) {
			if want.parent != "" && !tree.under(s, want.parent) {
				continue // the source's boot has boot.* spans too
			}
			n++
			if s.Status().Code == codes.Error {
				t.Errorf("span %s failed: %s", want.name, s.Status().Description)
			}
		}
		if n != want.n {
			t.Errorf("%d %s spans under %q, want %d", n, want.name, want.parent, want.n)
		}
	}
	for _, l := range ck.VerifyLevels {
		if got := tree.named("verify." + l.String()); len(got) != 2 || !tree.under(got[0], "fork.replica") {
			t.Errorf("verify.%s spans: %d, want 2 under fork.replica", l, len(got))
		}
	}

	// A failed checkpoint marks its span, and the source runs on.
	e.rt.CheckpointErr = func(string) error { return errdefs.WithReason(errdefs.ErrInternal, "", "criu dump failed") }
	if _, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id}); err == nil {
		t.Fatal("checkpoint with a failing runtime succeeded")
	}
	e.rt.CheckpointErr = nil
	var failed int
	for _, s := range newSpanTree(rec.Ended()).named("checkpoint.create") {
		if s.Status().Code == codes.Error && strings.Contains(s.Status().Description, "criu dump failed") {
			failed++
		}
	}
	if failed != 1 {
		t.Errorf("%d failed checkpoint.create spans, want 1", failed)
	}
	if got, _ := e.m.GetSandbox(ctx, src.Id); got.GetState() != controldv1.SandboxState_SANDBOX_STATE_READY {
		t.Errorf("source after a failed checkpoint: %v", got.GetState())
	}

	// A failed replica marks its fork.replica span.
	e.rt.RestoreErr = func(runtime.BootSpec, runtime.CheckpointRef) error { return errors.New("restore refused") }
	reps, err = replicasOf(e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Id, Count: 1}))
	e.rt.RestoreErr = nil
	if err != nil || len(reps) != 1 || reps[0].ErrorCode == 0 {
		t.Fatalf("fork with a failing restore: %v %v", reps, err)
	}
	failed = 0
	for _, s := range newSpanTree(rec.Ended()).named("fork.replica") {
		if s.Status().Code == codes.Error && strings.Contains(s.Status().Description, "restore refused") {
			failed++
		}
	}
	if failed != 1 {
		t.Errorf("%d failed fork.replica spans, want 1", failed)
	}

	// With stop, the source is stopped by the checkpoint.
	stopped, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id, Stop: true})
	if err != nil {
		t.Fatal(err)
	}
	got, err := e.m.GetSandbox(ctx, src.Id)
	if err != nil || got.GetState() != controldv1.SandboxState_SANDBOX_STATE_STOPPED || got.GetStatusMessage() != "stopped by checkpoint "+stopped.Id {
		t.Errorf("source after a checkpoint with stop: %v %q (%v)", got.GetState(), got.GetStatusMessage(), err)
	}
}
