package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// Precreator is an optional Runtime extension: a runtime that can create a
// sandbox ahead of its request (snapshot, container and task made, task not
// started) implements it, and the manager finds it with a type assertion.
// Without it, warm slots are off.
type Precreator interface {
	// Precreate does everything Boot(spec) does except starting the task. A
	// later Boot with an identical spec only starts it; a Boot with another
	// spec for the same id removes it and boots normally.
	Precreate(ctx context.Context, spec BootSpec) error
	// Discard removes a sandbox precreated and never booted. It never
	// touches a booted sandbox: an id that is not precreated is
	// errdefs.ErrNotFound.
	Discard(ctx context.Context, id string) error
}

func precreatorOf(rt Runtime) (Precreator, bool) {
	if u, ok := rt.(interface{ Unwrap() Runtime }); ok {
		rt = u.Unwrap()
	}
	pc, ok := rt.(Precreator)
	return pc, ok
}

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
	pc     Precreator
	want   int
	maxAge time.Duration
	kick   chan struct{}
	key    string // slotKey of every slot's spec (fixed: the defaults)

	// Guarded by Manager.mu.
	ready      []warmSlot
	booting    int       // slot-born boots not yet usable (or failed)
	quietUntil time.Time // end of the quiet time after the last of them
	// demand: a matching create found no slot; refill without holding.
	demand bool
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
	spec BootSpec
	at   time.Time
}

// slotKey identifies what a boot produces, identity aside: two specs with
// the same key differ only in id and tokens.
func slotKey(s BootSpec) string {
	s.ID, s.ACIToken, s.AdminToken, s.Labels = "", "", "", nil
	b, err := json.Marshal(s)
	if err != nil {
		panic(err) // plain data always marshals
	}
	return string(b)
}

// slotSpec draws a new slot: the spec of a default CreateSandbox, with a
// fresh id and tokens.
func (m *Manager) slotSpec() BootSpec {
	return specOf(m.newRecord(sandboxParams{}, time.Now()))
}

// startSlots starts the slot filler when slots are configured and the
// runtime can precreate.
func (m *Manager) startSlots() {
	if m.opts.WarmSlots <= 0 {
		return
	}
	pc, ok := precreatorOf(m.rt)
	if !ok {
		m.log.Info("runtime cannot precreate sandboxes; warm slots are off")
		return
	}
	ws := &warmSlots{pc: pc, want: m.opts.WarmSlots, maxAge: m.opts.WarmSlotMaxAge, kick: make(chan struct{}, 1)}
	ws.key = slotKey(m.slotSpec())
	m.mu.Lock()
	m.slots = ws
	m.mu.Unlock()
	m.goBackground(func() { m.fillSlots(ws) })
}

// takeSlotLocked hands out a ready slot whose spec matches spec, or nil.
// The caller adopts the slot's id and tokens, so the runtime sees an
// identical spec, and calls slotBootDone when that boot has settled: the
// refill waits for it (at most slotRefillHold), off the request path.
func (m *Manager) takeSlotLocked(spec BootSpec) *warmSlot {
	ws := m.slots
	if ws == nil {
		return nil
	}
	if slotKey(spec) != ws.key {
		m.metrics.BootSlots.WithLabelValues(slotMismatch).Inc()
		return nil
	}
	now := time.Now()
	for i, s := range ws.ready {
		if now.Sub(s.at) >= ws.maxAge {
			continue // the filler recycles it
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
	for {
		m.recycleSlots(ws)
		m.mu.Lock()
		now := time.Now()
		need, hold := ws.want-len(ws.ready), ws.holdLocked(now)
		if need <= 0 || hold == 0 {
			ws.demand = false // served by the precreate below, or moot
		}
		m.mu.Unlock()
		if m.ctx.Err() != nil {
			return
		}
		if need > 0 && hold > 0 {
			if holdUntil.IsZero() {
				holdUntil = now.Add(slotRefillHold)
			}
			if wait := min(hold, holdUntil.Sub(now)); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-m.ctx.Done():
				case <-ws.kick:
				case <-t.C:
				}
				t.Stop()
				continue
			}
		}
		holdUntil = time.Time{}
		if need <= 0 {
			select {
			case <-m.ctx.Done():
				return
			case <-ws.kick:
			case <-recycle.C:
			}
			continue
		}
		if err := m.precreateSlot(ws); err != nil {
			if m.ctx.Err() != nil {
				return
			}
			m.log.Warn("warm slot precreate failed", "err", err, "retry_in", retry)
			select {
			case <-m.ctx.Done():
				return
			case <-time.After(retry):
			}
			retry = min(2*retry, slotRetryMax)
			continue
		}
		retry = m.opts.PoolRetry
	}
}

// precreateSlot precreates one slot and makes it ready.
func (m *Manager) precreateSlot(ws *warmSlots) error {
	spec := m.slotSpec()
	// Like a boot's create, a precreate runs to completion even when Close
	// interrupts it: the filler then discards a whole sandbox instead of
	// leaving the runtime to unwind half of one.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(m.ctx), slotOpTimeout)
	defer cancel()
	start := time.Now()
	err := ws.pc.Precreate(ctx, spec)
	m.metrics.RuntimeCall.WithLabelValues("precreate", errdefs.Code(err).String()).Observe(time.Since(start).Seconds())
	if err != nil {
		return err
	}
	m.mu.Lock()
	ws.ready = append(ws.ready, warmSlot{spec: spec, at: time.Now()})
	m.metrics.WarmSlots.Set(float64(len(ws.ready)))
	m.mu.Unlock()
	return nil
}

// recycleSlots discards slots past their age.
func (m *Manager) recycleSlots(ws *warmSlots) {
	now := time.Now()
	var old []string
	m.mu.Lock()
	keep := ws.ready[:0]
	for _, s := range ws.ready {
		if now.Sub(s.at) >= ws.maxAge {
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
	m.metrics.RuntimeCall.WithLabelValues("discard", errdefs.Code(err).String()).Observe(time.Since(start).Seconds())
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		// The runtime's own Close, or reconciliation at the next start (a
		// container without a record), removes it.
		m.log.Error("discard warm slot", "sandbox", id, "err", err)
	}
}
