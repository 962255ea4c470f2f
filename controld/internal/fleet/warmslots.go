package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"time"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/errdefs/errgrpc"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/limits"
	"github.com/forkfleet/forkfleet/controld/internal/network"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/store"
)

// Warm slots: the manager keeps Options.WarmSlots sandboxes of the default
// image, screen and resources precreated, with their ids and tokens drawn
// up front as CreateSandbox would draw them. A create whose spec matches
// takes one and the runtime only starts its task: the snapshot, container,
// shim and runc create (the create phase and most of task_start) are off
// the request path. Slots are not sandboxes: they have no record, are not
// listed, and do not survive controld: Close discards them, and a crash
// leaves containers without records, which reconciliation deletes.

const (
	// slotRetryMax caps the backoff after failed precreates.
	slotRetryMax = 30 * time.Second
	// slotOpTimeout bounds one precreate or discard.
	slotOpTimeout = 30 * time.Second
	// slotRefillHold is the longest a refill waits for the boots that took
	// slots to become usable: on a few CPUs, a precreate (shim start, runc
	// create: tens of ms of CPU) running beside a boot slows that boot down.
	slotRefillHold = time.Second
	// slotRefillQuiet is how long after such a boot became usable the
	// refill still waits, so the client's first observation (connect,
	// screenshot) does not compete with it either.
	slotRefillQuiet = 150 * time.Millisecond
	// defaultSlotMaxAge is how long a slot waits before it is recycled: a
	// slot boots the image as it was when precreated, so an image
	// re-imported under the same name reaches slot boots within this.
	defaultSlotMaxAge = 10 * time.Minute
)

// Slot outcomes of a create (the result label of BootSlots).
const (
	slotHit      = "hit"      // took a slot
	slotEmpty    = "empty"    // matching spec, no slot ready: cold boot
	slotMismatch = "mismatch" // spec differs from the slots': cold boot
)

type warmSlots struct {
	pc     runtime.Precreator
	want   int
	maxAge time.Duration
	kick   chan struct{}
	key    string // slotKey of the default slots' spec (fixed: the defaults)
	// egressKey is the slotKey of the defaults in network mode egress ("":
	// the runtime has no egress). Such slots are kept only while egress
	// creates come (one in the last maxAge): each holds a router namespace
	// and uplink too.
	egressKey string
	// memoryBytes is every slot's memory limit (the default).
	memoryBytes int64
	// forks: fork slots (nil when the runtime cannot precreate restores).
	forks *forkSlots

	// Guarded by Manager.mu.
	ready      []warmSlot
	booting    int       // slot-born boots not yet usable (or failed)
	quietUntil time.Time // end of the quiet time after the last of them
	// demand: a matching create found no slot; refill without holding.
	demand bool
	// egressWanted is when an egress create last came; egressFirst: it
	// found no slot, so the next refill is an egress one.
	egressWanted time.Time
	egressFirst  bool
}

// egressWantedLocked reports whether egress slots are kept now.
func (ws *warmSlots) egressWantedLocked(now time.Time) bool {
	return ws.egressKey != "" && !ws.egressWanted.IsZero() && now.Sub(ws.egressWanted) < ws.maxAge
}

// countLocked counts the ready slots of key.
func (ws *warmSlots) countLocked(key string) int {
	n := 0
	for _, s := range ws.ready {
		if s.key == key {
			n++
		}
	}
	return n
}

// holdLocked says how much longer a refill should wait (0: go now).
func (ws *warmSlots) holdLocked(now time.Time) time.Duration {
	switch {
	case ws.demand:
		return 0
	case ws.booting > 0:
		return slotRefillHold // slotBootDone wakes the filler earlier
	}
	return max(ws.quietUntil.Sub(now), 0)
}

type warmSlot struct {
	spec runtime.BootSpec
	key  string // slotKey(spec)
	at   time.Time
}

