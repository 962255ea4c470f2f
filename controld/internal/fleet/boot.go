package fleet

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/guestsock"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/store"
)

// Boot phase names (BootPhase.name).
const (
	PhaseCreate          = "create"
	PhaseTaskStart       = "task_start"
	PhaseGuestdListening = "guestd_listening"
	PhaseXUp             = "x_up"
	PhasePainted         = "painted"
	// The image's readiness conditions, when it names them (guestd.json
	// "ready"): its windows mapped, their titles matching (a start page
	// loaded), the focus on its focus window.
	PhaseWindowsMapped = "windows_mapped"
	PhaseContentReady  = "content_ready"
	PhaseFocused       = "focused"
	PhaseUsable        = "usable"
)

// startBoot boots sb in the background, bounded by the boot timeout.
func (m *sandboxer) startBoot(sb *sandbox, t0 time.Time, kind string) {
	ctx, cancel := context.WithDeadline(m.ctx, t0.Add(m.opts.BootTimeout))
	m.mu.Lock()
	sb.cancelWork = cancel
	m.mu.Unlock()
	fromSlot := sb.fromSlot
	if !m.goBackground(func() {
		defer close(sb.workDone)
		defer cancel()
		m.boot(ctx, sb, t0, kind)
		if fromSlot {
			m.slotBootDone()
		}
	}) {
		// Shutting down between record and boot: nothing was started; the
		// CREATING record without a container fails at the next start.
		cancel()
		if fromSlot {
			m.discardSlot(sb.rec.Sandbox.GetId())
			m.slotBootDone()
		}
		sb.startErr = m.checkOpenErr()
		close(sb.started)
		close(sb.workDone)
	}
}

// boot runs a cold boot to usable.
func (m *sandboxer) boot(ctx context.Context, sb *sandbox, t0 time.Time, kind string) {
	spec := m.bootSpec(sb)
	ctx, span := m.tracer.Start(ctx, "sandbox.boot", trace.WithTimestamp(t0),
		trace.WithAttributes(attribute.String("sandbox.id", spec.ID), attribute.String("sandbox.image", spec.Image), attribute.String("kind", kind)))
	slot := sb.fromSlot
	span.SetAttributes(attribute.Bool("warm_slot", slot))
	wf := &waterfall{m: m, sb: sb, t0: t0, kind: kind, span: span}
	rctx, rcancel := uncancelable(ctx)
	inst, err := m.rt.Boot(rctx, spec)
	if err != nil && slot && rctx.Err() == nil {
		// The precreated sandbox did not start (the runtime removed it): a
		// slot must never make a boot fail that a cold boot would pass.
		m.log.Warn("warm slot did not start; booting cold", "sandbox", spec.ID, "err", err)
		slot = false
		inst, err = m.rt.Boot(rctx, spec)
	}
	rcancel()
	if err == nil && slot {
		// Created ahead of the request: the create phase took no time of it.
		inst.CreatedAt = t0
	}
	if err != nil {
		// The create call reports this error, and the runtime left nothing:
		// drop the record too rather than keep a FAILED ghost. startErr is
		// set first: forget wakes the callers waiting for the sandbox to
		// settle, and they answer with it (waitSettled).
		wf.end(err)
		m.log.Warn("sandbox boot failed", "sandbox", spec.ID, "err", err)
		sb.startErr = err
		if ferr := m.forget(sb); ferr != nil {
			m.log.Error("drop record of failed boot", "sandbox", spec.ID, "err", ferr)
		}
		close(sb.started)
		return
	}
	wf.runtimePhases(inst)
	m.mu.Lock()
	sb.build = inst.ImageDigest
	m.mu.Unlock()
	if _, err := m.update(sb, controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_STATE, nil, func(r *store.SandboxRecord) {
		r.ACISocket = inst.ACISocket
		if r.Sandbox.State == controldv1.SandboxState_SANDBOX_STATE_CREATING {
			r.Sandbox.State = controldv1.SandboxState_SANDBOX_STATE_BOOTING
		}
	}); err != nil {
		m.log.Error("persist booting sandbox", "sandbox", spec.ID, "err", err)
	}
	// Create returns from here: the record names guestd's socket now.
	close(sb.started)
	m.awaitReady(ctx, sb, wf, inst.ACISocket, spec.AdminToken, inst.TaskStartedAt)
}

