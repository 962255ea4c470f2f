package store

import (
	"encoding/json"
	"reflect"
	"testing"

	"google.golang.org/protobuf/proto"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/guestsock"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// TestRecordsKeepEveryField fails when a field of a record is not written
// to the store (their JSON forms list each field by hand): a checkpoint's
// ImportedDigest was once lost on every restart.
func TestRecordsKeepEveryField(t *testing.T) {
	req := &RequestTag{Key: "k", Fingerprint: []byte("p"), Index: 1, Hit: true}
	roundTripEveryField(t, &SandboxRecord{
		Sandbox: &controldv1.Sandbox{Id: "sb-a"}, Env: map[string]string{"E": "1"}, ACIToken: "t", AdminToken: "a",
		ACISocket: guestsock.Addr{PID: 7, Start: 9, Path: "/x"}, Pooled: true, Ports: map[uint32]string{80: "t"}, Request: req,
	}, &SandboxRecord{})
	roundTripEveryField(t, &CheckpointRecord{
		Checkpoint: &controldv1.Checkpoint{Id: "ck-a", Name: "n"},
		Ref: runtime.CheckpointRef{Dir: "/d", Snapshot: "s", Image: "i", Tier: runtime.TierMemory,
			ImageDigest: "sha256:1"},
		Env: map[string]string{"E": "1"}, AdminToken: "a", Generation: 2, FrameHash: []byte{1},
		MarkerPath: "/m", MarkerValue: []byte("v"), MemoryValue: []byte("m"), NetPort: 9, NetValue: []byte("n"),
		FSDigest: []byte("f"), Request: req, ImportedDigest: "sha256:2", Pool: "pl-a", Retired: true,
	}, &CheckpointRecord{})
	roundTripEveryField(t, &PoolRecord{Pool: &controldv1.Pool{Id: "pl-a", Size: 3}, Env: map[string]string{"E": "1"}}, &PoolRecord{})
}

// roundTripEveryField checks that in sets every field and that each one
// comes back equal through its JSON form into out.
func roundTripEveryField(t *testing.T, in, out any) {
	t.Helper()
	v := reflect.ValueOf(in).Elem()
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Fatalf("set %s.%s in this test", v.Type().Name(), v.Type().Field(i).Name)
		}
	}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatal(err)
	}
	o := reflect.ValueOf(out).Elem()
	for i := range v.NumField() {
		name := v.Type().Name() + "." + v.Type().Field(i).Name
		want, got := v.Field(i).Interface(), o.Field(i).Interface()
		if pm, ok := want.(proto.Message); ok {
			if !proto.Equal(pm, got.(proto.Message)) {
				t.Errorf("%s: %v after the round trip, want %v", name, got, want)
			}
			continue
		}
		if !reflect.DeepEqual(want, got) {
			t.Errorf("%s: %v after the round trip, want %v", name, got, want)
		}
	}
}