// slotKey identifies what a boot produces, identity aside: two specs with
// the same key differ only in id and tokens.
func slotKey(s runtime.BootSpec) string {
	s.ID, s.ACIToken, s.AdminToken, s.Labels = "", "", "", nil
	s.Network.Policy = network.Policy{} // applied at start
	b, err := json.Marshal(s)
	if err != nil {
		panic(err) // plain data always marshals
	}
	return string(b)
}

// slotSpec draws a new slot: the spec of a default CreateSandbox (in
// network mode egress with egress), with a fresh id and tokens.
func (m *Manager) slotSpec(egress bool) runtime.BootSpec {
	p := sandboxParams{}
	if egress {
		p.network = &controldv1.Network{Mode: controldv1.NetworkMode_NETWORK_MODE_EGRESS}
	}
	rec, err := m.newRecord(p, time.Now())
	if err != nil {
		panic(err) // the host's defaults always resolve (checked at New)
	}
	return specOf(rec)
}

// startSlots starts the slot filler when slots are configured and the
// runtime can precreate.
func (m *Manager) startSlots() {
	if m.opts.WarmSlots <= 0 {
		return
	}
	pc, ok := runtime.As[runtime.Precreator](m.rt)
	if !ok {
		m.log.Info("runtime cannot precreate sandboxes; warm slots are off")
		return
	}
	ws := &warmSlots{pc: pc, want: m.opts.WarmSlots, maxAge: m.opts.WarmSlotMaxAge, kick: make(chan struct{}, 1)}
	spec := m.slotSpec(false)
	ws.key, ws.memoryBytes = slotKey(spec), spec.MemoryBytes
	// Egress slots are made only once an egress create succeeded (which
	// makes this controld the owner of the host's table).
	if _, ok := runtime.As[runtime.Networker](m.rt); ok {
		ws.egressKey = slotKey(m.slotSpec(true))
	}
	if rp, ok := pc.(runtime.RestorePrecreator); ok {
		ws.forks = &forkSlots{rp: rp, want: m.opts.WarmSlots, kick: make(chan struct{}, 1), ready: map[string][]forkSlot{}}
	}
	m.mu.Lock()
	m.slots = ws
	m.mu.Unlock()
	m.goBackground(func() { m.fillSlots(ws) })
	if ws.forks != nil {
		m.goBackground(func() { m.fillForkSlots(ws, ws.forks) })
	}
}

// takeSlotLocked hands out a ready slot whose spec matches spec, or nil.
// The caller adopts the slot's id and tokens, so the runtime sees an
// identical spec, and calls slotBootDone when that boot has settled: the
// refill waits for it (at most slotRefillHold), off the request path.
func (m *Manager) takeSlotLocked(spec runtime.BootSpec) *warmSlot {
	ws := m.slots
	if ws == nil {
		return nil
	}
	key := slotKey(spec)
	if key != ws.key && (ws.egressKey == "" || key != ws.egressKey) {
		m.metrics.BootSlots.WithLabelValues(slotMismatch).Inc()
		return nil
	}
	now := time.Now()
	if key == ws.egressKey {
		ws.egressWanted = now
	}
	for i, s := range ws.ready {
		if now.Sub(s.at) >= ws.maxAge || s.key != key {
			continue // the filler recycles it, or another kind
		}
		ws.ready = append(ws.ready[:i], ws.ready[i+1:]...)
		ws.booting++
		m.metrics.WarmSlots.Set(float64(len(ws.ready)))
		m.metrics.BootSlots.WithLabelValues(slotHit).Inc()
		ws.wake()
		return &s
	}
	m.metrics.BootSlots.WithLabelValues(slotEmpty).Inc()
	ws.demand = true
	ws.egressFirst = key == ws.egressKey
	ws.wake()
	return nil
}

func (ws *warmSlots) wake() {
	select {
	case ws.kick <- struct{}{}:
	default:
	}
}

// slotBootDone reports that a boot which took a slot has settled.
func (m *Manager) slotBootDone() {
	m.mu.Lock()
	ws := m.slots
	if ws != nil && ws.booting > 0 {
		ws.booting--
		ws.quietUntil = time.Now().Add(slotRefillQuiet)
	}
	m.mu.Unlock()
	if ws != nil {
		ws.wake()
	}
}

