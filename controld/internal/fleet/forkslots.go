package fleet

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/forkfleet/forkfleet/api/errdefs/errgrpc"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/store"
)

// Fork slots: the same for on-demand forks. A fork's runtime create (its
// snapshot on the checkpoint's layer, the container, the shim holding the
// restore options: 20 to 40 ms, more under load) does not depend on the
// request, so for the checkpoints forked most recently the manager keeps
// Options.WarmSlots forks precreated, and a fork that takes one only starts
// it (runc restore). A new checkpoint, or the first fork of an older one,
// makes it recent; refills
// run after the forks that took slots are usable (the same hold and quiet
// time as boot slots). Only ForkCheckpoint takes fork slots: pool refills
// run in the background anyway. Slots of a checkpoint that is deleted or no
// longer among the recent ones, or older than the slot age, are discarded.

const (
	// maxForkSlots bounds a checkpoint's fork slots: a checkpoint keeps as
	// many as its last fork had replicas (at least Options.WarmSlots), so a
	// trainer forking 16 ways again finds 16 containers made. Replicas
	// share shims (containerdrt shimgroup.go), so a slot holds a snapshot,
	// a container, a network namespace and a shim's task without a process.
	maxForkSlots = 16
	// forkSlotCheckpoints bounds how many checkpoints keep fork slots (each
	// slot holds a shim and a snapshot on the checkpoint's layer).
	forkSlotCheckpoints = 2
	// forkSlotPrune is how often the filler looks for slots whose
	// checkpoint was deleted: until discarded such a slot keeps the
	// checkpoint's (unrooted) layer alive.
	forkSlotPrune = 2 * time.Second
	// forkSlotStartQuiet is how long after controld starts the slots of
	// its newest checkpoints wait (seedLocked).
	forkSlotStartQuiet = time.Second
)

// forkSlots are the precreated forks of the recent checkpoints: their
// filler and its steps are methods of their own, over the warmer (m; their
// ready slots are guarded by the registry's mu), whose entry points (take,
// begin/end, expect, drop) the forks and checkpoints call.
type forkSlots struct {
	m    *warmer
	ws   *warmSlots // the boot slots, whose age and admission fork slots share
	rp   runtime.RestorePrecreator
	want int // slots per checkpoint
	kick chan struct{}

	// Guarded by Manager.mu.
	ready map[string][]forkSlot // checkpoint id -> its slots
	// forked: checkpoint id -> its last fork's replica count.
	forked map[string]int
	// lazy: checkpoint id -> its last fork restored lazily, so its slots
	// are made for lazy restores (a slot's CRIU config is in its spec).
	lazy map[string]bool
	// stale: checkpoint id -> its slots of the other restore mode, left by
	// a fork that switched modes: discarded by the filler once the forks
	// are done, not on the fork's path (16 discards took 400 ms of its
	// replicas' creates); until then they count as slots (admission, trim).
	stale map[string][]forkSlot
	// recent: checkpoint ids, most recently forked last, at most
	// forkSlotCheckpoints.
	recent     []string
	forking    int       // ForkCheckpoint calls in progress
	quietUntil time.Time // end of the quiet time after the last of them
}

type forkSlot struct {
	spec runtime.BootSpec
	at   time.Time
}

func (fs *forkSlots) wake() {
	select {
	case fs.kick <- struct{}{}:
	default:
	}
}

// lazyForked is a runtime that knows which checkpoints were forked lazily
// before controld started (containerdrt: those with a persisted working
// set, controld/docs/forks.md "Lazy restore").
type lazyForked interface {
	LazyForked(ref runtime.CheckpointRef) bool
}

