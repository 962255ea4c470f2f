package fleet_test

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
	"github.com/forkfleet/forkfleet/controld/internal/recording"
)

// idleSource feeds nothing (the gateway is not under test here).
type idleSource struct{}

func (idleSource) Record(string, recording.Sink) func() { return func() {} }

// TestRecordingHooks: a recording sandbox's endpoint sends agents through
// the gateway; replicas of a recording source, and of a fork that asks,
// record with their parents named; without a recorder the RPCs refuse.
func TestRecordingHooks(t *testing.T) {
	var rm *recording.Manager
	e := newEnv(t, func(o *fleet.Options) {
		if rm != nil {
			o.Recordings = rm
		}
	})
	ctx := context.Background()
	// A manager without a recorder.
	_, err := e.m.StartRecording(ctx, &controldv1.StartRecordingRequest{SandboxId: "sb-aaaaaaaaaaaaaaaa"})
	wantCode(t, err, codes.FailedPrecondition, "")

	var m *fleet.Manager
	rm, err = recording.New(recording.Options{Dir: t.TempDir(), Floor: 1, Routable: func(id string) error { _, err := m.Route(id); return err }})
	if err != nil {
		t.Fatal(err)
	}
	rm.SetSource(idleSource{})
	t.Cleanup(rm.Close)
	e.restart()
	m = e.m

	src := e.ready(nil)
	if ep, err := e.m.SandboxEndpoint(ctx, src.Id); err != nil || ep.GetUnixPath() == "" {
		t.Fatalf("endpoint before recording: %v %v", ep, err)
	}
	start, err := e.m.StartRecording(ctx, &controldv1.StartRecordingRequest{SandboxId: src.Id})
	if err != nil {
		t.Fatal(err)
	}
	if ep, err := e.m.SandboxEndpoint(ctx, src.Id); err != nil || ep.GetUnixPath() != "" || ep.GetUrl() == "" {
		t.Fatalf("endpoint while recording: %v %v", ep, err)
	}
	ck, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id})
	if err != nil {
		t.Fatal(err)
	}
	reps, err := replicasOf(e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Id, Count: 2}))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range reps {
		if r.GetRecordingId() == "" || r.GetEndpoint().GetUnixPath() != "" {
			t.Fatalf("replica of a recording source: %v", r)
		}
		g, err := e.m.GetRecording(ctx, &controldv1.GetRecordingRequest{Id: r.GetRecordingId()})
		if err != nil || g.GetRecording().GetParentRecordingId() != start.GetRecording().GetId() || g.GetRecording().GetParentCheckpointId() != ck.Id {
			t.Fatalf("replica recording %v %v", g, err)
		}
	}
	// The source stops recording: its replicas record only when asked.
	if _, err := e.m.StopRecording(ctx, &controldv1.StopRecordingRequest{Id: start.GetRecording().GetId()}); err != nil {
		t.Fatal(err)
	}
	if ep, _ := e.m.SandboxEndpoint(ctx, src.Id); ep.GetUnixPath() == "" {
		t.Fatalf("endpoint after the recording: %v", ep)
	}
	reps, _ = replicasOf(e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Id, Count: 1}))
	if len(reps) != 1 || reps[0].GetRecordingId() != "" {
		t.Fatalf("replica of a source not recording: %v", reps)
	}
	reps, _ = replicasOf(e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Id, Count: 1, Record: true}))
	if len(reps) != 1 || reps[0].GetRecordingId() == "" {
		t.Fatalf("replica of a fork with record: %v", reps)
	}
	g, err := e.m.GetRecording(ctx, &controldv1.GetRecordingRequest{Id: reps[0].GetRecordingId()})
	if err != nil || g.GetRecording().GetParentRecordingId() != "" || g.GetRecording().GetParentCheckpointId() != ck.Id {
		t.Fatalf("asked-for replica recording %v %v", g, err)
	}
	_, err = e.m.StartRecording(ctx, &controldv1.StartRecordingRequest{SandboxId: reps[0].GetSandbox().GetId()})
	if errdefs.Reason(err) != "SANDBOX_RECORDING" {
		t.Fatalf("a second recording of a replica: %v", err)
	}
}
