package store

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/rules"
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

// hookJournalSync makes the journal's syncs call at with their number
// (from 1) and the real sync; it returns a restore func.
func hookJournalSync(at func(call int, f *os.File, sync func(*os.File) error) error) func() {
	orig := syncJournal
	var calls atomic.Int32
	syncJournal = func(f *os.File) error { return at(int(calls.Add(1)), f, orig) }
	return func() { syncJournal = orig }
}

// copyFile copies src to dst (a crash's view of a file: what was written).
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// Group commit and a crash between a batch's write and its sync: claims
// that arrive together share one write and one sync, and none of them is
// answered before that sync. Whatever a crash there leaves of the written
// batch (all of it, none of it, a torn frame in it), the reopened store
// has the claim answered before claimed, and each of the others either
// claimed whole (nobody received it: its TTL or a delete removes it) or
// still pooled (never handed out, so it may be handed out now), never a
// mix; the batch's own sync failing fails every claim of it.
func TestClaimGroupCrashBetweenWriteAndSync(t *testing.T) {
	const n = 6
	path := pooledStore(t, n)
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	// Sync 1 (claim 0 alone) waits until claims 1..5 queue behind it, so
	// they form the next batch; sync 2 is the crash point.
	queued := func() int {
		s.claims.frames.mu.Lock()
		defer s.claims.frames.mu.Unlock()
		return len(s.claims.frames.queue)
	}
	inSync1, crashAt, crashed := make(chan struct{}), make(chan struct{}), make(chan struct{})
	errCrash := errors.New("crashed before the sync")
	defer hookJournalSync(func(call int, f *os.File, sync func(*os.File) error) error {
		switch call {
		case 1:
			close(inSync1)
			for queued() < n-1 {
				time.Sleep(100 * time.Microsecond)
			}
			return sync(f)
		case 2:
			close(crashAt)
			<-crashed
			return errCrash
		}
		return sync(f)
	})()
	claim := func(i int) (<-chan error, error) {
		return s.Claim(claimedRecord(i), poolRecord(), func() (uint64, uint64) { return uint64(i + 1), 0 })
	}
	type answer struct {
		i   int
		err error
	}
	answers := make(chan answer, n)
	first := make(chan (<-chan error), 1)
	go func() {
		applied, err := claim(0)
		answers <- answer{0, err}
		first <- applied
	}()
	<-inSync1
	for i := 1; i < n; i++ {
		go func() {
			_, err := claim(i)
			answers <- answer{i, err}
		}()
	}
	if a := <-answers; a.i != 0 || a.err != nil {
		t.Fatalf("first answer: claim %d: %v, want claim 0 synced alone", a.i, a.err)
	}
	if err := <-<-first; err != nil {
		t.Fatal(err)
	}
	<-crashAt
	select {
	case a := <-answers:
		t.Fatalf("claim %d answered (%v) before its batch was synced", a.i, a.err)
	default:
	}
	// The disk as a crash here leaves it: the records (claim 0's write
	// committed), and the journal with the batch written, not synced.
	dir := t.TempDir()
	crash := filepath.Join(dir, "state.db")
	copyFile(t, path, crash)
	copyFile(t, ClaimJournalPath(path), ClaimJournalPath(crash))
	journal, err := os.ReadFile(ClaimJournalPath(crash))
	if err != nil {
		t.Fatal(err)
	}
	close(crashed)
	for range n - 1 {
		if a := <-answers; !errors.Is(a.err, errCrash) {
			t.Fatalf("claim %d of the batch whose sync failed: %v, want the sync's error", a.i, a.err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// Frame offsets: claim 0's frame, then the batch's.
	var offs []int
	for off := 0; off+claimFrameHeader <= len(journal); {
		l := int(binary.LittleEndian.Uint32(journal[off:]))
		if l == 0 {
			break
		}
		offs = append(offs, off)
		off += claimFrameHeader + l
	}
	if len(offs) != n {
		t.Fatalf("%d frames in the journal at the crash, want %d (one alone, then one batch of %d)", len(offs), n, n-1)
	}
	end := offs[n-1] + claimFrameHeader + int(binary.LittleEndian.Uint32(journal[offs[n-1]:]))
	for _, c := range []struct {
		name string
		keep func(j []byte) // what of the unsynced batch reached the disk
		want int            // claims found: the first want of the journal's order
	}{
		{"batch on disk", func([]byte) {}, n},
		{"batch lost", func(j []byte) { clear(j[offs[1]:end]) }, 1},
		{"batch torn in its third frame", func(j []byte) { clear(j[offs[3]+claimFrameHeader+4 : end]) }, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			p := filepath.Join(dir, "state.db")
			copyFile(t, crash, p)
			j := append([]byte(nil), journal...)
			c.keep(j)
			if err := os.WriteFile(ClaimJournalPath(p), j, 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := Open(p)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			// The journal's order is claim 0, then the batch in the order
			// it queued, which the frames' records name.
			var order []string
			for _, off := range offs {
				var e claimEntry
				l := int(binary.LittleEndian.Uint32(journal[off:]))
				if err := json.Unmarshal(journal[off+claimFrameHeader:off+claimFrameHeader+l], &e); err != nil {
					t.Fatal(err)
				}
				order = append(order, e.Sandbox.Sandbox.GetId())
			}
			for k, id := range order {
				var i int
				fmt.Sscanf(id, "sb-%d", &i)
				if k < c.want {
					wantClaimed(t, s, i)
					continue
				}
				if r := sandboxByID(t, s, id); r == nil || !r.Pooled || r.Request != nil || len(r.Sandbox.Labels) != 0 {
					t.Fatalf("%s, not in the journal's intact frames: %+v, want it pooled as before", id, r)
				}
			}
		})
	}
}

// The same crash in a process on the real store: a child claims n members
// at once with its journal's first sync hanging (the batch written, not
// synced) and is killed there. No claim was answered; the reopened store
// has the written batch's claims whole (the kill keeps the page cache) and
// the other members pooled.
func TestClaimGroupKilledBeforeSync(t *testing.T) {
	if path := os.Getenv("FORKFLEET_STORE_GROUP_CHILD"); path != "" {
		claimGroupThenHang(path)
		return
	}
	const n = 6
	path := pooledStore(t, n)
	cmd := exec.Command(os.Args[0], "-test.run=^TestClaimGroupKilledBeforeSync$")
	cmd.Env = append(os.Environ(), "FORKFLEET_STORE_GROUP_CHILD="+path)
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
	var written int
	if _, serr := fmt.Sscanf(line, "written %d\n", &written); err != nil || serr != nil || written < 1 || written > n {
		t.Fatalf("child: %q %v", line, err)
	}
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	claimed := 0
	for i := range n {
		r := sandboxByID(t, s, fmt.Sprintf("sb-%03d", i))
		switch {
		case r == nil:
			t.Fatalf("sb-%03d gone", i)
		case r.Pooled:
			if r.Request != nil || len(r.Sandbox.Labels) != 0 {
				t.Fatalf("sb-%03d pooled with a claim's fields: %+v", i, r)
			}
		default:
			wantClaimed(t, s, i)
			claimed++
		}
	}
	if claimed != written {
		t.Fatalf("%d claimed after the restart, want the %d of the written batch", claimed, written)
	}
}

// claimGroupThenHang is TestClaimGroupKilledBeforeSync's child: n claims
// at once; the first sync reports its batch's size and hangs. A claim
// answered before that is a failure the parent sees.
func claimGroupThenHang(path string) {
	s, err := Open(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	const n = 6
	syncJournal = func(*os.File) error {
		written, err := s.claims.entries()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		for {
			s.claims.frames.mu.Lock()
			q := len(s.claims.frames.queue)
			s.claims.frames.mu.Unlock()
			if q+len(written) == n {
				break // every claim is written or queued behind
			}
			time.Sleep(100 * time.Microsecond)
		}
		fmt.Printf("written %d\n", len(written))
		select {}
	}
	for i := range n {
		go func() {
			if _, err := s.Claim(claimedRecord(i), poolRecord(), func() (uint64, uint64) { return uint64(i + 1), 0 }); err == nil {
				fmt.Println("answered before its sync")
				os.Exit(2)
			}
		}()
	}
	select {}
}

// setClaimHold sets the lazy writes' quiet time and bound for a test.
func setClaimHold(t *testing.T, quiet, hold time.Duration) {
	q, h := claimQuiet, claimHold
	claimQuiet, claimHold = quiet, hold
	t.Cleanup(func() { claimQuiet, claimHold = q, h })
}

// A claim's records' write waits for the claims around it, and any other
// write takes it along in order: once that write is committed, so is the
// claim's.
func TestClaimRecordsWaitForClaims(t *testing.T) {
	setClaimHold(t, time.Hour, time.Hour)
	s, err := Open(pooledStore(t, 2))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	applied, err := s.Claim(claimedRecord(0), poolRecord(), func() (uint64, uint64) { return 1, 0 })
	if err != nil {
		t.Fatal(err)
	}
	// A finished request's answer is lazy too.
	put := make(chan error, 1)
	go func() { put <- s.PutRequest(&rules.RequestRecord{Key: "/m/r", Expires: time.Now().Add(time.Hour)}) }()
	select {
	case err := <-applied:
		t.Fatalf("the claim's records were written while claims were quiet for less than claimQuiet (err %v)", err)
	case err := <-put:
		t.Fatalf("a request's answer was written while claims were quiet for less than claimQuiet (err %v)", err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := s.Update(func(tx *Tx) error { return tx.PutSandbox(pooledRecord(1)) }); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-applied:
		if err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatal("a write queued after the claim's records committed before them")
	}
	if err := <-put; err != nil {
		t.Fatal(err)
	}
	wantClaimed(t, s, 0)
}

// The wait is bounded: a steady stream of claims still gets its records
// written.
func TestClaimRecordsHoldBounded(t *testing.T) {
	setClaimHold(t, time.Hour, 20*time.Millisecond)
	s, err := Open(pooledStore(t, 1))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	applied, err := s.Claim(claimedRecord(0), poolRecord(), func() (uint64, uint64) { return 1, 0 })
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-applied:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the claim's records were held past claimHold")
	}
	wantClaimed(t, s, 0)
}