// seedLocked makes, at start, the newest memory-tier checkpoints the recent
// ones, as CreateCheckpoint (forkSlotsExpect) made each when it was new: fork
// slots do not survive controld (Close discards them, reconciliation deletes
// a crash's), so without this the first fork of each after a restart
// created its container, snapshot and shim on its path (170 to 220 ms of a
// bare desktop's lazy fork here, controld/docs/forks.md "Lazy restore"). A
// checkpoint the runtime knows was forked lazily gets lazy slots.
func (fs *forkSlots) seedLocked() {
	var cks []*store.CheckpointRecord
	for _, ck := range fs.m.checkpoints {
		// A pool's own checkpoint gets slots when its misses fork from it
		// (CreateCheckpoint's rule), not before.
		if ck.Checkpoint.GetTier() != controldv1.CheckpointTier_CHECKPOINT_TIER_DISK && ck.Pool == "" {
			cks = append(cks, ck)
		}
	}
	slices.SortFunc(cks, func(a, b *store.CheckpointRecord) int {
		if c := a.Checkpoint.GetCreatedAt().AsTime().Compare(b.Checkpoint.GetCreatedAt().AsTime()); c != 0 {
			return c
		}
		return strings.Compare(a.Checkpoint.GetId(), b.Checkpoint.GetId())
	})
	// Not at once: a fork that arrives right after the start would create
	// its own container beside these precreates on the same cores (the
	// first lazy fork 30 ms after a restart: 887 against 683 ms p50 for the
	// bare desktop when they started at once).
	fs.quietUntil = time.Now().Add(forkSlotStartQuiet)
	lf, _ := runtime.As[lazyForked](fs.m.rt)
	for _, ck := range cks[max(len(cks)-forkSlotCheckpoints, 0):] {
		id := ck.Checkpoint.GetId()
		fs.touchLocked(id)
		if lf != nil && lf.LazyForked(ck.Ref) {
			fs.lazy[id] = true
		}
	}
}

// forkSlotsLocked returns the manager's fork slots, or nil when they are off.
func (m *warmer) forkSlotsLocked() *forkSlots {
	if m.slots == nil {
		return nil
	}
	return m.slots.forks
}

// forkSlotsBegin records that a fork of n replicas of ckID starts, lazily
// or not: ckID becomes the most recent checkpoint and wants n slots of that
// restore mode from now on (its slots of the other mode go stale, for the
// filler to discard after the fork), and refills hold off until
// forkSlotsEnd.
func (m *warmer) forkSlotsBegin(ckID string, n int, lazy bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if fs := m.forkSlotsLocked(); fs != nil {
		fs.touchLocked(ckID)
		fs.forked[ckID] = n
		fs.forking++
		if fs.lazy[ckID] != lazy {
			fs.lazy[ckID] = lazy
			if slots := fs.ready[ckID]; len(slots) > 0 {
				fs.stale[ckID] = append(fs.stale[ckID], slots...)
			}
			delete(fs.ready, ckID)
		}
	}
}

// wantLocked is how many slots checkpoint id keeps.
func (fs *forkSlots) wantLocked(id string) int {
	return min(max(fs.want, fs.forked[id]), maxForkSlots)
}

// forkSlotsExpect makes a new checkpoint the most recent one, so its first
// on-demand fork finds a slot too (CreateCheckpoint calls it once the
// checkpoint is committed).
func (m *warmer) forkSlotsExpect(ckID string) {
	m.mu.Lock()
	fs := m.forkSlotsLocked()
	if fs != nil {
		fs.touchLocked(ckID)
	}
	m.mu.Unlock()
	if fs != nil {
		fs.wake()
	}
}

// touchLocked moves ckID to the most recent end of fs.recent; the slots of
// a checkpoint that falls off are pruned by the filler.
func (fs *forkSlots) touchLocked(ckID string) {
	fs.recent = append(slices.DeleteFunc(fs.recent, func(id string) bool { return id == ckID }), ckID)
	if n := len(fs.recent) - forkSlotCheckpoints; n > 0 {
		for _, id := range fs.recent[:n] {
			delete(fs.forked, id)
			delete(fs.lazy, id)
		}
		fs.recent = slices.Delete(fs.recent, 0, n)
	}
}

// forkSlotsEnd reports that a fork begun with forkSlotsBegin has settled.
func (m *warmer) forkSlotsEnd() {
	m.mu.Lock()
	fs := m.forkSlotsLocked()
	if fs != nil && fs.forking > 0 {
		fs.forking--
		fs.quietUntil = time.Now().Add(slotRefillQuiet)
	}
	m.mu.Unlock()
	if fs != nil {
		fs.wake()
	}
}

