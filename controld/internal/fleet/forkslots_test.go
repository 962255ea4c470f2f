package fleet_test

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/fleet"
	"github.com/forkfleet/forkfleet/controld/internal/fleet/fleettest"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// restorePrecreating adds runtime.RestorePrecreator to the fake runtime: a
// precreated fork is remembered, and a Restore with the identical spec and
// checkpoint counts as a start-only restore.
type restorePrecreating struct {
	*fleettest.Runtime

	mu   sync.Mutex
	pre  map[string]precreatedFork
	hits int
	// hook, when set, runs before a precreate and fails it with its error.
	hook func(ref runtime.CheckpointRef) error
	// deleteHook, when set, runs before a checkpoint's runtime delete.
	deleteHook func(ref runtime.CheckpointRef)
	// otherMode counts, at each restore, the precreated forks of the same
	// checkpoint in the other restore mode still there.
	otherMode []int
}

func (r *restorePrecreating) DeleteCheckpoint(ctx context.Context, ref runtime.CheckpointRef) error {
	r.mu.Lock()
	hook := r.deleteHook
	r.mu.Unlock()
	if hook != nil {
		hook(ref)
	}
	return r.Runtime.DeleteCheckpoint(ctx, ref)
}

type precreatedFork struct {
	spec runtime.BootSpec
	ref  runtime.CheckpointRef
}

var _ runtime.RestorePrecreator = (*restorePrecreating)(nil)

func (r *restorePrecreating) PrecreateRestore(ctx context.Context, spec runtime.BootSpec, ref runtime.CheckpointRef) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r.mu.Lock()
	hook := r.hook
	r.mu.Unlock()
	if hook != nil {
		if err := hook(ref); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.pre[spec.ID]; dup {
		return fmt.Errorf("sandbox %s: %w", spec.ID, errdefs.ErrAlreadyExists)
	}
	r.pre[spec.ID] = precreatedFork{spec: spec, ref: ref}
	return nil
}

func (r *restorePrecreating) Restore(ctx context.Context, spec runtime.BootSpec, ref runtime.CheckpointRef) (runtime.Instance, error) {
	r.mu.Lock()
	p, ok := r.pre[spec.ID]
	delete(r.pre, spec.ID)
	if ok && reflect.DeepEqual(p, precreatedFork{spec: spec, ref: ref}) {
		r.hits++
	}
	other := 0
	for _, q := range r.pre {
		if q.ref.Dir == ref.Dir && q.spec.LazyRestore != spec.LazyRestore {
			other++
		}
	}
	r.otherMode = append(r.otherMode, other)
	r.mu.Unlock()
	return r.Runtime.Restore(ctx, spec, ref)
}

func (r *restorePrecreating) Discard(ctx context.Context, id string) error {
	r.mu.Lock()
	if _, ok := r.pre[id]; ok {
		delete(r.pre, id)
		r.mu.Unlock()
		return nil
	}
	r.mu.Unlock()
	return r.Runtime.Discard(ctx, id)
}

// forks returns the precreated forks' ids by checkpoint directory.
func (r *restorePrecreating) forks() map[string][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string][]string{}
	for id, p := range r.pre {
		out[p.ref.Dir] = append(out[p.ref.Dir], id)
	}
	for _, ids := range out {
		sort.Strings(ids)
	}
	return out
}

func (r *restorePrecreating) hitCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.hits
}

func forkOne(t *testing.T, e *env, ckID string) *controldv1.Sandbox {
	t.Helper()
	reps, err := replicasOf(e.m.ForkCheckpoint(context.Background(), &controldv1.ForkCheckpointRequest{CheckpointId: ckID, Count: 1}))
	if err != nil {
		t.Fatal(err)
	}
	r := reps[0]
	if r.ErrorCode != 0 || r.Sandbox == nil {
		t.Fatalf("replica failed: %s", r.ErrorMessage)
	}
	for _, v := range r.Verification {
		if !v.Ok {
			t.Fatalf("verify %v: %s", v.Level, v.Detail)
		}
	}
	return r.Sandbox
}

