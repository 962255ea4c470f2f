package store

import (
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/guestsock"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

func TestRoundTripAndReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	sb := &SandboxRecord{
		Sandbox:  &controldv1.Sandbox{Id: "sb-a", State: controldv1.SandboxState_SANDBOX_STATE_READY, Labels: map[string]string{"k": "v"}, CreatedAt: timestamppb.Now()},
		ACIToken: "t", AdminToken: "a", ACISocket: guestsock.Addr{PID: 7, Start: 9, Path: "/x"}, Pooled: true, Env: map[string]string{"E": "1"},
	}
	ck := &CheckpointRecord{
		Checkpoint: &controldv1.Checkpoint{Id: "ck-a", Name: "n", ChildIds: []string{"ck-b"}},
		Ref:        runtime.CheckpointRef{Dir: "/d", Snapshot: "s", Image: "i", Tier: runtime.TierMemory},
		AdminToken: "a", Generation: 2, FrameHash: []byte{1, 2}, MarkerPath: "/m", MarkerValue: []byte("v"), MemoryValue: []byte("m"),
	}
	pl := &PoolRecord{Pool: &controldv1.Pool{Id: "pl-a", Size: 3, Hits: 4}}
	if err := s.Update(func(tx *Tx) error {
		if err := tx.PutSandbox(sb); err != nil {
			return err
		}
		if err := tx.PutCheckpoint(ck); err != nil {
			return err
		}
		return tx.PutPool(pl)
	}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sbs, err := s.Sandboxes()
	if err != nil || len(sbs) != 1 {
		t.Fatalf("sandboxes: %v %d", err, len(sbs))
	}
	if !proto.Equal(sbs[0].Sandbox, sb.Sandbox) || sbs[0].ACIToken != "t" || !sbs[0].Pooled || sbs[0].Env["E"] != "1" {
		t.Fatalf("sandbox round trip: %+v", sbs[0])
	}
	cks, _ := s.Checkpoints()
	if len(cks) != 1 || !proto.Equal(cks[0].Checkpoint, ck.Checkpoint) || cks[0].Ref != ck.Ref || string(cks[0].MemoryValue) != "m" || cks[0].Generation != 2 {
		t.Fatalf("checkpoint round trip: %+v", cks[0])
	}
	pls, _ := s.Pools()
	if len(pls) != 1 || pls[0].Pool.GetHits() != 4 {
		t.Fatalf("pool round trip: %+v", pls)
	}
	if err := s.DeleteSandbox("sb-a"); err != nil {
		t.Fatal(err)
	}
	if sbs, _ := s.Sandboxes(); len(sbs) != 0 {
		t.Fatal("delete did not remove the record")
	}
}

func TestOpenLockedFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	lockTimeout = 100 * time.Millisecond
	// bbolt's flock is per open file description, so a second Open in the
	// same process blocks like another controld would.
	if _, err := Open(path); err == nil {
		t.Fatal("second open of a locked store succeeded")
	}
}
