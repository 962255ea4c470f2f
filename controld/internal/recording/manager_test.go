package recording

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/rules"
)

// TestRestartKeepsRecordings: recordings on disk outlive controld; one
// that was running when it stopped is marked CONTROLD_STOPPED with the bytes
// on disk; directories that are not recording ids are passed over.
func TestRestartKeepsRecordings(t *testing.T) {
	dir := t.TempDir()
	id := rules.NewID(rules.PrefixRecording)
	rec := &controldv1.Recording{Id: id, SandboxId: "sb-aaaaaaaaaaaaaaaa", State: controldv1.RecordingState_RECORDING_STATE_RECORDING,
		StartedAt: timestamppb.Now(), MaxBytes: rules.DefaultRecordingBytes}
	b, _ := protojson.Marshal(rec)
	must(t, os.MkdirAll(filepath.Join(dir, id), 0o700))
	must(t, os.WriteFile(filepath.Join(dir, id, MetaFile), b, 0o600))
	must(t, os.WriteFile(filepath.Join(dir, id, StreamFile), append(streamMagic[:], 1, 2, 3), 0o600))
	must(t, os.MkdirAll(filepath.Join(dir, "not-a-recording"), 0o700))
	m, err := New(Options{Dir: dir, Floor: 1, Routable: func(string) error { return nil }})
	must(t, err)
	g, err := m.Get(context.Background(), &controldv1.GetRecordingRequest{Id: id})
	must(t, err)
	r := g.GetRecording()
	if r.GetState() != controldv1.RecordingState_RECORDING_STATE_STOPPED || r.GetStopReason() != controldv1.RecordingStopReason_RECORDING_STOP_REASON_CONTROLD_STOPPED ||
		r.GetBytes() == 0 || r.GetDir() != filepath.Join(dir, id) {
		t.Fatalf("after a restart: %v", r)
	}
	l, err := m.List(context.Background(), &controldv1.ListRecordingsRequest{})
	must(t, err)
	if len(l.GetRecordings()) != 1 {
		t.Fatalf("list %v", l)
	}
	// Without a source (the gateway is not serving yet) nothing starts.
	if _, err := m.Start(context.Background(), &controldv1.StartRecordingRequest{SandboxId: "sb-aaaaaaaaaaaaaaaa"}); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("start before the gateway: %v", err)
	}
	// A cap larger than the room above the floor is refused up front.
	m.opts.Floor = 1 << 62
	m.SetSource(nopSource{})
	if _, err := m.Start(context.Background(), &controldv1.StartRecordingRequest{SandboxId: "sb-aaaaaaaaaaaaaaaa"}); errdefs.Reason(err) != "RECORDING_CAP_REACHED" {
		t.Fatalf("start past the floor: %v", err)
	}
}

type nopSource struct{}

func (nopSource) Record(string, Sink) func() { return func() {} }

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