// fillSlots keeps ws at its size until the manager closes, then discards
// what is left. It precreates one slot at a time, and holds off (for at
// most slotRefillHold) while a boot that took a slot is still coming up and
// briefly after: precreating competes for the same CPUs as the boots it
// serves. A create that found no slot ends the hold.
func (m *Manager) fillSlots(ws *warmSlots) {
	defer m.discardAllSlots(ws)
	retry := m.opts.PoolRetry
	recycle := time.NewTicker(ws.maxAge / 2)
	defer recycle.Stop()
	var holdUntil time.Time
	for m.ctx.Err() == nil {
		m.recycleSlots(ws)
		m.trimSlots(ws)
		m.mu.Lock()
		now := time.Now()
		needDefault, needEgress := ws.want-ws.countLocked(ws.key), 0
		if ws.egressWantedLocked(now) {
			needEgress = ws.want - ws.countLocked(ws.egressKey)
		}
		egress := needEgress > 0 && (needDefault <= 0 || ws.egressFirst)
		need, hold := max(needDefault, 0)+max(needEgress, 0), ws.holdLocked(now)
		if need > 0 && !m.slotRoomLocked(ws.memoryBytes) {
			need = 0 // the host is at its admission limits: a delete wakes the filler
		}
		if need <= 0 || hold == 0 {
			ws.demand = false // served by the precreate below, or moot
		}
		m.mu.Unlock()
		if need > 0 && m.holdRefill(now, hold, &holdUntil, ws.kick) {
			continue
		}
		holdUntil = time.Time{}
		if need <= 0 {
			m.idle(ws.kick, recycle.C)
			continue
		}
		if err := m.precreateSlot(ws, egress); err != nil {
			if m.ctx.Err() != nil {
				return
			}
			m.log.Warn("warm slot precreate failed", "err", err, "retry_in", retry)
			retry = m.backoff(retry)
			continue
		}
		retry = m.opts.PoolRetry
	}
}

// precreateSlot precreates one slot and makes it ready.
func (m *Manager) precreateSlot(ws *warmSlots, egress bool) error {
	spec := m.slotSpec(egress)
	// Like a boot's create, a precreate runs to completion even when Close
	// interrupts it: the filler then discards a whole sandbox instead of
	// leaving the runtime to unwind half of one.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(m.ctx), slotOpTimeout)
	defer cancel()
	start := time.Now()
	err := ws.pc.Precreate(ctx, spec)
	m.metrics.RuntimeCall.WithLabelValues("precreate", errgrpc.Code(err).String()).Observe(time.Since(start).Seconds())
	if err != nil {
		return err
	}
	m.mu.Lock()
	ws.ready = append(ws.ready, warmSlot{spec: spec, key: slotKey(spec), at: time.Now()})
	if egress {
		ws.egressFirst = false
	}
	m.metrics.WarmSlots.Set(float64(len(ws.ready)))
	m.mu.Unlock()
	return nil
}

// Slots and admission: a slot is not a sandbox, and a create is admitted
// against the sandboxes alone (a matching create turns a slot into one). So
// that taking the slots never passes the host's admission limits, a slot is
// precreated only while the sandboxes and every slot, the new one included,
// fit; and when creates that took no slot fill the host, the slots beyond
// its limits are discarded (boot slots first: fork slots are worth more).

// slotsUsageLocked is what the ready slots would hold as sandboxes.
func (m *Manager) slotsUsageLocked() limits.Usage {
	var u limits.Usage
	if m.slots == nil {
		return u
	}
	for _, s := range m.slots.ready {
		u = u.Add(limits.Usage{Sandboxes: 1, MemoryBytes: s.spec.MemoryBytes})
	}
	if fs := m.slots.forks; fs != nil {
		for _, slots := range fs.ready {
			for _, s := range slots {
				u = u.Add(limits.Usage{Sandboxes: 1, MemoryBytes: s.spec.MemoryBytes})
			}
		}
	}
	return u
}

