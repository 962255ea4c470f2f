package store

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	bolt "go.etcd.io/bbolt"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// pooledStore makes a store holding pool pl-a and n pooled sandboxes
// sb-000... and closes it.
func pooledStore(t *testing.T, n int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	err = s.Update(func(tx *Tx) error {
		for i := range n {
			if err := tx.PutSandbox(pooledRecord(i)); err != nil {
				return err
			}
		}
		return tx.PutPool(&PoolRecord{Pool: &controldv1.Pool{Id: "pl-a", Size: uint32(n)}})
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func pooledRecord(i int) *SandboxRecord {
	return &SandboxRecord{
		Sandbox: &controldv1.Sandbox{Id: fmt.Sprintf("sb-%03d", i), PoolId: "pl-a", State: controldv1.SandboxState_SANDBOX_STATE_SUSPENDED},
		Pooled:  true, AdminToken: "a",
	}
}

// claimedRecord is what a claim of sandbox i writes.
func claimedRecord(i int) *SandboxRecord {
	r := pooledRecord(i)
	r.Pooled = false
	r.Sandbox.State = controldv1.SandboxState_SANDBOX_STATE_READY
	r.Sandbox.Labels = map[string]string{"claimed-by": "test"}
	r.Request = &RequestTag{Key: fmt.Sprintf("ClaimPool/req-%d", i), Hit: true}
	return r
}

func poolRecord() *PoolRecord { return &PoolRecord{Pool: &controldv1.Pool{Id: "pl-a"}} }

func sandboxByID(t *testing.T, s *Store, id string) *SandboxRecord {
	t.Helper()
	all, err := s.Sandboxes()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range all {
		if r.Sandbox.GetId() == id {
			return r
		}
	}
	return nil
}

func wantClaimed(t *testing.T, s *Store, i int) {
	t.Helper()
	r := sandboxByID(t, s, fmt.Sprintf("sb-%03d", i))
	if r == nil || r.Pooled || r.Sandbox.State != controldv1.SandboxState_SANDBOX_STATE_READY || r.Sandbox.Labels["claimed-by"] != "test" ||
		tagKey(r.Request) != fmt.Sprintf("ClaimPool/req-%d", i) {
		t.Fatalf("sandbox %d after restart: %+v, want it claimed", i, r)
	}
}

func tagKey(r *RequestTag) string {
	if r == nil {
		return ""
	}
	return r.Key
}

// The crash promise of a claim: controld killed right after Claim returned,
// before the records' own write, finds the sandbox claimed (with its
// request tag and the pool's hit) when it opens the store again. The child
// process holds the records' write back, claims, reports, and is killed.
func TestClaimSurvivesKill(t *testing.T) {
	if path := os.Getenv("FORKFLEET_STORE_CLAIM_CHILD"); path != "" {
		claimThenHang(path)
		return
	}
	path := pooledStore(t, 1)
	cmd := exec.Command(os.Args[0], "-test.run=^TestClaimSurvivesKill$")
	cmd.Env = append(os.Environ(), "FORKFLEET_STORE_CLAIM_CHILD="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	if err != nil || line != "claimed\n" {
		t.Fatalf("child: %q %v", line, err)
	}

	// The kill came before the records' write: bbolt still has the
	// sandbox pooled, only the journal knows the claim.
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var before SandboxRecord
	err = db.View(func(tx *bolt.Tx) error {
		return json.Unmarshal(tx.Bucket(bucketSandboxes).Get([]byte("sb-000")), &before)
	})
	db.Close()
	if err != nil || !before.Pooled {
		t.Fatalf("records before replay: pooled=%v %v (the kill should precede the records' write)", before.Pooled, err)
	}

	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	wantClaimed(t, s, 0)
	pools, err := s.Pools()
	if err != nil || len(pools) != 1 || pools[0].Pool.Hits != 1 {
		t.Fatalf("pool after restart: %v %v, want 1 hit", pools, err)
	}
}

// claimThenHang is TestClaimSurvivesKill's child: it holds the store's
// write queue with a write that never ends (a test-only breach of Update's
// rule), claims sb-000 and reports it.
func claimThenHang(path string) {
	s, err := Open(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	running := make(chan struct{})
	go s.Update(func(*Tx) error {
		close(running)
		select {}
	})
	<-running
	if _, err := s.Claim(claimedRecord(0), poolRecord(), func() (uint64, uint64) { return 1, 0 }); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Println("claimed")
	select {}
}

// Replay never undoes what was written after a claim: a sandbox deleted or
// changed since keeps that state, and an entry's pool counters apply only
// with its claim.
func TestClaimReplayKeepsNewerWrites(t *testing.T) {
	path := pooledStore(t, 3)
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		applied, err := s.Claim(claimedRecord(i), poolRecord(), func() (uint64, uint64) { return uint64(i + 1), 0 })
		if err != nil {
			t.Fatal(err)
		}
		if err := <-applied; err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteSandbox("sb-000"); err != nil {
		t.Fatal(err)
	}
	later := claimedRecord(1)
	later.Sandbox.State = controldv1.SandboxState_SANDBOX_STATE_STOPPED
	if err := s.PutSandbox(later); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for range 2 { // twice: replay is idempotent, and the journal is not emptied
		s, err = Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if r := sandboxByID(t, s, "sb-000"); r != nil {
			t.Fatalf("deleted sandbox came back: %+v", r)
		}
		if r := sandboxByID(t, s, "sb-001"); r.Sandbox.State != controldv1.SandboxState_SANDBOX_STATE_STOPPED {
			t.Fatalf("later write undone: %+v", r)
		}
		wantClaimed(t, s, 2)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// Concurrent claims through a journal small enough to wrap many times all
// land, and a torn frame ends the replay without an error.
func TestClaimJournalWraps(t *testing.T) {
	defer func(n int64) { claimJournalSize = n }(claimJournalSize)
	claimJournalSize = 8 << 10
	const n = 200
	path := pooledStore(t, n)
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.Claim(claimedRecord(i), poolRecord(), func() (uint64, uint64) { return uint64(i), 0 }); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Tear the journal's first frame: nothing was lost (the records hold
	// every claim), and Open does not fail.
	f, err := os.OpenFile(ClaimJournalPath(path), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("torn"), 20)
	f.Close()
	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range n {
		wantClaimed(t, s, i)
	}
}
