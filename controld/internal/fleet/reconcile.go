package fleet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/rules"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/store"
)

// reconcile loads the store and makes it agree with the runtime and the
// checkpoint directory: nothing orphaned (containers and checkpoint dirs
// without records are removed), nothing forgotten (records whose container
// vanished are failed or dropped), interrupted boots resumed, and sources
// of interrupted checkpoints running again.
func (m *Manager) reconcile(ctx context.Context) error {
	// First let the runtime finish what a killed controld's checkpoint left
	// running (a dump still writing into a temporary directory, or about to
	// restore the freezer state it found) and release what it held.
	if rc, ok := runtime.As[runtime.CheckpointRecoverer](m.rt); ok {
		recs, err := m.st.Checkpoints()
		if err != nil {
			return fmt.Errorf("fleet: load checkpoints: %w", err)
		}
		keep := make([]runtime.CheckpointRef, 0, len(recs))
		for _, r := range recs {
			keep = append(keep, r.Ref)
		}
		if err := rc.RecoverCheckpoints(ctx, keep); err != nil {
			// Leftovers cost space, not correctness: start anyway.
			m.log.Error("release what interrupted checkpoints left in the runtime", "err", err)
		}
	}
	if err := m.reconcileCheckpoints(ctx); err != nil {
		return err
	}
	pools, err := m.st.Pools()
	if err != nil {
		return fmt.Errorf("fleet: load pools: %w", err)
	}
	for _, r := range pools {
		m.pools[r.Pool.Id] = newPool(r)
	}
	recs, err := m.st.Sandboxes()
	if err != nil {
		return fmt.Errorf("fleet: load sandboxes: %w", err)
	}
	insts, err := m.rt.List(ctx)
	if err != nil {
		return fmt.Errorf("fleet: list runtime sandboxes: %w", err)
	}
	byID := make(map[string]runtime.Instance, len(insts))
	for _, in := range insts {
		byID[in.ID] = in
	}
	known := map[string]bool{}
	// Work an adoption starts in the background (a resumed boot's wait, a
	// hold to lift) waits until every record is adopted: it reads the
	// whole table, which adoptions are still writing.
	var later []func()
	for _, r := range recs {
		known[r.Sandbox.Id] = true
		if err := m.adopt(ctx, r, byID, &later); err != nil {
			return err
		}
	}
	for _, start := range later {
		start()
	}
	for _, in := range insts {
		if known[in.ID] || !isOurs(in) {
			continue
		}
		m.log.Warn("removing orphaned sandbox container (no record)", "sandbox", in.ID)
		if err := m.rt.Delete(ctx, in.ID); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return fmt.Errorf("fleet: remove orphan %s: %w", in.ID, err)
		}
	}
	// Last: every sandbox left has its container, so a network without one
	// belongs to nobody (a crash between its setup and its container).
	if n, ok := runtime.As[runtime.Networker](m.rt); ok {
		if err := n.PruneNetworks(ctx); err != nil {
			m.log.Error("release sandbox networks nobody owns", "err", err)
		}
	}
	m.mu.Lock()
	m.refreshStateGaugeLocked()
	m.mu.Unlock()
	return nil
}

func isOurs(in runtime.Instance) bool {
	if in.Labels[LabelManaged] == managedValue {
		return true
	}
	for k := range in.Labels {
		if strings.HasPrefix(k, "forkfleet.dev/") {
			return true
		}
	}
	return strings.HasPrefix(in.ID, rules.PrefixSandbox)
}

// adopt brings one stored sandbox back under management. The record's
// state and what the runtime still holds decide its fate, each a named
// outcome of one adoption.
func (m *Manager) adopt(ctx context.Context, r *store.SandboxRecord, byID map[string]runtime.Instance, later *[]func()) error {
	in, present := byID[r.Sandbox.Id]
	// Records name the host that owns them now (config "host" may have
	// changed since): clients route by it.
	r.Sandbox.Host = m.opts.Host
	a := &adoption{m: m, rec: r, id: r.Sandbox.Id, in: in, present: present, later: later,
		sb: &sandbox{rec: r, started: make(chan struct{}), settled: make(chan struct{}), workDone: make(chan struct{}), build: in.ImageDigest}}
	close(a.sb.started)
	state := r.Sandbox.State
	switch {
	case state == controldv1.SandboxState_SANDBOX_STATE_STOPPING || state == controldv1.SandboxState_SANDBOX_STATE_DELETED:
		return a.drop(ctx, "delete was interrupted")
	case r.Pooled && (!present || state != controldv1.SandboxState_SANDBOX_STATE_READY && state != controldv1.SandboxState_SANDBOX_STATE_SUSPENDED):
		// A half-warmed or vanished pool member: its pool makes another.
		return a.drop(ctx, "pooled sandbox not warm")
	case r.Sandbox.CheckpointId != "" && (state == controldv1.SandboxState_SANDBOX_STATE_CREATING || state == controldv1.SandboxState_SANDBOX_STATE_BOOTING):
		// A replica that was never told who it is must not run half-restored.
		if !present {
			return a.drop(ctx, "fork interrupted")
		}
		return a.fail(ctx, "fork interrupted by a controld restart")
	case state == controldv1.SandboxState_SANDBOX_STATE_FAILED || state == controldv1.SandboxState_SANDBOX_STATE_STOPPED:
		return a.keepRecord(ctx)
	case !present:
		return a.fail(ctx, "container vanished while controld was down")
	case in.LazyPending:
		// Its page server was the last controld's: the pages it never got
		// would read as zeros.
		return a.fail(ctx, "lazy restore incomplete when controld restarted: its pages were lost with the page server")
	case in.Status == runtime.StatusStopped:
		return a.exited()
	case state == controldv1.SandboxState_SANDBOX_STATE_READY || state == controldv1.SandboxState_SANDBOX_STATE_SUSPENDED:
		return a.resumeLive(ctx)
	default: // CREATING or BOOTING a cold boot
		return a.resumeBoot()
	}
}