// slotRoomLocked reports whether one more slot with this memory limit fits
// beside the sandboxes and the other slots.
func (m *Manager) slotRoomLocked(memoryBytes int64) bool {
	held := m.heldLocked().Add(m.slotsUsageLocked())
	return m.opts.Limits.Admit(held, limits.Usage{Sandboxes: 1, MemoryBytes: memoryBytes}) == nil
}

// trimSlots discards slots while the sandboxes and the slots together pass
// the host's admission limits.
func (m *Manager) trimSlots(ws *warmSlots) {
	for {
		var id string
		m.mu.Lock()
		if m.opts.Limits.Admit(m.heldLocked(), m.slotsUsageLocked()) == nil {
			m.mu.Unlock()
			return
		}
		if n := len(ws.ready); n > 0 {
			id = ws.ready[0].spec.ID
			ws.ready = ws.ready[1:]
			m.metrics.WarmSlots.Set(float64(len(ws.ready)))
		} else if fs := ws.forks; fs != nil {
			for ck, slots := range fs.ready {
				id = slots[0].spec.ID
				if fs.ready[ck] = slots[1:]; len(fs.ready[ck]) == 0 {
					delete(fs.ready, ck)
				}
				break
			}
		}
		m.mu.Unlock()
		if id == "" {
			return
		}
		m.discardSlot(id)
	}
}

// memoryOf is the memory limit a sandbox with limits r gets (a checkpoint
// taken before limits existed has none recorded: the default applies).
func (m *Manager) memoryOf(r *controldv1.Resources) int64 {
	if b := r.GetMemoryBytes(); b > 0 {
		return b
	}
	return m.opts.Limits.Default.GetMemoryBytes()
}

// wakeSlots wakes the slot fillers (a sandbox went: there may be room).
func (m *Manager) wakeSlots() {
	m.mu.Lock()
	ws := m.slots
	m.mu.Unlock()
	if ws == nil {
		return
	}
	ws.wake()
	if ws.forks != nil {
		ws.forks.wake()
	}
}

// recycleSlots discards slots past their age.
func (m *Manager) recycleSlots(ws *warmSlots) {
	now := time.Now()
	var old []string
	m.mu.Lock()
	keep := ws.ready[:0]
	egressWanted := ws.egressWantedLocked(now)
	for _, s := range ws.ready {
		if now.Sub(s.at) >= ws.maxAge || (s.key == ws.egressKey && !egressWanted) {
			old = append(old, s.spec.ID)
		} else {
			keep = append(keep, s)
		}
	}
	ws.ready = keep
	m.metrics.WarmSlots.Set(float64(len(ws.ready)))
	m.mu.Unlock()
	for _, id := range old {
		m.discardSlot(id)
	}
}

// discardAllSlots discards every ready slot (at Close). Takes are refused
// by then (the manager is closed), so none is handed out meanwhile.
func (m *Manager) discardAllSlots(ws *warmSlots) {
	m.mu.Lock()
	left := ws.ready
	ws.ready = nil
	m.metrics.WarmSlots.Set(0)
	m.mu.Unlock()
	for _, s := range left {
		m.discardSlot(s.spec.ID)
	}
}

// discardSlot removes a precreated sandbox that will not be booted.
func (m *Manager) discardSlot(id string) {
	m.mu.Lock()
	ws := m.slots
	m.mu.Unlock()
	if ws == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(m.ctx), slotOpTimeout)
	defer cancel()
	start := time.Now()
	err := ws.pc.Discard(ctx, id)
	m.metrics.RuntimeCall.WithLabelValues("discard", errgrpc.Code(err).String()).Observe(time.Since(start).Seconds())
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		// The runtime's own Close, or reconciliation at the next start (a
		// container without a record), removes it.
		m.log.Error("discard warm slot", "sandbox", id, "err", err)
	}
}

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
	// forkSlotCheckpoints bounds how many checkpoints keep fork slots (each
	// slot holds a shim and a snapshot on the checkpoint's layer).
	forkSlotCheckpoints = 2
	// forkSlotPrune is how often the filler looks for slots whose
	// checkpoint was deleted: until discarded such a slot keeps the
	// checkpoint's (unrooted) layer alive.
	forkSlotPrune = 2 * time.Second
)