// awaitReady follows guestd's readiness pushes until the desktop is usable,
// then marks the sandbox READY; on failure FAILED (unless controld is
// shutting down: the next start resumes the wait).
func (m *sandboxer) awaitReady(ctx context.Context, sb *sandbox, wf *waterfall, sock guestsock.Addr, token string, guestStart time.Time) {
	g, err := m.dialGuest(ctx, sock, token)
	if err != nil {
		m.bootFailed(sb, wf, err)
		return
	}
	defer g.Close()
	wf.phase(PhaseGuestdListening, time.Now())
	// A recycled pid could put another sandbox's guestd behind the path.
	if h := g.Hello(); h.SandboxID != "" && h.SandboxID != sb.rec.Sandbox.GetId() {
		m.bootFailed(sb, wf, errdefs.WithReason(errdefs.ErrFailedPrecondition, "GUEST_MISMATCH",
			"guestd at %s serves sandbox %s", sock, h.SandboxID))
		return
	}
	seen := map[string]bool{}
	_, err = g.WaitReady(ctx, func(s ReadyState) { wf.guestPhases(s, guestStart, seen) })
	if err != nil {
		m.bootFailed(sb, wf, err)
		return
	}
	m.markReady(sb, wf)
}

// guestPhases adds the guest's milestones reached in s that seen does not
// hold yet, in the order guestd reached them.
func (w *waterfall) guestPhases(s ReadyState, guestStart time.Time, seen map[string]bool) {
	now := time.Now()
	ms := []struct {
		name    string
		reached bool
		at      uint64
	}{
		{PhaseXUp, s.XUp, s.XUpMs},
		{PhasePainted, s.Painted, s.PaintedMs},
		{PhaseWindowsMapped, s.WindowsMappedMs > 0, s.WindowsMappedMs},
		{PhaseContentReady, s.ContentReadyMs > 0, s.ContentReadyMs},
		{PhaseFocused, s.FocusedMs > 0, s.FocusedMs},
	}
	sort.SliceStable(ms, func(i, j int) bool { return ms[i].at < ms[j].at })
	for _, m := range ms {
		if m.reached && !seen[m.name] {
			seen[m.name] = true
			w.phase(m.name, guestTime(guestStart, m.at, w.lastAt, now))
		}
	}
}

// guestTime converts a guestd milestone (ms since guestd started, which is
// when its task started: guestd is the sandbox's init) to wall time, clamped
// between the previous milestone and now so the waterfall stays ordered.
func guestTime(start time.Time, ms uint64, floor, now time.Time) time.Time {
	if start.IsZero() || ms == 0 {
		return now
	}
	t := start.Add(time.Duration(ms) * time.Millisecond)
	if t.Before(floor) {
		t = floor
	}
	if t.After(now) {
		t = now
	}
	return t
}

func (m *sandboxer) markReady(sb *sandbox, wf *waterfall) {
	now := time.Now()
	wf.phase(PhaseUsable, now)
	if _, err := m.update(sb, controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_STATE, nil, func(r *store.SandboxRecord) {
		if r.Sandbox.State == controldv1.SandboxState_SANDBOX_STATE_BOOTING || r.Sandbox.State == controldv1.SandboxState_SANDBOX_STATE_CREATING {
			r.Sandbox.State = controldv1.SandboxState_SANDBOX_STATE_READY
			r.Sandbox.ReadyAt = timestamppb.New(now)
		}
	}); err != nil {
		m.log.Error("persist ready sandbox", "sandbox", sb.rec.Sandbox.GetId(), "err", err)
	}
	wf.end(nil)
	closeOnce(sb.settled)
}

func (m *sandboxer) bootFailed(sb *sandbox, wf *waterfall, err error) {
	wf.end(err)
	if m.ctx.Err() != nil {
		// Shutting down: leave the sandbox BOOTING; reconciliation at the next
		// start resumes the wait.
		return
	}
	m.mu.Lock()
	deleting := sb.deleting
	m.mu.Unlock()
	if deleting {
		return
	}
	m.failSandbox(sb, fmt.Sprintf("not usable: %v", err), true)
}