func TestForkSlots(t *testing.T) {
	var rp *restorePrecreating
	e := slotEnv(t, 1, func(o *fleet.Options, rt *fleettest.Runtime) {
		rp = &restorePrecreating{Runtime: rt, pre: map[string]precreatedFork{}}
		o.Runtime = rp
	})
	ctx := context.Background()
	src := e.ready(nil)
	var cks []*controldv1.Checkpoint
	for range 3 {
		ck, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id})
		if err != nil {
			t.Fatal(err)
		}
		cks = append(cks, ck)
	}
	dirOf := func(ck *controldv1.Checkpoint) string { return e.dir + "/checkpoints/" + ck.Id }
	slotsOf := func(ck *controldv1.Checkpoint) []string { return rp.forks()[dirOf(ck)] }

	// A new checkpoint is the most recent one: the two newest get a slot
	// before any fork, the oldest none; its first fork makes one.
	eventually(t, "fork slots of the new checkpoints", func() bool {
		return len(slotsOf(cks[1])) == 1 && len(slotsOf(cks[2])) == 1
	})
	if s := slotsOf(cks[0]); len(s) != 0 {
		t.Fatalf("fork slots of a checkpoint no longer recent: %v", s)
	}
	forkOne(t, e, cks[0].Id)
	if rp.hitCount() != 0 {
		t.Fatal("first fork used a slot")
	}
	var slot string
	eventually(t, "fork slot", func() bool {
		s := slotsOf(cks[0])
		if len(s) == 1 {
			slot = s[0]
		}
		return len(s) == 1
	})

	// The next fork takes it: the slot's id, only started, verified, and
	// with the replica's own token.
	rep := forkOne(t, e, cks[0].Id)
	if rep.Id != slot || rp.hitCount() != 1 {
		t.Fatalf("fork %s (hits %d), want the slot %s", rep.Id, rp.hitCount(), slot)
	}
	if len(rep.Boot) == 0 || rep.Boot[0].Name != fleet.PhaseCreate || rep.Boot[0].At.AsDuration() != 0 {
		t.Fatalf("boot phases %v: a slot fork has no create phase", rep.Boot)
	}
	ep, err := e.m.SandboxEndpoint(ctx, rep.Id)
	if err != nil {
		t.Fatal(err)
	}
	if g := e.rt.Guest(rep.Id); g == nil || g.ACIToken() != ep.Token {
		t.Fatal("slot fork does not hold the endpoint's token")
	}
	// Replenished with a new identity.
	eventually(t, "fork slot refill", func() bool {
		s := slotsOf(cks[0])
		return len(s) == 1 && s[0] != slot
	})

	// Pool refills do not take fork slots.
	before := rp.hitCount()
	if _, err := e.m.CreatePool(ctx, &controldv1.CreatePoolRequest{Source: &controldv1.CreatePoolRequest_CheckpointId{CheckpointId: cks[0].Id}, Size: 1}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "pool filled", func() bool {
		l, _, _ := e.m.ListSandboxes(ctx, &controldv1.ListSandboxesRequest{})
		n := 0
		for _, s := range l {
			if s.PoolId != "" && s.State == controldv1.SandboxState_SANDBOX_STATE_SUSPENDED {
				n++
			}
		}
		return n == 1
	})
	if rp.hitCount() != before {
		t.Fatal("a pool refill took a fork slot")
	}

	// Only the two most recently forked checkpoints keep slots.
	forkOne(t, e, cks[1].Id)
	forkOne(t, e, cks[2].Id)
	eventually(t, "slots of the recent checkpoints only", func() bool {
		return len(slotsOf(cks[0])) == 0 && len(slotsOf(cks[1])) == 1 && len(slotsOf(cks[2])) == 1
	})

	// A deleted checkpoint's slot is discarded.
	l, _, err := e.m.ListSandboxes(ctx, &controldv1.ListSandboxesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range l {
		if s.CheckpointId == cks[2].Id && s.PoolId == "" {
			if err := e.m.DeleteSandbox(ctx, s.Id); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := e.m.DeleteCheckpoint(ctx, cks[2].Id, false); err != nil {
		t.Fatal(err)
	}
	// At once: a slot's snapshot is a child of the checkpoint's layer.
	if s := slotsOf(cks[2]); len(s) != 0 {
		t.Fatalf("deleted checkpoint keeps fork slots %v", s)
	}

	// Close discards the rest.
	e.stop()
	if f := rp.forks(); len(f) != 0 {
		t.Fatalf("fork slots left after Close: %v", f)
	}
}

// TestForkSlotOfDeletedCheckpoint: a checkpoint deleted while its fork slot
// is made fails that precreate, which is no failure of the slot filler: it
// goes on to the next checkpoint's slot at once. (It backed off, 500 ms
// doubling, and held off the next checkpoints' slots: in benchd's fork
// suite, which checkpoints, forks and deletes in a row, forks restored cold.)
func TestForkSlotOfDeletedCheckpoint(t *testing.T) {
	var rp *restorePrecreating
	e := slotEnv(t, 1, func(o *fleet.Options, rt *fleettest.Runtime) {
		rp = &restorePrecreating{Runtime: rt, pre: map[string]precreatedFork{}}
		o.Runtime = rp
		o.PoolRetry = time.Hour // a backoff outlasts the test
	})
	ctx := context.Background()
	src := e.ready(nil)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	rp.mu.Lock()
	rp.hook = func(runtime.CheckpointRef) error {
		first := false
		once.Do(func() { first = true })
		if !first {
			return nil
		}
		close(entered)
		<-release
		return fmt.Errorf("create container: parent snapshot does not exist: %w", errdefs.ErrNotFound)
	}
	rp.mu.Unlock()

	a, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id})
	if err != nil {
		t.Fatal(err)
	}
	<-entered // a's slot is being made
	if _, err := e.m.DeleteCheckpoint(ctx, a.Id, false); err != nil {
		t.Fatal(err)
	}
	close(release)
	b, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the next checkpoint's fork slot", func() bool {
		return len(rp.forks()[e.dir+"/checkpoints/"+b.Id]) == 1
	})
}