type forkSlots struct {
	rp   runtime.RestorePrecreator
	want int // slots per checkpoint
	kick chan struct{}

	// Guarded by Manager.mu.
	ready map[string][]forkSlot // checkpoint id -> its slots
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

// forkSlotsLocked returns the manager's fork slots, or nil when they are off.
func (m *Manager) forkSlotsLocked() *forkSlots {
	if m.slots == nil {
		return nil
	}
	return m.slots.forks
}

// forkSlotsBegin records that a fork of ckID starts: ckID becomes the most
// recent checkpoint, and refills hold off until forkSlotsEnd.
func (m *Manager) forkSlotsBegin(ckID string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if fs := m.forkSlotsLocked(); fs != nil {
		fs.touchLocked(ckID)
		fs.forking++
	}
}

// forkSlotsExpect makes a new checkpoint the most recent one, so its first
// on-demand fork finds a slot too (CreateCheckpoint calls it once the
// checkpoint is committed).
func (m *Manager) forkSlotsExpect(ckID string) {
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
		fs.recent = slices.Delete(fs.recent, 0, n)
	}
}

// forkSlotsEnd reports that a fork begun with forkSlotsBegin has settled.
func (m *Manager) forkSlotsEnd() {
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
func (m *Manager) takeForkSlotLocked(ckID string, spec runtime.BootSpec) *forkSlot {
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

func (fs *forkSlots) holdLocked(now time.Time) time.Duration {
	if fs.forking > 0 {
		return slotRefillHold // forkSlotsEnd wakes the filler earlier
	}
	return max(fs.quietUntil.Sub(now), 0)
}

// forkSlotNeededLocked returns the most recent checkpoint short of slots, or nil.
func (m *Manager) forkSlotNeededLocked(fs *forkSlots) *store.CheckpointRecord {
	for i := len(fs.recent) - 1; i >= 0; i-- {
		id := fs.recent[i]
		if ck, ok := m.checkpoints[id]; ok && len(fs.ready[id]) < fs.want {
			return ck
		}
	}
	return nil
}

// fillForkSlots keeps the recent checkpoints' fork slots filled until the
// manager closes, then discards them. Like fillSlots it precreates one at a
// time and holds off while forks run and briefly after.
func (m *Manager) fillForkSlots(ws *warmSlots, fs *forkSlots) {
	defer m.pruneForkSlots(ws, fs, true)
	prune := time.NewTicker(forkSlotPrune)
	defer prune.Stop()
	retry := m.opts.PoolRetry
	var holdUntil time.Time
	for m.ctx.Err() == nil {
		m.pruneForkSlots(ws, fs, false)
		m.trimSlots(ws)
		m.mu.Lock()
		now := time.Now()
		ck, hold := m.forkSlotNeededLocked(fs), fs.holdLocked(now)
		if ck != nil && !m.slotRoomLocked(m.memoryOf(ck.Checkpoint.GetResources())) {
			ck = nil // at the host's admission limits: a delete wakes the filler
		}
		m.mu.Unlock()
		if ck != nil && m.holdRefill(now, hold, &holdUntil, fs.kick) {
			continue
		}
		holdUntil = time.Time{}
		if ck == nil {
			m.idle(fs.kick, prune.C)
			continue
		}
		if err := m.precreateForkSlot(fs, ck); err != nil {
			if m.ctx.Err() != nil {
				return
			}
			if !m.checkpointExists(ck.Checkpoint.GetId()) {
				// Deleted while its slot was made (its layer or images went
				// under the precreate): nothing failed, and backing off would
				// hold off the next checkpoints' slots, whose forks then
				// restore cold (seconds of backoff in a benchmark that
				// checkpoints, forks and deletes in a row).
				m.log.Debug("fork slot dropped: its checkpoint was deleted", "checkpoint", ck.Checkpoint.GetId(), "err", err)
				continue
			}
			m.log.Warn("fork slot precreate failed", "checkpoint", ck.Checkpoint.GetId(), "err", err, "retry_in", retry)
			retry = m.backoff(retry)
			continue
		}
		retry = m.opts.PoolRetry
	}
}

// checkpointExists reports whether checkpoint id is still recorded.
func (m *Manager) checkpointExists(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.checkpoints[id]
	return ok
}

// precreateForkSlot precreates one fork of ck, drawn as ForkCheckpoint
// draws a replica, and makes it ready unless ck stopped needing it.
func (m *Manager) precreateForkSlot(fs *forkSlots, ck *store.CheckpointRecord) error {
	rec, err := m.newRecord(forkSandboxParams(ck, forkParams{policy: ck.Checkpoint.GetNetwork().GetPolicy()}), time.Now())
	if err != nil {
		return err
	}
	spec := specOf(rec)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(m.ctx), slotOpTimeout)
	defer cancel()
	start := time.Now()
	err = fs.rp.PrecreateRestore(ctx, spec, ck.Ref)
	m.metrics.RuntimeCall.WithLabelValues("precreate_restore", errgrpc.Code(err).String()).Observe(time.Since(start).Seconds())
	if err != nil {
		return err
	}
	id := ck.Checkpoint.GetId()
	m.mu.Lock()
	_, exists := m.checkpoints[id]
	keep := exists && m.ctx.Err() == nil && slices.Contains(fs.recent, id) && len(fs.ready[id]) < fs.want
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
func (m *Manager) dropForkSlots(ckID string) {
	m.mu.Lock()
	fs := m.forkSlotsLocked()
	var drop []forkSlot
	if fs != nil {
		drop = fs.ready[ckID]
		delete(fs.ready, ckID)
		fs.recent = slices.DeleteFunc(fs.recent, func(id string) bool { return id == ckID })
	}
	m.mu.Unlock()
	for _, s := range drop {
		m.discardSlot(s.spec.ID)
	}
}

// pruneForkSlots discards the fork slots of deleted or no longer recent
// checkpoints and those past their age; all of them when all is set.
func (m *Manager) pruneForkSlots(ws *warmSlots, fs *forkSlots, all bool) {
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
	m.mu.Unlock()
	for _, id := range drop {
		m.discardSlot(id)
	}
}

// idle waits, in a slot filler with nothing to do, for a kick, the
// filler's tick or the manager's end (the filler checks which).
func (m *Manager) idle(kick <-chan struct{}, tick <-chan time.Time) {
	select {
	case <-m.ctx.Done():
	case <-kick:
	case <-tick:
	}
}

// backoff waits retry after a failed precreate (less when the manager ends)
// and returns the next, longer delay.
func (m *Manager) backoff(retry time.Duration) time.Duration {
	t := time.NewTimer(retry)
	defer t.Stop()
	select {
	case <-m.ctx.Done():
	case <-t.C:
	}
	return min(2*retry, slotRetryMax)
}

// holdRefill waits while a refill is held off (hold > 0: requests are in
// flight or just ended), at most slotRefillHold from the first wait of this
// refill (*holdUntil), waking early on kick or shutdown. It reports whether
// it waited, so the filler re-evaluates before precreating.
func (m *Manager) holdRefill(now time.Time, hold time.Duration, holdUntil *time.Time, kick <-chan struct{}) bool {
	if hold <= 0 {
		return false
	}
	if holdUntil.IsZero() {
		*holdUntil = now.Add(slotRefillHold)
	}
	wait := min(hold, holdUntil.Sub(now))
	if wait <= 0 {
		return false
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-m.ctx.Done():
	case <-kick:
	case <-t.C:
	}
	return true
}