// takeForkSlotLocked hands out a ready fork slot of checkpoint ckID whose
// spec matches spec but for id and tokens, or nil. The caller adopts the
// slot's id and tokens, so the runtime sees an identical spec.
func (m *warmer) takeForkSlotLocked(ckID string, spec runtime.BootSpec) *forkSlot {
	fs := m.forkSlotsLocked()
	if fs == nil {
		return nil
	}
	key, now := slotKey(spec), time.Now()
	for i, s := range fs.ready[ckID] {
		if now.Sub(s.at) >= m.slots.maxAge || slotKey(s.spec) != key {
			continue // the filler prunes it
		}
		fs.ready[ckID] = slices.Delete(fs.ready[ckID], i, i+1)
		fs.wake()
		return &s
	}
	return nil
}

// holdLocked says how much longer a refill should wait (0: go now): while
// forks run and briefly after, and while pool claims arrive (the fill
// bounds the wait, holdRefill).
func (fs *forkSlots) holdLocked(now time.Time) time.Duration {
	if fs.forking > 0 {
		return slotRefillHold // forkSlotsEnd wakes the filler earlier
	}
	return max(fs.quietUntil.Sub(now), fs.m.claims.quietIn(poolQuiet), 0)
}

// neededLocked returns the most recent checkpoint short of slots, or nil.
func (fs *forkSlots) neededLocked() *store.CheckpointRecord {
	m := fs.m
	for i := len(fs.recent) - 1; i >= 0; i-- {
		id := fs.recent[i]
		if ck, ok := m.checkpoints[id]; ok && len(fs.ready[id]) < fs.wantLocked(id) {
			return ck
		}
	}
	return nil
}

// fill keeps the recent checkpoints' fork slots filled until the manager
// closes, then discards them. Like the boot slots' fill it precreates one
// at a time and holds off while forks run and briefly after.
func (fs *forkSlots) fill() {
	m, ws := fs.m, fs.ws
	defer fs.prune(true)
	prune := time.NewTicker(forkSlotPrune)
	defer prune.Stop()
	retry := m.opts.PoolRetry
	var holdUntil time.Time
	for m.ctx.Err() == nil {
		fs.prune(false)
		ws.trim()
		m.mu.Lock()
		now := time.Now()
		ck, hold := fs.neededLocked(), fs.holdLocked(now)
		if ck != nil && !m.slotRoomLocked(m.memoryOf(ck.Checkpoint.GetResources())) {
			ck = nil // at the host's admission limits: a delete wakes the filler
		}
		stale := len(fs.stale) > 0
		m.mu.Unlock()
		if (ck != nil || stale) && holdRefill(m.ctx, now, hold, &holdUntil, fs.kick) {
			continue
		}
		holdUntil = time.Time{}
		if stale {
			fs.discardStale()
			continue
		}
		if ck == nil {
			idle(m.ctx, fs.kick, prune.C)
			continue
		}
		if err := fs.precreate(ck); err != nil {
			if m.ctx.Err() != nil {
				return
			}
			if !fs.wanted(ck.Checkpoint.GetId()) {
				// Deleted while its slot was made, or being deleted (its
				// layer or images went under the precreate while its record
				// still exists), or no longer recent: nothing failed, and
				// backing off would hold off the next checkpoints' slots,
				// whose forks then restore cold (seconds of backoff in a
				// benchmark that checkpoints, forks and deletes in a row).
				m.log.Debug("fork slot dropped: its checkpoint was deleted or is no longer recent", "checkpoint", ck.Checkpoint.GetId(), "err", err)
				continue
			}
			m.log.Warn("fork slot precreate failed", "checkpoint", ck.Checkpoint.GetId(), "err", err, "retry_in", retry)
			retry = backoff(m.ctx, retry)
			continue
		}
		retry = m.opts.PoolRetry
	}
}

// wanted reports whether checkpoint id still wants fork slots: it
// is recorded and among the recent ones. A delete takes it off the recent
// list first (dropForkSlots), before its layer goes and long before its
// record does.
func (fs *forkSlots) wanted(id string) bool {
	m := fs.m
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.checkpoints[id]
	return ok && slices.Contains(fs.recent, id)
}