// TestForkSlotOfCheckpointBeingDeleted: the precreate of a checkpoint's fork
// slot fails while the checkpoint is being deleted (its layer is gone, its
// record not yet): no failure of the filler either, so another checkpoint's
// slot taken meanwhile is refilled at once. (It backed off: the record still
// existed, and the next forks restored cold.)
func TestForkSlotOfCheckpointBeingDeleted(t *testing.T) {
	var rp *restorePrecreating
	e := slotEnv(t, 1, func(o *fleet.Options, rt *fleettest.Runtime) {
		rp = &restorePrecreating{Runtime: rt, pre: map[string]precreatedFork{}}
		o.Runtime = rp
		o.PoolRetry = time.Hour // a backoff outlasts the test
	})
	ctx := context.Background()
	src := e.ready(nil)
	b, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id})
	if err != nil {
		t.Fatal(err)
	}
	bDir := e.dir + "/checkpoints/" + b.Id
	eventually(t, "b's fork slot", func() bool { return len(rp.forks()[bDir]) == 1 })

	entered, release, deleting, finish := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	var once sync.Once
	rp.mu.Lock()
	rp.hook = func(runtime.CheckpointRef) error {
		first := false
		once.Do(func() { first = true })
		if !first {
			return nil
		}
		close(entered)
		<-release
		return fmt.Errorf("create container: parent snapshot does not exist: %w", errdefs.ErrNotFound)
	}
	rp.deleteHook = func(runtime.CheckpointRef) {
		close(deleting)
		<-finish
	}
	rp.mu.Unlock()

	a, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id})
	if err != nil {
		t.Fatal(err)
	}
	<-entered // a's slot is being made
	deleted := make(chan error, 1)
	go func() {
		_, err := e.m.DeleteCheckpoint(ctx, a.Id, false)
		deleted <- err
	}()
	<-deleting     // a's slots are dropped, its record is still there
	close(release) // a's precreate fails under the delete
	forkOne(t, e, b.Id)
	eventually(t, "b's fork slot refilled", func() bool { return len(rp.forks()[bDir]) == 1 })
	close(finish)
	if err := <-deleted; err != nil {
		t.Fatal(err)
	}
}

