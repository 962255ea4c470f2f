package fleet

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/store"
)

// heldDialTimeout bounds the dial of the session a frozen member keeps.
const heldDialTimeout = 5 * time.Second

// heldSessions are admin sessions to the frozen members of a checkpoint
// pool, opened while the member still ran and kept open across its freeze
// (neither side has idle timers, so a frozen peer is no problem). A claim
// pings over its member's session right after the thaw: one round trip,
// where a fresh session costs a connect, a WebSocket upgrade and a Hello on
// a guestd that is just waking up. Sessions are lost with controld; a claim
// then dials as before.
type heldSessions struct {
	mu sync.Mutex
	m  map[string]Guest
}

func (h *heldSessions) put(id string, g Guest) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = map[string]Guest{}
	}
	if old := h.m[id]; old != nil {
		go old.Close()
	}
	h.m[id] = g
}

// take removes and returns the session held for id, or nil.
func (h *heldSessions) take(id string) Guest {
	h.mu.Lock()
	defer h.mu.Unlock()
	g := h.m[id]
	delete(h.m, id)
	return g
}

// keepOnly closes the sessions of sandboxes other than members (deleted,
// or claimed without one). Closing waits for the peer's close frame
// (bounded), so it runs in the background.
func (h *heldSessions) keepOnly(members []*sandbox) {
	live := make(map[string]bool, len(members))
	for _, sb := range members {
		live[sb.rec.Sandbox.GetId()] = true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, g := range h.m {
		if !live[id] {
			delete(h.m, id)
			go g.Close()
		}
	}
}

func (h *heldSessions) closeAll() {
	h.keepOnly(nil)
}

// pooledLocked returns p's members that are not being deleted, including
// the ones a claim in flight reserved (it takes their session next).
func (m *pooler) pooledLocked(p *pool) []*sandbox {
	var out []*sandbox
	for _, sb := range m.sandboxes {
		if sb.rec.Pooled && sb.rec.Sandbox.PoolId == p.rec.Pool.Id && !sb.deleting {
			out = append(out, sb)
		}
	}
	return out
}

// freezeWarm turns a verified, running checkpoint-pool replica into a warm
// member: it opens the session a claim will ping over, freezes the replica
// and records it SUSPENDED. A replica that cannot be is deleted.
func (m *pooler) freezeWarm(ctx context.Context, p *pool, id string) error {
	m.mu.Lock()
	sb, ok := m.sandboxes[id]
	m.mu.Unlock()
	if !ok {
		return fmt.Errorf("warm replica %s: %w", id, sandboxNotFound(id))
	}
	err := m.freezeMember(ctx, p, sb)
	if err == nil {
		return nil
	}
	if derr := m.deleteSandbox(m.ctx, sb, "pool freeze failed: "+err.Error()); derr != nil {
		m.log.Error("remove pool replica that could not be frozen", "sandbox", id, "err", derr)
	}
	return fmt.Errorf("warm replica %s: %w", id, err)
}

func (m *pooler) freezeMember(ctx context.Context, p *pool, sb *sandbox) error {
	sb.op.Lock()
	defer sb.op.Unlock()
	m.mu.Lock()
	id, sock, admin := sb.rec.Sandbox.GetId(), sb.rec.ACISocket, sb.rec.AdminToken
	deleting := sb.deleting
	m.mu.Unlock()
	if deleting {
		return sandboxNotFound(id)
	}
	dctx, cancel := context.WithTimeout(ctx, heldDialTimeout)
	g, err := m.dialGuest(dctx, sock, admin)
	cancel()
	if err != nil {
		return fmt.Errorf("session to keep: %w", err)
	}
	// A frozen member should hold state, not scratch: guestd's capture
	// segments are shared memory KSM cannot merge (4 MB of each member's
	// PSS). Best effort: a member with them is still a good member.
	rctx, cancel := context.WithTimeout(ctx, heldDialTimeout)
	if err := g.ReleaseScratch(rctx); err != nil {
		m.log.Warn("pool member keeps its scratch memory", "sandbox", id, "err", err)
	}
	cancel()
	if err := m.rt.Freeze(ctx, id); err != nil {
		go g.Close()
		return fmt.Errorf("freeze: %w", err)
	}
	// Held before the record says SUSPENDED: from then on a claim may take it.
	p.held.put(id, g)
	if _, err := m.update(sb, controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_STATE, nil, func(r *store.SandboxRecord) {
		r.Sandbox.State = controldv1.SandboxState_SANDBOX_STATE_SUSPENDED
	}); err != nil {
		if g := p.held.take(id); g != nil {
			go g.Close()
		}
		return err
	}
	return nil
}

// removeStrays deletes unclaimed members of a frozen pool that run: a
// crash between a warm-up's verification and its freeze leaves one; and
// stopped ones of any pool: a crash between an image pool's checkpoint of
// its source (which stops it) and that source's delete leaves one. Only
// the replenisher calls this, between warm-up rounds, so its own warm-ups
// are never in that state here.
func (m *pooler) removeStrays(ctx context.Context, p *pool) {
	frozen := p.rec.Pool.GetFrozen()
	m.mu.Lock()
	var strays []*sandbox
	for _, sb := range m.sandboxes {
		if !sb.rec.Pooled || sb.rec.Sandbox.PoolId != p.rec.Pool.Id || sb.deleting || sb.claimed {
			continue
		}
		switch sb.rec.Sandbox.State {
		case controldv1.SandboxState_SANDBOX_STATE_READY:
			if frozen {
				strays = append(strays, sb)
			}
		case controldv1.SandboxState_SANDBOX_STATE_STOPPED:
			strays = append(strays, sb)
		}
	}
	m.mu.Unlock()
	for _, sb := range strays {
		err := m.deleteSandbox(ctx, sb, "pool member found running (frozen pool) or stopped")
		if err != nil && !errors.Is(err, context.Canceled) {
			m.log.Error("remove running member of a frozen pool", "sandbox", sb.rec.Sandbox.GetId(), "err", err)
		}
	}
}
