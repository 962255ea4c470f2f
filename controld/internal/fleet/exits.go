package fleet

import (
	"fmt"
	"time"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/store"
)

// watchExits marks sandboxes whose task ended on its own.
func (m *sandboxer) watchExits(exits <-chan runtime.Exit) {
	alive := m.opts.Health.Loop("exit watcher", loopBound)
	defer alive.Done()
	// Exits are rare: the ticker proves the loop is not stuck in one.
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
			alive.Beat()
		case ex, ok := <-exits:
			if !ok {
				return
			}
			m.handleExit(ex)
			alive.Beat()
		}
	}
}

func (m *sandboxer) handleExit(ex runtime.Exit) {
	m.mu.Lock()
	sb, ok := m.sandboxes[ex.ID]
	if !ok || sb.deleting {
		m.mu.Unlock()
		return
	}
	state, pooled, cancelWork := sb.rec.Sandbox.State, sb.rec.Pooled, sb.cancelWork
	m.mu.Unlock()
	msg := fmt.Sprintf("task exited with status %d at %s", ex.Status, ex.ExitedAt.UTC().Format(time.RFC3339Nano)) + m.limitsOnExit(sb)
	if pooled {
		// A warm sandbox that died is worthless: remove it and refill.
		m.goBackground(func() {
			if err := m.deleteSandbox(m.ctx, sb, msg); err != nil {
				m.log.Error("remove exited pooled sandbox", "sandbox", ex.ID, "err", err)
			}
		})
		return
	}
	if cancelWork != nil {
		cancelWork()
	}
	newState := controldv1.SandboxState_SANDBOX_STATE_STOPPED
	if state == controldv1.SandboxState_SANDBOX_STATE_CREATING || state == controldv1.SandboxState_SANDBOX_STATE_BOOTING {
		newState = controldv1.SandboxState_SANDBOX_STATE_FAILED
		msg = "during boot: " + msg
	}
	if state == controldv1.SandboxState_SANDBOX_STATE_STOPPED || state == controldv1.SandboxState_SANDBOX_STATE_FAILED {
		return
	}
	if _, err := m.update(sb, controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_STATE, nil, func(r *store.SandboxRecord) {
		r.Sandbox.State = newState
		r.Sandbox.StatusMessage = msg
	}); err != nil {
		m.log.Error("persist exited sandbox", "sandbox", ex.ID, "err", err)
	}
	closeOnce(sb.settled)
}

// reapLoop deletes sandboxes past their TTL.
func (m *sandboxer) reapLoop() {
	alive := m.opts.Health.Loop("ttl reaper", max(loopBound, 10*m.opts.ReapInterval))
	defer alive.Done()
	t := time.NewTicker(m.opts.ReapInterval)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case now := <-t.C:
			m.reapOnce(now)
			alive.Beat()
		}
	}
}

func (m *sandboxer) reapOnce(now time.Time) {
	m.mu.Lock()
	for id, at := range m.tombstones {
		if now.Sub(at) > tombstoneTTL {
			delete(m.tombstones, id)
		}
	}
	var expired []*sandbox
	for _, sb := range m.sandboxes {
		if e := sb.rec.Sandbox.GetExpiresAt(); e != nil && !sb.deleting && !e.AsTime().After(now) {
			expired = append(expired, sb)
		}
	}
	m.mu.Unlock()
	for _, sb := range expired {
		if m.ctx.Err() != nil {
			return
		}
		if err := m.deleteSandbox(m.ctx, sb, "ttl expired"); err != nil {
			m.log.Error("reap expired sandbox", "sandbox", sb.rec.Sandbox.GetId(), "err", err)
		} else {
			m.log.Info("sandbox expired", "sandbox", sb.rec.Sandbox.GetId())
		}
	}
	// A retired pool checkpoint goes with the last fork of it.
	m.sweepPoolCheckpointsIdle(m.ctx)
	// Request ids are remembered for a day: forget the expired ones once a
	// minute.
	if now.Sub(m.requestSweep) >= time.Minute {
		m.requestSweep = now
		if n, err := m.st.DeleteExpiredRequests(now); err != nil {
			m.log.Warn("forget expired request ids", "err", err)
		} else if n > 0 {
			m.log.Debug("forgot expired request ids", "count", n)
		}
	}
}