// A checkpoint keeps as many fork slots as its last fork had replicas (at
// least the configured count): forked 4 ways, its next 4-way fork only
// starts precreated containers.
func TestForkSlotsFollowTheForkWidth(t *testing.T) {
	var rp *restorePrecreating
	e := slotEnv(t, 1, func(o *fleet.Options, rt *fleettest.Runtime) {
		rp = &restorePrecreating{Runtime: rt, pre: map[string]precreatedFork{}}
		o.Runtime = rp
	})
	ctx := context.Background()
	src := e.ready(nil)
	ck, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id})
	if err != nil {
		t.Fatal(err)
	}
	slots := func() int { return len(rp.forks()[e.dir+"/checkpoints/"+ck.Id]) }
	eventually(t, "the configured slot", func() bool { return slots() == 1 })
	fork := func() {
		t.Helper()
		reps, err := replicasOf(e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Id, Count: 4}))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range reps {
			if r.ErrorCode != 0 {
				t.Fatalf("replica failed: %s", r.ErrorMessage)
			}
		}
	}
	fork()
	if rp.hitCount() != 1 {
		t.Fatalf("first 4-way fork used %d slots, want the 1 there was", rp.hitCount())
	}
	eventually(t, "a slot per replica of the last fork", func() bool { return slots() == 4 })
	fork()
	if rp.hitCount() != 5 {
		t.Fatalf("second 4-way fork: %d slot starts in all, want 5", rp.hitCount())
	}
}

// claimBurst makes n claims of pool id at once and returns the sandboxes
// the misses got.
func claimBurst(t *testing.T, e *env, id string, n int) (misses []*controldv1.Sandbox, all []string) {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, _, hit, _, err := e.m.ClaimPool(context.Background(), &controldv1.ClaimPoolRequest{PoolId: id})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("claim: %v", err)
				return
			}
			all = append(all, s.Id)
			if !hit {
				misses = append(misses, s)
			}
		}()
	}
	wg.Wait()
	return misses, all
}

