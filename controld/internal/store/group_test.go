package store

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// Concurrent writers all land, each failing write reports its own error and
// does not take the others of its batch down.
func TestUpdateGroupCommit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	errBad := errors.New("bad write")
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.Update(func(tx *Tx) error {
				if err := tx.PutSandbox(&SandboxRecord{Sandbox: &controldv1.Sandbox{Id: fmt.Sprintf("sb-%03d", i)}}); err != nil {
					return err
				}
				if i%7 == 3 {
					return errBad
				}
				return nil
			})
		}()
	}
	wg.Wait()
	want := 0
	for i, err := range errs {
		switch {
		case i%7 == 3 && !errors.Is(err, errBad):
			t.Errorf("write %d: got %v, want its own error", i, err)
		case i%7 != 3 && err != nil:
			t.Errorf("write %d: %v", i, err)
		case i%7 != 3:
			want++
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Reopen: what Update acknowledged is on disk, failed writes are not.
	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sbs, err := s.Sandboxes()
	if err != nil {
		t.Fatal(err)
	}
	if len(sbs) != want {
		t.Fatalf("%d records after reopen, want %d", len(sbs), want)
	}
	for _, r := range sbs {
		var i int
		if _, err := fmt.Sscanf(r.Sandbox.GetId(), "sb-%d", &i); err != nil || i%7 == 3 {
			t.Fatalf("unexpected record %q", r.Sandbox.GetId())
		}
	}
}

func TestHasPool(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.PutPool(&PoolRecord{Pool: &controldv1.Pool{Id: "pl-a"}}); err != nil {
		t.Fatal(err)
	}
	var has, hasNot bool
	if err := s.Update(func(tx *Tx) error {
		has, hasNot = tx.HasPool("pl-a"), tx.HasPool("pl-b")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !has || hasNot {
		t.Fatalf("HasPool: pl-a %v (want true), pl-b %v (want false)", has, hasNot)
	}
}

// A write after Close fails instead of hanging.
func TestUpdateAfterClose(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := s.PutPool(&PoolRecord{Pool: &controldv1.Pool{Id: "pl-a"}}); err == nil {
		t.Fatal("write to a closed store succeeded")
	}
}