// failSandbox marks sb FAILED; with cleanup its runtime instance is removed
// (the record stays until deleted or expired, for inspection).
func (m *sandboxer) failSandbox(sb *sandbox, msg string, cleanup bool) {
	id := sb.rec.Sandbox.GetId()
	m.log.Warn("sandbox failed", "sandbox", id, "reason", msg)
	if cleanup {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(m.ctx), time.Minute)
		if err := m.rt.Delete(ctx, id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			m.log.Error("remove failed sandbox", "sandbox", id, "err", err)
		}
		cancel()
	}
	if _, err := m.update(sb, controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_STATE, nil, func(r *store.SandboxRecord) {
		r.Sandbox.State = controldv1.SandboxState_SANDBOX_STATE_FAILED
		r.Sandbox.StatusMessage = msg
	}); err != nil {
		m.log.Error("persist failed sandbox", "sandbox", id, "err", err)
	}
	closeOnce(sb.settled)
}

// uncancelable returns a context for a runtime call that creates a sandbox:
// it keeps ctx's deadline and values but not its cancellation. A create cut
// short by a delete, a client going away or a shutdown then completes, and
// the caller removes (or, at shutdown, adopts) a whole sandbox, rather than
// relying on the runtime to unwind a half-made one.
func uncancelable(ctx context.Context) (context.Context, context.CancelFunc) {
	if d, ok := ctx.Deadline(); ok {
		return context.WithDeadline(context.WithoutCancel(ctx), d)
	}
	return context.WithCancel(context.WithoutCancel(ctx))
}

func timestampNow(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }

func closeOnce(ch chan struct{}) {
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// waitStarted waits until the runtime created sb's task.
func (m *sandboxer) waitStarted(ctx context.Context, sb *sandbox) error {
	select {
	case <-sb.started:
		return sb.startErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitSettled waits until sb is READY or failed.
func (m *sandboxer) waitSettled(ctx context.Context, sb *sandbox) (*controldv1.Sandbox, error) {
	select {
	case <-sb.settled:
	case <-ctx.Done():
		return nil, errdefs.WithReason(errdefs.ErrDeadlineExceeded, "NOT_READY", "sandbox %s not ready: %v", sb.rec.Sandbox.GetId(), ctx.Err())
	}
	if sb.startErr != nil {
		// The runtime did not boot it (set before settled closed).
		return nil, sb.startErr
	}
	s := m.snapshot(sb)
	switch s.State {
	case controldv1.SandboxState_SANDBOX_STATE_READY, controldv1.SandboxState_SANDBOX_STATE_SUSPENDED:
		return s, nil
	default:
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "SANDBOX_NOT_USABLE", "sandbox %s is %s: %s", s.Id, s.State, s.StatusMessage)
	}
}

// waterfall records a sandbox's boot milestones: in its record (and watch
// events), as spans under the boot span, and in the phase histogram.
type waterfall struct {
	m      *sandboxer
	sb     *sandbox
	t0     time.Time
	kind   string
	span   trace.Span
	lastAt time.Time
	ended  bool
}

func (w *waterfall) runtimePhases(inst runtime.Instance) {
	now := time.Now()
	created, started := inst.CreatedAt, inst.TaskStartedAt
	if created.IsZero() || created.Before(w.t0) || created.After(now) {
		created = now
	}
	if started.IsZero() || started.Before(created) || started.After(now) {
		started = now
	}
	w.phase(PhaseCreate, created)
	w.phase(PhaseTaskStart, started)
}

func (w *waterfall) phase(name string, at time.Time) {
	if w.lastAt.IsZero() {
		w.lastAt = w.t0
	}
	if at.Before(w.lastAt) {
		at = w.lastAt
	}
	_, ps := w.m.tracer.Start(trace.ContextWithSpan(context.Background(), w.span), "boot."+name, trace.WithTimestamp(w.lastAt))
	ps.End(trace.WithTimestamp(at))
	w.lastAt = at
	d := at.Sub(w.t0)
	w.m.metrics.BootPhase.WithLabelValues(name, w.kind).Observe(d.Seconds())
	p := &controldv1.BootPhase{Name: name, At: durationpb.New(d)}
	w.m.touch(w.sb, controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_PHASE, p, func(r *store.SandboxRecord) {
		r.Sandbox.Boot = append(r.Sandbox.Boot, p)
	})
}

func (w *waterfall) end(err error) {
	if w.ended {
		return
	}
	w.ended = true
	if err != nil {
		w.span.RecordError(err)
		w.span.SetStatus(codes.Error, err.Error())
	}
	w.span.End()
}