// precreate precreates one fork of ck, drawn as ForkCheckpoint
// draws a replica, and makes it ready unless ck stopped needing it.
func (fs *forkSlots) precreate(ck *store.CheckpointRecord) error {
	m := fs.m
	rec, err := m.newRecord(forkSandboxParams(ck, forkParams{policy: ck.Checkpoint.GetNetwork().GetPolicy()}), time.Now())
	if err != nil {
		return err
	}
	spec := specOf(rec)
	id := ck.Checkpoint.GetId()
	m.mu.Lock()
	spec.LazyRestore = fs.lazy[id]
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(m.ctx), slotOpTimeout)
	defer cancel()
	start := time.Now()
	err = fs.rp.PrecreateRestore(ctx, spec, ck.Ref)
	m.metrics.RuntimeCall.WithLabelValues("precreate_restore", errgrpc.Code(err).String()).Observe(time.Since(start).Seconds())
	if err != nil {
		return err
	}
	m.mu.Lock()
	_, exists := m.checkpoints[id]
	keep := exists && m.ctx.Err() == nil && slices.Contains(fs.recent, id) && len(fs.ready[id]) < fs.wantLocked(id) &&
		fs.lazy[id] == spec.LazyRestore
	if keep {
		fs.ready[id] = append(fs.ready[id], forkSlot{spec: spec, at: time.Now()})
	}
	m.mu.Unlock()
	if !keep {
		m.discardSlot(spec.ID)
	}
	return nil
}

// dropForkSlots discards the fork slots of checkpoint ckID now, before the
// checkpoint's layer goes: each slot's snapshot is a child of that layer.
func (m *warmer) dropForkSlots(ckID string) {
	m.mu.Lock()
	fs := m.forkSlotsLocked()
	var drop []forkSlot
	if fs != nil {
		drop = append(fs.ready[ckID], fs.stale[ckID]...)
		delete(fs.ready, ckID)
		delete(fs.stale, ckID)
		delete(fs.forked, ckID)
		delete(fs.lazy, ckID)
		fs.recent = slices.DeleteFunc(fs.recent, func(id string) bool { return id == ckID })
	}
	m.mu.Unlock()
	for _, s := range drop {
		m.discardSlot(s.spec.ID)
	}
}

// prune discards the fork slots of deleted or no longer recent
// checkpoints and those past their age; all of them when all is set.
func (fs *forkSlots) prune(all bool) {
	m, ws := fs.m, fs.ws
	now := time.Now()
	var drop []string
	m.mu.Lock()
	for id, slots := range fs.ready {
		_, exists := m.checkpoints[id]
		gone := all || !exists || !slices.Contains(fs.recent, id)
		keep := slots[:0]
		for _, s := range slots {
			if gone || now.Sub(s.at) >= ws.maxAge {
				drop = append(drop, s.spec.ID)
			} else {
				keep = append(keep, s)
			}
		}
		if len(keep) == 0 {
			delete(fs.ready, id)
		} else {
			fs.ready[id] = keep
		}
	}
	if all {
		for _, slots := range fs.stale {
			for _, s := range slots {
				drop = append(drop, s.spec.ID)
			}
		}
		clear(fs.stale)
	}
	m.mu.Unlock()
	for _, id := range drop {
		m.discardSlot(id)
	}
}

// discardStale discards the slots that a change of restore mode left.
func (fs *forkSlots) discardStale() {
	m := fs.m
	m.mu.Lock()
	var drop []forkSlot
	for _, slots := range fs.stale {
		drop = append(drop, slots...)
	}
	clear(fs.stale)
	m.mu.Unlock()
	for _, s := range drop {
		m.discardSlot(s.spec.ID)
	}
}

// takeStaleLocked takes a stale slot out of fs for its caller to discard
// ("": none; fs may be nil).
func (fs *forkSlots) takeStaleLocked() string {
	if fs == nil {
		return ""
	}
	for ck, slots := range fs.stale {
		if len(slots) == 1 {
			delete(fs.stale, ck)
		} else {
			fs.stale[ck] = slots[1:]
		}
		return slots[0].spec.ID
	}
	return ""
}