// The misses of a burst beyond a pool are one fan-out to its checkpoint's
// fork slots: the checkpoint then keeps a slot per miss of the burst, so
// the next burst of as many misses only starts precreated containers.
func TestPoolMissBurstFollowsForkSlots(t *testing.T) {
	var rp *restorePrecreating
	e := slotEnv(t, 1, func(o *fleet.Options, rt *fleettest.Runtime) {
		rp = &restorePrecreating{Runtime: rt, pre: map[string]precreatedFork{}}
		o.Runtime = rp
		// A restore takes a while, as a real one does: a burst's misses
		// fork side by side.
		rt.RestoreErr = func(runtime.BootSpec, runtime.CheckpointRef) error { time.Sleep(30 * time.Millisecond); return nil }
	})
	ctx := context.Background()
	src := e.ready(nil)
	ck, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id})
	if err != nil {
		t.Fatal(err)
	}
	p, err := e.m.CreatePool(ctx, &controldv1.CreatePoolRequest{Source: &controldv1.CreatePoolRequest_CheckpointId{CheckpointId: ck.Id}, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	slots := func() int { return len(rp.forks()[e.dir+"/checkpoints/"+ck.Id]) }
	full := func() bool { got, _ := e.m.GetPool(ctx, p.Id); return got.Available == 1 }
	eventually(t, "the pool full and the configured slot", func() bool { return full() && slots() == 1 })
	burst := func() int {
		t.Helper()
		before := rp.hitCount()
		misses, all := claimBurst(t, e, p.Id, 4)
		if len(misses) != 3 {
			t.Fatalf("%d misses in a burst of 4 on a pool of 1", len(misses))
		}
		for _, s := range misses {
			if s.CheckpointId != ck.Id || s.State != controldv1.SandboxState_SANDBOX_STATE_READY {
				t.Fatalf("miss not a fork of the pool's checkpoint: %+v", s)
			}
		}
		for _, id := range all {
			if err := e.m.DeleteSandbox(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		return rp.hitCount() - before
	}
	if n := burst(); n > 1 {
		t.Fatalf("first burst's misses started %d slots, there was 1", n)
	}
	eventually(t, "a slot per miss of the last burst", func() bool { return full() && slots() == 3 })
	if n := burst(); n != 3 {
		t.Fatalf("second burst's 3 misses started %d precreated slots, want 3", n)
	}
}

// A burst far beyond a pool forks at most maxMissForks (8) replicas at
// once; the other misses wait their turn and are served too.
func TestPoolMissForksBounded(t *testing.T) {
	var mu sync.Mutex
	var now, most int
	e := newEnv(t, nil)
	e.rt.RestoreErr = func(runtime.BootSpec, runtime.CheckpointRef) error {
		mu.Lock()
		now++
		most = max(most, now)
		mu.Unlock()
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		now--
		mu.Unlock()
		return nil
	}
	ctx := context.Background()
	src := e.ready(nil)
	ck, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id})
	if err != nil {
		t.Fatal(err)
	}
	p, err := e.m.CreatePool(ctx, &controldv1.CreatePoolRequest{Source: &controldv1.CreatePoolRequest_CheckpointId{CheckpointId: ck.Id}, Size: 1})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pool full", func() bool { got, _ := e.m.GetPool(ctx, p.Id); return got.Available == 1 })
	mu.Lock()
	most = 0
	mu.Unlock()
	misses, _ := claimBurst(t, e, p.Id, 13)
	if len(misses) != 12 {
		t.Fatalf("%d of 12 misses served", len(misses))
	}
	mu.Lock()
	defer mu.Unlock()
	if most != 8 {
		t.Fatalf("%d restores at once for a burst of 12 misses, want the bound, 8", most)
	}
}

// TestForkSlotsFollowTheRestoreMode: a checkpoint's fork slots are made for
// its last fork's restore mode (a slot's CRIU config is in its spec): a
// lazy fork finds none of the eager ones, the next lazy fork starts the
// lazy slots made after it, and an eager fork again drops them.
func TestForkSlotsFollowTheRestoreMode(t *testing.T) {
	var rp *restorePrecreating
	e := slotEnv(t, 1, func(o *fleet.Options, rt *fleettest.Runtime) {
		rp = &restorePrecreating{Runtime: rt, pre: map[string]precreatedFork{}}
		o.Runtime = rp
	})
	ctx := context.Background()
	src := e.ready(nil)
	ck, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id})
	if err != nil {
		t.Fatal(err)
	}
	dir := e.dir + "/checkpoints/" + ck.Id
	slots := func(lazy bool) int {
		rp.mu.Lock()
		defer rp.mu.Unlock()
		n := 0
		for _, p := range rp.pre {
			if p.ref.Dir == dir && p.spec.LazyRestore == lazy {
				n++
			}
		}
		return n
	}
	eventually(t, "the configured eager slot", func() bool { return slots(false) == 1 })
	fork := func(mode controldv1.RestoreMode, n uint32) {
		t.Helper()
		reps, err := replicasOf(e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck.Id, Count: n, RestoreMode: mode}))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range reps {
			if r.ErrorCode != 0 {
				t.Fatalf("replica failed: %s", r.ErrorMessage)
			}
		}
	}
	fork(controldv1.RestoreMode_RESTORE_MODE_LAZY, 2)
	if rp.hitCount() != 0 {
		t.Fatalf("a lazy fork started %d eager slots", rp.hitCount())
	}
	// The eager slot was discarded after the fork, not on its path.
	rp.mu.Lock()
	other := slices.Clone(rp.otherMode)
	rp.mu.Unlock()
	if !slices.Equal(other, []int{1, 1}) {
		t.Errorf("eager slots left at the lazy replicas' restores: %v, want [1 1] (discarded after the fork)", other)
	}
	eventually(t, "two lazy slots, no eager one", func() bool { return slots(true) == 2 && slots(false) == 0 })
	fork(controldv1.RestoreMode_RESTORE_MODE_LAZY, 2)
	if rp.hitCount() != 2 {
		t.Fatalf("second lazy fork started %d lazy slots, want 2", rp.hitCount())
	}
	eventually(t, "two lazy slots again", func() bool { return slots(true) == 2 })
	fork(controldv1.RestoreMode_RESTORE_MODE_EAGER, 1)
	if rp.hitCount() != 2 {
		t.Fatalf("an eager fork started a lazy slot (%d starts)", rp.hitCount())
	}
	eventually(t, "eager slots after an eager fork", func() bool { return slots(true) == 0 && slots(false) >= 1 })
}