// adoption is one stored sandbox being adopted at start.
type adoption struct {
	m       *Manager
	rec     *store.SandboxRecord
	id      string
	in      runtime.Instance // what the runtime holds, if present
	present bool
	sb      *sandbox
	later   *[]func() // background work, started once every record is adopted
}

// removeContainer deletes what the runtime holds of the sandbox.
func (a *adoption) removeContainer(ctx context.Context) error {
	if err := a.m.rt.Delete(ctx, a.id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return fmt.Errorf("fleet: remove %s: %w", a.id, err)
	}
	return nil
}

// drop forgets the sandbox: its container and its record.
func (a *adoption) drop(ctx context.Context, why string) error {
	a.m.log.Warn("dropping sandbox at reconciliation", "sandbox", a.id, "reason", why)
	if a.present {
		if err := a.removeContainer(ctx); err != nil {
			return err
		}
	}
	return a.m.st.DeleteSandbox(a.id)
}

// fail keeps the sandbox as a FAILED record, its container removed.
func (a *adoption) fail(ctx context.Context, why string) error {
	a.rec.Sandbox.State = controldv1.SandboxState_SANDBOX_STATE_FAILED
	a.rec.Sandbox.StatusMessage = why
	if a.present {
		if err := a.removeContainer(ctx); err != nil {
			return err
		}
	}
	closeOnce(a.sb.settled)
	a.track()
	return a.m.st.PutSandbox(a.rec)
}

// keepRecord keeps a FAILED or STOPPED sandbox as it is: a failed one
// keeps only its record, a stopped one its stopped container too.
func (a *adoption) keepRecord(ctx context.Context) error {
	if a.present && a.in.Status != runtime.StatusStopped {
		if err := a.removeContainer(ctx); err != nil {
			return err
		}
	}
	closeOnce(a.sb.settled)
	a.track()
	return nil
}

// exited records a task that exited while controld was down as STOPPED.
func (a *adoption) exited() error {
	a.rec.Sandbox.State = controldv1.SandboxState_SANDBOX_STATE_STOPPED
	a.rec.Sandbox.StatusMessage = "task exited while controld was down"
	closeOnce(a.sb.settled)
	a.track()
	return a.m.st.PutSandbox(a.rec)
}

// register takes the sandbox under management as the runtime runs it.
func (a *adoption) register() {
	if !a.in.ACISocket.IsZero() {
		a.rec.ACISocket = a.in.ACISocket
	}
	a.track()
}

// track puts the sandbox in the manager's table. Adoption runs while
// sandboxes adopted before it already work in the background (a resumed
// boot's readiness wait reads the table under the lock), so it takes the
// lock too.
func (a *adoption) track() {
	a.m.mu.Lock()
	a.m.sandboxes[a.id] = a.sb
	a.m.mu.Unlock()
}

// resumeLive takes back a READY or SUSPENDED sandbox, trusting the
// runtime about frozen-ness, but thawing one an interrupted checkpoint
// left frozen.
func (a *adoption) resumeLive(ctx context.Context) error {
	m, r, in, id := a.m, a.rec, &a.in, a.id
	a.register()
	if r.Sandbox.State == controldv1.SandboxState_SANDBOX_STATE_READY && in.Status == runtime.StatusFrozen {
		// Frozen without a record saying so: a checkpoint (or a Suspend)
		// that never returned. Its caller got no checkpoint, so the
		// source runs on; guestd's checkpoint hold is lifted too.
		if err := m.rt.Thaw(ctx, id); err != nil {
			m.log.Error("thaw a sandbox an interrupted checkpoint left frozen; keeping it SUSPENDED", "sandbox", id, "err", err)
		} else {
			m.log.Warn("thawed a sandbox an interrupted checkpoint left frozen", "sandbox", id)
			in.Status = runtime.StatusRunning
			sock, token := r.ACISocket, r.AdminToken
			*a.later = append(*a.later, func() { m.goBackground(func() { m.liftCheckpointHold(m.ctx, sock, token, id) }) })
		}
	}
	// Otherwise trust the runtime about frozen-ness.
	if in.Status == runtime.StatusFrozen {
		r.Sandbox.State = controldv1.SandboxState_SANDBOX_STATE_SUSPENDED
	} else if in.Status == runtime.StatusRunning {
		r.Sandbox.State = controldv1.SandboxState_SANDBOX_STATE_READY
	}
	closeOnce(a.sb.settled)
	return m.st.PutSandbox(r)
}

