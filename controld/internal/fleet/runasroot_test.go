package fleet_test

import (
	"context"
	"testing"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// A sandbox runs its agent as the image's unprivileged user unless created
// with run_as_root; the runtime spec says so, the record shows it, and its
// checkpoints and their forks keep it.
func TestRunAsRoot(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	def := e.ready(nil)
	if spec, ok := e.rt.Spec(def.Id); !ok || spec.RunAsRoot || def.GetRunAsRoot() {
		t.Fatalf("default sandbox: spec %+v, record %v", spec, def.GetRunAsRoot())
	}
	src, _, err := e.m.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true, RunAsRoot: true})
	if err != nil {
		t.Fatal(err)
	}
	if spec, ok := e.rt.Spec(src.Id); !ok || !spec.RunAsRoot || !src.GetRunAsRoot() {
		t.Fatalf("root sandbox: spec %+v, record %v", spec, src.GetRunAsRoot())
	}
	ck, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id})
	if err != nil {
		t.Fatal(err)
	}
	if !ck.GetRunAsRoot() {
		t.Fatal("the checkpoint of a root sandbox does not say so")
	}
	reps, err := replicasOf(e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Id, Count: 1}))
	if err != nil || reps[0].GetErrorMessage() != "" {
		t.Fatalf("fork: %v %v", reps, err)
	}
	rep := reps[0].GetSandbox()
	if spec, ok := e.rt.Spec(rep.Id); !ok || !spec.RunAsRoot || !rep.GetRunAsRoot() {
		t.Fatalf("replica of a root sandbox: spec %+v, record %v", spec, rep.GetRunAsRoot())
	}
}