// lazyForkedRuntime adds the runtime's lazy history (containerdrt: the
// checkpoints with a persisted working set) to restorePrecreating.
type lazyForkedRuntime struct {
	*restorePrecreating
	lazyDirs map[string]bool
}

func (r *lazyForkedRuntime) LazyForked(ref runtime.CheckpointRef) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lazyDirs[ref.Dir]
}

// Fork slots do not survive controld; after a restart the newest
// checkpoints get theirs again at once, lazy ones when the runtime knows
// they were forked lazily, so the first fork after the restart starts a
// slot instead of creating its container on its path.
func TestForkSlotsMadeAfterRestart(t *testing.T) {
	var rp *lazyForkedRuntime
	e := slotEnv(t, 1, func(o *fleet.Options, rt *fleettest.Runtime) {
		if rp == nil {
			rp = &lazyForkedRuntime{restorePrecreating: &restorePrecreating{Runtime: rt, pre: map[string]precreatedFork{}}, lazyDirs: map[string]bool{}}
		}
		o.Runtime = rp
	})
	ctx := context.Background()
	src := e.ready(nil)
	var cks []string
	for range 3 {
		ck, err := e.m.CreateCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: src.Id})
		if err != nil {
			t.Fatal(err)
		}
		cks = append(cks, ck.Id)
	}
	dir := func(id string) string { return e.dir + "/checkpoints/" + id }
	slots := func(id string, lazy bool) int {
		rp.mu.Lock()
		defer rp.mu.Unlock()
		n := 0
		for _, p := range rp.pre {
			if p.ref.Dir == dir(id) && p.spec.LazyRestore == lazy {
				n++
			}
		}
		return n
	}
	eventually(t, "the newest checkpoint's slot", func() bool { return slots(cks[2], false) == 1 })
	rp.mu.Lock()
	rp.lazyDirs[dir(cks[2])] = true
	rp.mu.Unlock()

	e.restart()
	eventually(t, "after the restart, a lazy slot of the newest checkpoint and an eager one of the one before", func() bool {
		return slots(cks[2], true) == 1 && slots(cks[1], false) == 1
	})
	if n := slots(cks[0], false) + slots(cks[0], true) + slots(cks[2], false); n != 0 {
		t.Errorf("%d slots of an older checkpoint or in the other mode", n)
	}
	hits := rp.hitCount()
	reps, err := replicasOf(e.m.ForkCheckpoint(ctx, &controldv1.ForkCheckpointRequest{CheckpointId: cks[2], Count: 1,
		RestoreMode: controldv1.RestoreMode_RESTORE_MODE_LAZY}))
	if err != nil || reps[0].ErrorCode != 0 {
		t.Fatalf("lazy fork after the restart: %v %v", err, reps)
	}
	if rp.hitCount() != hits+1 {
		t.Errorf("the first lazy fork after the restart started %d slots, want 1", rp.hitCount()-hits)
	}
}
