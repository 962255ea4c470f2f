package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/errdefs/errgrpc"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/limits"
	"github.com/forkfleet/forkfleet/controld/internal/network"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
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
	// defaultSlotMaxAge is how long a slot waits before it is recycled.
	defaultSlotMaxAge = 10 * time.Minute
	// slotImageCheck is how often the filler asks what the default image's
	// name names now: a slot boots the build it was precreated from, so
	// slots of a build the name no longer names (an image re-imported
	// under it) are discarded and made again from the new one.
	slotImageCheck = 2 * time.Second
)

// Slot outcomes of a create (the result label of BootSlots).
const (
	slotHit      = "hit"      // took a slot
	slotEmpty    = "empty"    // matching spec, no slot ready: cold boot
	slotMismatch = "mismatch" // spec differs from the slots': cold boot
)

// warmer is the warm slots concern: the entry points a create or a fork
// takes a slot through (start, take, boot done, wake, discard, the
// admission checks; warmslots.go, forkslots.go), over the fillers
// warmSlots and forkSlots.
type warmer struct {
	*registry
	slots *warmSlots // nil: warm slots off; set once at start, under mu
	// A slot is a sandbox record in waiting, admitted with the others.
	*sandboxer
}

// warmSlots are the precreated boots: their filler and its steps (fill,
// precreate, trim, recycle, discardAll) are methods of their own, over the
// warmer (m; their ready slots are guarded by the registry's mu).
type warmSlots struct {
	m      *warmer
	pc     runtime.Precreator
	want   int
	maxAge time.Duration
	kick   chan struct{}
	key    string // slotKey of the default slots' spec (fixed: the defaults)
	image  string // the default image's name
	// imageNow is the digest the image's name named when the filler last
	// asked (at imageAsked): at most every slotImageCheck, not at every
	// wake of a burst of creates. The filler's only.
	imageNow   string
	imageAsked time.Time
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

// holdLocked says how much longer a refill should wait (0: go now): while
// boots that took slots come up and briefly after, and while pool claims
// arrive (the fill bounds the wait, holdRefill).
func (ws *warmSlots) holdLocked(now time.Time) time.Duration {
	switch {
	case ws.demand:
		return 0
	case ws.booting > 0:
		return slotRefillHold // slotBootDone wakes the filler earlier
	}
	return max(ws.quietUntil.Sub(now), ws.m.claims.quietIn(poolQuiet), 0)
}

type warmSlot struct {
	spec runtime.BootSpec
	key  string // slotKey(spec)
	at   time.Time
	// digest is the manifest digest spec.Image named just before the
	// precreate ("": unknown, then only its age recycles it).
	digest string
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
func (m *warmer) slotSpec(egress bool) runtime.BootSpec {
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
func (m *warmer) startSlots() {
	if m.opts.WarmSlots <= 0 {
		return
	}
	pc, ok := runtime.As[runtime.Precreator](m.rt)
	if !ok {
		m.log.Info("runtime cannot precreate sandboxes; warm slots are off")
		return
	}
	ws := &warmSlots{m: m, pc: pc, want: m.opts.WarmSlots, maxAge: m.opts.WarmSlotMaxAge, kick: make(chan struct{}, 1)}
	spec := m.slotSpec(false)
	ws.key, ws.memoryBytes, ws.image = slotKey(spec), spec.MemoryBytes, spec.Image
	// Egress slots are made only once an egress create succeeded (which
	// makes this controld the owner of the host's table).
	if _, ok := runtime.As[runtime.Networker](m.rt); ok {
		ws.egressKey = slotKey(m.slotSpec(true))
	}
	if rp, ok := pc.(runtime.RestorePrecreator); ok {
		ws.forks = &forkSlots{m: m, ws: ws, rp: rp, want: m.opts.WarmSlots, kick: make(chan struct{}, 1), ready: map[string][]forkSlot{}, forked: map[string]int{}, lazy: map[string]bool{},
			stale: map[string][]forkSlot{}}
	}
	m.mu.Lock()
	m.slots = ws
	if ws.forks != nil {
		ws.forks.seedLocked() // the checkpoints' records are loaded (reconcile)
	}
	m.mu.Unlock()
	m.goBackground(ws.fill)
	if ws.forks != nil {
		m.goBackground(ws.forks.fill)
	}
}

// takeSlotLocked hands out a ready slot whose spec matches spec, or nil.
// The caller adopts the slot's id and tokens, so the runtime sees an
// identical spec, and calls slotBootDone when that boot has settled: the
// refill waits for it (at most slotRefillHold), off the request path.
func (m *warmer) takeSlotLocked(spec runtime.BootSpec) *warmSlot {
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
func (m *warmer) slotBootDone() {
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

// fill keeps ws at its size until the manager closes, then discards
// what is left. It precreates one slot at a time, and holds off (for at
// most slotRefillHold) while a boot that took a slot is still coming up and
// briefly after: precreating competes for the same CPUs as the boots it
// serves. A create that found no slot ends the hold.
func (ws *warmSlots) fill() {
	m := ws.m
	defer ws.discardAll()
	retry := m.opts.PoolRetry
	recycle := time.NewTicker(min(ws.maxAge/2, slotImageCheck))
	defer recycle.Stop()
	var holdUntil time.Time
	for m.ctx.Err() == nil {
		ws.recycle()
		ws.trim()
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
		if need > 0 && holdRefill(m.ctx, now, hold, &holdUntil, ws.kick) {
			continue
		}
		holdUntil = time.Time{}
		if need <= 0 {
			idle(m.ctx, ws.kick, recycle.C)
			continue
		}
		if err := ws.precreate(egress); err != nil {
			if m.ctx.Err() != nil {
				return
			}
			m.log.Warn("warm slot precreate failed", "err", err, "retry_in", retry)
			retry = backoff(m.ctx, retry)
			continue
		}
		retry = m.opts.PoolRetry
	}
}

// precreate precreates one slot and makes it ready.
func (ws *warmSlots) precreate(egress bool) error {
	m := ws.m
	spec := m.slotSpec(egress)
	// Like a boot's create, a precreate runs to completion even when Close
	// interrupts it: the filler then discards a whole sandbox instead of
	// leaving the runtime to unwind half of one.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(m.ctx), slotOpTimeout)
	defer cancel()
	// Asked before the precreate: a move in between makes the slot look
	// older than it is, and the next check discards it.
	digest := m.imageDigestNow(ctx, ws.image)
	ws.imageNow, ws.imageAsked = digest, time.Now()
	start := time.Now()
	err := ws.pc.Precreate(ctx, spec)
	m.metrics.RuntimeCall.WithLabelValues("precreate", errgrpc.Code(err).String()).Observe(time.Since(start).Seconds())
	if err != nil {
		return err
	}
	m.mu.Lock()
	ws.ready = append(ws.ready, warmSlot{spec: spec, key: slotKey(spec), at: time.Now(), digest: digest})
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
func (m *warmer) slotsUsageLocked() limits.Usage {
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
		for _, slots := range fs.stale {
			for _, s := range slots {
				u = u.Add(limits.Usage{Sandboxes: 1, MemoryBytes: s.spec.MemoryBytes})
			}
		}
	}
	return u
}

// slotRoomLocked reports whether one more slot with this memory limit fits
// beside the sandboxes and the other slots.
func (m *warmer) slotRoomLocked(memoryBytes int64) bool {
	held := m.heldLocked().Add(m.slotsUsageLocked())
	return m.opts.Limits.Admit(held, limits.Usage{Sandboxes: 1, MemoryBytes: memoryBytes}) == nil
}

// trim discards slots while the sandboxes and the slots together pass
// the host's admission limits.
func (ws *warmSlots) trim() {
	m := ws.m
	for {
		var id string
		m.mu.Lock()
		if m.opts.Limits.Admit(m.heldLocked(), m.slotsUsageLocked()) == nil {
			m.mu.Unlock()
			return
		}
		if id = ws.forks.takeStaleLocked(); id != "" {
			// a fork slot of the other restore mode: going anyway
		} else if n := len(ws.ready); n > 0 {
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
func (m *warmer) memoryOf(r *controldv1.Resources) int64 {
	if b := r.GetMemoryBytes(); b > 0 {
		return b
	}
	return m.opts.Limits.Default.GetMemoryBytes()
}

// wakeSlots wakes the slot fillers (a sandbox went: there may be room).
func (m *warmer) wakeSlots() {
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

// recycle discards slots past their age, and those of a build the default
// image's name no longer names.
func (ws *warmSlots) recycle() {
	m := ws.m
	m.mu.Lock()
	haveSlots := len(ws.ready) > 0
	m.mu.Unlock()
	if haveSlots && time.Since(ws.imageAsked) >= slotImageCheck {
		ctx, cancel := context.WithTimeout(m.ctx, slotOpTimeout)
		ws.imageNow, ws.imageAsked = m.imageDigestNow(ctx, ws.image), time.Now()
		cancel()
	}
	current := ws.imageNow
	now := time.Now()
	var old []string
	m.mu.Lock()
	keep := ws.ready[:0]
	egressWanted := ws.egressWantedLocked(now)
	for _, s := range ws.ready {
		moved := current != "" && s.digest != "" && s.digest != current
		if moved || now.Sub(s.at) >= ws.maxAge || (s.key == ws.egressKey && !egressWanted) {
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

// discardAll discards every ready slot (at Close). Takes are refused
// by then (the manager is closed), so none is handed out meanwhile.
func (ws *warmSlots) discardAll() {
	m := ws.m
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
func (m *warmer) discardSlot(id string) {
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

// idle waits, in a slot filler with nothing to do, for a kick, the
// filler's tick or the manager's end (the filler checks which).
func idle(ctx context.Context, kick <-chan struct{}, tick <-chan time.Time) {
	select {
	case <-ctx.Done():
	case <-kick:
	case <-tick:
	}
}

// backoff waits retry after a failed precreate (less when the manager ends)
// and returns the next, longer delay.
func backoff(ctx context.Context, retry time.Duration) time.Duration {
	t := time.NewTimer(retry)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	return min(2*retry, slotRetryMax)
}

// holdRefill waits while a refill is held off (hold > 0: requests are in
// flight or just ended), at most slotRefillHold from the first wait of this
// refill (*holdUntil), waking early on kick or shutdown. It reports whether
// it waited, so the filler re-evaluates before precreating.
func holdRefill(ctx context.Context, now time.Time, hold time.Duration, holdUntil *time.Time, kick <-chan struct{}) bool {
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
	case <-ctx.Done():
	case <-kick:
	case <-t.C:
	}
	return true
}