// resumeBoot takes back an interrupted cold boot (CREATING or BOOTING):
// BOOTING again, waiting for guestd until its boot's deadline.
func (a *adoption) resumeBoot() error {
	m, r, sb, in := a.m, a.rec, a.sb, a.in
	a.register()
	r.Sandbox.State = controldv1.SandboxState_SANDBOX_STATE_BOOTING
	if err := m.st.PutSandbox(r); err != nil {
		return err
	}
	t0 := r.Sandbox.GetCreatedAt().AsTime()
	deadline := t0.Add(m.opts.BootTimeout)
	if d := time.Until(deadline); d < 5*time.Second {
		// Give a resumed wait at least a few seconds.
		deadline = time.Now().Add(5 * time.Second)
	}
	wctx, cancel := context.WithDeadline(m.ctx, deadline)
	sb.cancelWork = cancel
	wait := func() {
		defer close(sb.workDone)
		defer cancel()
		_, span := m.tracer.Start(wctx, "sandbox.boot.resume")
		wf := &waterfall{m: m.sandboxer, sb: sb, t0: t0, kind: "boot", span: span}
		for _, p := range r.Sandbox.Boot {
			wf.lastAt = t0.Add(p.GetAt().AsDuration())
		}
		m.awaitReady(wctx, sb, wf, in.ACISocket, r.AdminToken, in.TaskStartedAt)
	}
	*a.later = append(*a.later, func() { m.goBackground(wait) })
	return nil
}

// reconcileCheckpoints removes what an interrupted checkpoint left: temp
// dirs, records without a complete directory, directories without a record.
func (m *Manager) reconcileCheckpoints(ctx context.Context) error {
	recs, err := m.st.Checkpoints()
	if err != nil {
		return fmt.Errorf("fleet: load checkpoints: %w", err)
	}
	entries, err := os.ReadDir(m.opts.CheckpointDir)
	if err != nil {
		return fmt.Errorf("fleet: read checkpoint dir: %w", err)
	}
	byDir := map[string]bool{}
	var gone []string
	for _, r := range recs {
		if _, err := os.Stat(r.Ref.Dir); err != nil {
			m.log.Warn("dropping checkpoint whose directory is missing", "checkpoint", r.Checkpoint.Id, "dir", r.Ref.Dir)
			if err := m.rt.DeleteCheckpoint(ctx, r.Ref); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
				m.log.Error("release checkpoint", "checkpoint", r.Checkpoint.Id, "err", err)
			}
			gone = append(gone, r.Checkpoint.Id)
			continue
		}
		byDir[filepath.Clean(r.Ref.Dir)] = true
		m.checkpoints[r.Checkpoint.Id] = r
	}
	// Drop references to vanished checkpoints from the survivors' lineage.
	if len(gone) > 0 {
		goneSet := map[string]bool{}
		for _, id := range gone {
			goneSet[id] = true
		}
		err := m.st.Update(func(tx *store.Tx) error {
			for _, id := range gone {
				if err := tx.DeleteCheckpoint(id); err != nil {
					return err
				}
			}
			for _, c := range m.checkpoints {
				kids := c.Checkpoint.ChildIds[:0:0]
				for _, k := range c.Checkpoint.ChildIds {
					if !goneSet[k] {
						kids = append(kids, k)
					}
				}
				if len(kids) != len(c.Checkpoint.ChildIds) {
					c.Checkpoint.ChildIds = kids
					if err := tx.PutCheckpoint(c); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("fleet: drop incomplete checkpoints: %w", err)
		}
	}
	for _, e := range entries {
		path := filepath.Join(m.opts.CheckpointDir, e.Name())
		if byDir[path] {
			continue
		}
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			m.log.Warn("removing interrupted checkpoint", "dir", path)
		} else {
			m.log.Warn("removing unreferenced checkpoint directory", "dir", path)
		}
		// The runtime may hold a committed snapshot for it; let it release
		// what it can find from the directory.
		if err := m.rt.DeleteCheckpoint(ctx, runtime.CheckpointRef{Dir: path}); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			m.log.Error("release unreferenced checkpoint", "dir", path, "err", err)
		}
		if err := os.RemoveAll(path); err != nil {
			return fmt.Errorf("fleet: remove %s: %w", path, err)
		}
	}
	return nil
}
