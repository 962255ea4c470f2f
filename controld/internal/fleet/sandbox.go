package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/guestsock"
	"github.com/forkfleet/forkfleet/api/limits"
	"github.com/forkfleet/forkfleet/api/netpolicy"
	"github.com/forkfleet/forkfleet/api/rules"
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

const defaultWaitTimeout = 60 * time.Second

// CreateSandbox validates req, records the sandbox and boots it. It returns
// once the task runs (or, with wait_ready, once the desktop is usable).
func (m *Manager) CreateSandbox(ctx context.Context, req *controldv1.CreateSandboxRequest) (*controldv1.Sandbox, *controldv1.Endpoint, error) {
	resp, err := m.requests.Do(ctx, controldv1.SandboxService_CreateSandbox_FullMethodName, req.GetRequestId(), req,
		func() proto.Message { return &controldv1.CreateSandboxResponse{} }, m.recoverCreate(req),
		func(ctx context.Context, r rules.Request) (proto.Message, error) {
			s, ep, err := m.createSandbox(ctx, req, requestTag(r))
			if err != nil {
				return nil, err
			}
			return &controldv1.CreateSandboxResponse{Sandbox: s, Endpoint: ep}, nil
		})
	if err != nil {
		return nil, nil, err
	}
	r := resp.(*controldv1.CreateSandboxResponse)
	return r.GetSandbox(), r.GetEndpoint(), nil
}

// recoverCreate finds the sandbox a first CreateSandbox with the same
// request id made (it failed to answer, or controld restarted) and answers
// as that call would have.
func (m *Manager) recoverCreate(req *controldv1.CreateSandboxRequest) rules.Recover {
	return func(ctx context.Context, key string, fp []byte) (proto.Message, bool, error) {
		tagged := m.taggedSandboxes(key)
		if len(tagged) == 0 {
			return nil, false, nil
		}
		sb := tagged[0]
		if err := rules.CheckFingerprint(key, fp, sb.rec.Request.Fingerprint); err != nil {
			return nil, false, err
		}
		if req.GetWaitReady() {
			s, err := m.waitSettled(ctx, sb)
			if err != nil {
				return nil, false, err
			}
			return &controldv1.CreateSandboxResponse{Sandbox: s, Endpoint: m.endpoint(sb)}, true, nil
		}
		if err := m.waitStarted(ctx, sb); err != nil {
			return nil, false, err
		}
		return &controldv1.CreateSandboxResponse{Sandbox: m.snapshot(sb), Endpoint: m.endpoint(sb)}, true, nil
	}
}

func (m *Manager) createSandbox(ctx context.Context, req *controldv1.CreateSandboxRequest, tag *store.RequestTag) (*controldv1.Sandbox, *controldv1.Endpoint, error) {
	t0 := time.Now()
	if err := rules.Image("image", req.GetImage()); err != nil {
		return nil, nil, err
	}
	res, err := m.opts.Limits.Resolve("resources", req.GetResources(), nil)
	if err != nil {
		return nil, nil, err
	}
	if err := rules.Screen("screen", req.GetScreen()); err != nil {
		return nil, nil, err
	}
	if err := rules.Env("env", req.GetEnv()); err != nil {
		return nil, nil, err
	}
	if err := rules.Labels("labels", req.GetLabels()); err != nil {
		return nil, nil, err
	}
	ttl, err := rules.Duration("ttl", req.GetTtl(), rules.MaxTTL)
	if err != nil {
		return nil, nil, err
	}
	if err := netpolicy.ValidateNetwork("network", req.GetNetwork()); err != nil {
		return nil, nil, err
	}
	if err := m.checkEgress(req.GetNetwork()); err != nil {
		return nil, nil, err
	}
	sb, err := m.newSandbox(sandboxParams{
		image: req.GetImage(), resources: res, screen: req.GetScreen(),
		env: req.GetEnv(), labels: req.GetLabels(), ttl: ttl, warmSlot: true, runAsRoot: req.GetRunAsRoot(),
		network: netpolicy.Normalize(req.GetNetwork()), request: tag,
	}, t0)
	if err != nil {
		return nil, nil, err
	}
	m.startBoot(sb, t0, "boot")
	if req.GetWaitReady() {
		s, err := m.waitSettled(ctx, sb)
		if err != nil {
			return nil, nil, err
		}
		return s, m.endpoint(sb), nil
	}
	if err := m.waitStarted(ctx, sb); err != nil {
		return nil, nil, err
	}
	return m.snapshot(sb), m.endpoint(sb), nil
}

type sandboxParams struct {
	image string
	// resources are the requested limits; fields left 0 take baseResources
	// (a fork's checkpoint's), or the host's defaults when that is nil.
	resources     *controldv1.Resources
	baseResources *controldv1.Resources
	screen        *controldv1.Screen
	env           map[string]string
	labels        map[string]string
	ttl           time.Duration
	checkpointID  string
	generation    uint64
	poolID        string
	pooled        bool
	// network is the sandbox's (mode spelled out by newRecord); nil: none.
	network *controldv1.Network
	// lazyRecord: do not write the record until the sandbox is usable. For
	// forks: a replica interrupted before that is deleted at the next start
	// anyway (as a container without a record), so the early fsyncs would
	// only slow every replica down.
	lazyRecord bool
	// warmSlot: a cold boot that may take a warm slot (a sandbox
	// precreated for the same spec) and then only start it.
	warmSlot bool
	// runAsRoot: the agent's processes run as root, not the image's user.
	runAsRoot bool
	// request tags the record with the call (with a request id) making it.
	request *store.RequestTag
}

// newSandbox writes a CREATING record and registers it.
func (m *Manager) newSandbox(p sandboxParams, t0 time.Time) (*sandbox, error) {
	take := func(*store.SandboxRecord) (runtime.BootSpec, bool) { return runtime.BootSpec{}, false }
	if p.warmSlot {
		take = func(rec *store.SandboxRecord) (runtime.BootSpec, bool) {
			if s := m.takeSlotLocked(specOf(rec)); s != nil {
				return s.spec, true
			}
			return runtime.BootSpec{}, false
		}
	}
	sb, fromSlot, err := m.registerSandbox(p, t0, take, func(id string) {
		m.discardSlot(id)
		m.slotBootDone()
	})
	if err != nil {
		return nil, err
	}
	sb.fromSlot = fromSlot
	return sb, nil
}

// registerSandbox builds a new sandbox's record, admits it (the host's
// admission limits), registers it and persists its creation. take may hand
// it a pre-created container (a warm slot): the record then adopts the
// slot's id and tokens. take runs under the same lock as the open check, so
// a slot is either handed to a registered sandbox or discarded at Close,
// never lost; undo gives it up if persisting fails.
func (m *Manager) registerSandbox(p sandboxParams, t0 time.Time, take func(*store.SandboxRecord) (runtime.BootSpec, bool), undo func(id string)) (*sandbox, bool, error) {
	rec, err := m.newRecord(p, t0)
	if err != nil {
		return nil, false, err
	}
	sb := &sandbox{rec: rec, started: make(chan struct{}), settled: make(chan struct{}), workDone: make(chan struct{})}
	m.mu.Lock()
	if err := m.checkOpen(); err != nil {
		m.mu.Unlock()
		return nil, false, err
	}
	// Registering is the reservation: the check and the insert share the
	// lock, so concurrent creates, replicas and pool fills never overbook.
	if err := m.opts.Limits.Admit(m.heldLocked(), limits.Of(rec.Sandbox.GetResources())); err != nil {
		m.mu.Unlock()
		m.metrics.Admission.Inc()
		return nil, false, err
	}
	spec, fromSlot := take(rec)
	if fromSlot {
		rec.Sandbox.Id, rec.ACIToken, rec.AdminToken = spec.ID, spec.ACIToken, spec.AdminToken
	}
	id := rec.Sandbox.Id
	m.sandboxes[id] = sb
	// Slots beyond the host's limits now (this sandbox took none) go.
	overbooked := m.slots != nil && m.opts.Limits.Admit(m.heldLocked(), m.slotsUsageLocked()) != nil
	m.mu.Unlock()
	if overbooked {
		m.wakeSlots()
	}
	if _, err := m.change(sb, !p.lazyRecord, controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_CREATED, nil, nil); err != nil {
		m.mu.Lock()
		delete(m.sandboxes, id)
		m.refreshStateGaugeLocked()
		m.mu.Unlock()
		if fromSlot {
			undo(id)
		}
		return nil, false, err
	}
	return sb, fromSlot, nil
}

// heldLocked is what the host's sandboxes hold against admission: every
// record counts except FAILED ones (their runtime instance is removed);
// memory counts for those whose processes may run (not STOPPED).
func (m *Manager) heldLocked() limits.Usage {
	var u limits.Usage
	for _, sb := range m.sandboxes {
		switch sb.rec.Sandbox.GetState() {
		case controldv1.SandboxState_SANDBOX_STATE_FAILED, controldv1.SandboxState_SANDBOX_STATE_DELETED:
			continue
		case controldv1.SandboxState_SANDBOX_STATE_STOPPED:
			u.Sandboxes++
		default:
			u = u.Add(limits.Of(sb.rec.Sandbox.GetResources()))
		}
	}
	return u
}

// newRecord builds the record of a new sandbox (fresh id and tokens) with
// the defaults applied and its limits resolved; it registers nothing.
func (m *Manager) newRecord(p sandboxParams, t0 time.Time) (*store.SandboxRecord, error) {
	if p.image == "" {
		p.image = m.opts.DefaultImage
	}
	screen := proto.Clone(m.opts.DefaultScreen).(*controldv1.Screen)
	if p.screen != nil {
		screen = proto.Clone(p.screen).(*controldv1.Screen)
	}
	if screen.Depth == 0 {
		screen.Depth = 24
	}
	// Resolved again even when the request was: a pool's or checkpoint's
	// limits must still fit this host's maxima.
	res, err := m.opts.Limits.Resolve("resources", p.resources, p.baseResources)
	if err != nil {
		return nil, err
	}
	pb := &controldv1.Sandbox{
		Id:           rules.NewID(rules.PrefixSandbox),
		State:        controldv1.SandboxState_SANDBOX_STATE_CREATING,
		Image:        p.image,
		Resources:    res,
		Screen:       screen,
		Labels:       copyMap(p.labels),
		CreatedAt:    timestamppb.New(t0),
		CheckpointId: p.checkpointID,
		Generation:   p.generation,
		PoolId:       p.poolID,
		Host:         m.opts.Host,
		RunAsRoot:    p.runAsRoot,
	}
	if p.ttl > 0 {
		pb.ExpiresAt = timestamppb.New(t0.Add(p.ttl))
	}
	pb.Network = netpolicy.Normalize(p.network)
	return &store.SandboxRecord{Sandbox: pb, Env: copyMap(p.env), ACIToken: newToken(), AdminToken: newToken(), Pooled: p.pooled,
		Request: p.request}, nil
}

func copyMap(in map[string]string) map[string]string {
	if len(in) == 0 {
		return nil
	}
	out := make(map[string]string, len(in))
	for k, v := range in {
		out[k] = v
	}
	return out
}

func (m *Manager) bootSpec(sb *sandbox) runtime.BootSpec {
	m.mu.Lock()
	defer m.mu.Unlock()
	return specOf(sb.rec)
}

// specOf is the runtime spec of a record. Warm slots are precreated from
// it too: the runtime starts a precreated sandbox only for an identical spec.
func specOf(r *store.SandboxRecord) runtime.BootSpec {
	return runtime.BootSpec{
		ID:          r.Sandbox.Id,
		Image:       r.Sandbox.Image,
		CPUMillis:   r.Sandbox.GetResources().GetCpuMillis(),
		CPUWeight:   r.Sandbox.GetResources().GetCpuWeight(),
		MemoryBytes: r.Sandbox.GetResources().GetMemoryBytes(),
		PidsMax:     r.Sandbox.GetResources().GetPidsMax(),
		DiskBytes:   r.Sandbox.GetResources().GetDiskBytes(),
		LogBytes:    r.Sandbox.GetResources().GetLogBytes(),
		Width:       r.Sandbox.GetScreen().GetWidth(),
		Height:      r.Sandbox.GetScreen().GetHeight(),
		Depth:       r.Sandbox.GetScreen().GetDepth(),
		Env:         copyMap(r.Env),
		RunAsRoot:   r.Sandbox.GetRunAsRoot(),
		ACIToken:    r.ACIToken,
		AdminToken:  r.AdminToken,
		Labels:      map[string]string{LabelManaged: managedValue, LabelSandboxID: r.Sandbox.Id},
		Network:     netSpecOf(r.Sandbox.GetNetwork(), r.Pooled),
	}
}

// startBoot boots sb in the background, bounded by the boot timeout.
func (m *Manager) startBoot(sb *sandbox, t0 time.Time, kind string) {
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
func (m *Manager) boot(ctx context.Context, sb *sandbox, t0 time.Time, kind string) {
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
func (m *Manager) awaitReady(ctx context.Context, sb *sandbox, wf *waterfall, sock guestsock.Addr, token string, guestStart time.Time) {
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

func (m *Manager) markReady(sb *sandbox, wf *waterfall) {
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

func (m *Manager) bootFailed(sb *sandbox, wf *waterfall, err error) {
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
func (m *Manager) failSandbox(sb *sandbox, msg string, cleanup bool) {
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
func (m *Manager) waitStarted(ctx context.Context, sb *sandbox) error {
	select {
	case <-sb.started:
		return sb.startErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitSettled waits until sb is READY or failed.
func (m *Manager) waitSettled(ctx context.Context, sb *sandbox) (*controldv1.Sandbox, error) {
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

// GetSandbox returns one sandbox.
func (m *Manager) GetSandbox(_ context.Context, id string) (*controldv1.Sandbox, error) {
	if err := rules.SandboxID("id", id); err != nil {
		return nil, err
	}
	sb, err := m.lookup(id)
	if err != nil {
		return nil, err
	}
	return m.snapshot(sb), nil
}

// SandboxEndpoint returns how to reach a sandbox's ACI.
func (m *Manager) SandboxEndpoint(_ context.Context, id string) (*controldv1.Endpoint, error) {
	if err := rules.SandboxID("id", id); err != nil {
		return nil, err
	}
	sb, err := m.lookup(id)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if sb.rec.Pooled {
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "SANDBOX_POOLED",
			"sandbox %s is held by pool %s; claim it", id, sb.rec.Sandbox.GetPoolId())
	}
	return m.endpointLocked(sb), nil
}

// ListSandboxes returns the sandboxes matching every label and any state,
// oldest first.
// ListSandboxes returns the page of matching sandboxes the request asks
// for (oldest first) and the next page's token.
func (m *Manager) ListSandboxes(_ context.Context, req *controldv1.ListSandboxesRequest) ([]*controldv1.Sandbox, string, error) {
	if err := rules.Labels("labels", req.GetLabels()); err != nil {
		return nil, "", err
	}
	if err := rules.States("states", req.GetStates()); err != nil {
		return nil, "", err
	}
	m.mu.Lock()
	var out []*controldv1.Sandbox
	for _, sb := range m.sandboxes {
		s := sb.rec.Sandbox
		if sb.deleting || !rules.MatchLabels(s.Labels, req.GetLabels()) {
			continue
		}
		if len(req.GetStates()) > 0 && !containsState(req.GetStates(), s.State) {
			continue
		}
		out = append(out, proto.Clone(s).(*controldv1.Sandbox))
	}
	m.mu.Unlock()
	return rules.Page(out, rules.SandboxKey, req.GetPageSize(), req.GetPageToken(), req)
}

func containsState(states []controldv1.SandboxState, s controldv1.SandboxState) bool {
	for _, x := range states {
		if x == s {
			return true
		}
	}
	return false
}

// WaitSandboxReady waits until the sandbox is usable.
func (m *Manager) WaitSandboxReady(ctx context.Context, id string, timeout *durationpb.Duration) (*controldv1.Sandbox, error) {
	if err := rules.SandboxID("id", id); err != nil {
		return nil, err
	}
	d, err := rules.Duration("timeout", timeout, rules.MaxWaitTimeout)
	if err != nil {
		return nil, err
	}
	if d == 0 {
		d = defaultWaitTimeout
	}
	sb, err := m.lookup(id)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return m.waitSettled(ctx, sb)
}

// DeleteSandbox removes a sandbox completely (task, container, snapshot,
// cgroup, record). It is idempotent: concurrent deletes coalesce, and
// deleting an id deleted in the last 10 minutes (by this controld process)
// succeeds; an id never seen is NotFound.
func (m *Manager) DeleteSandbox(ctx context.Context, id string) error {
	if err := rules.SandboxID("id", id); err != nil {
		return err
	}
	m.mu.Lock()
	sb, ok := m.sandboxes[id]
	_, recent := m.tombstones[id]
	m.mu.Unlock()
	if !ok {
		if recent {
			return nil
		}
		return sandboxNotFound(id)
	}
	return m.deleteSandbox(ctx, sb, "")
}

// deleteSandbox tears sb down. The work runs to completion even when ctx is
// canceled (a half-deleted sandbox helps nobody).
func (m *Manager) deleteSandbox(ctx context.Context, sb *sandbox, why string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	sb.op.Lock()
	defer sb.op.Unlock()
	id := sb.rec.Sandbox.GetId()
	m.mu.Lock()
	if _, still := m.sandboxes[id]; !still {
		m.mu.Unlock()
		return nil // deleted by a concurrent call
	}
	sb.deleting = true
	cancelWork := sb.cancelWork
	m.mu.Unlock()
	if cancelWork != nil {
		cancelWork()
		<-sb.workDone
	}
	if _, err := m.update(sb, controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_STATE, nil, func(r *store.SandboxRecord) {
		r.Sandbox.State = controldv1.SandboxState_SANDBOX_STATE_STOPPING
		if why != "" {
			r.Sandbox.StatusMessage = why
		}
	}); err != nil {
		m.log.Error("persist stopping sandbox", "sandbox", id, "err", err)
	}
	if err := m.rt.Delete(ctx, id); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		m.mu.Lock()
		sb.deleting = false
		m.mu.Unlock()
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	return m.forget(sb)
}

// forget drops sb's record after its runtime instance is gone.
func (m *Manager) forget(sb *sandbox) error {
	id := sb.rec.Sandbox.GetId()
	sb.persist.Lock()
	defer sb.persist.Unlock()
	m.mu.Lock()
	_, present := m.sandboxes[id]
	m.mu.Unlock()
	if !present {
		return nil // forgotten by a concurrent path
	}
	if err := m.st.DeleteSandbox(id); err != nil {
		return fmt.Errorf("sandbox %s: remove record: %w", id, err)
	}
	m.mu.Lock()
	delete(m.sandboxes, id)
	m.tombstones[id] = time.Now()
	sb.rec.Sandbox.State = controldv1.SandboxState_SANDBOX_STATE_DELETED
	snap := proto.Clone(sb.rec.Sandbox).(*controldv1.Sandbox)
	m.refreshStateGaugeLocked()
	poolID, pooled := sb.rec.Sandbox.GetPoolId(), sb.rec.Pooled
	m.mu.Unlock()
	closeOnce(sb.settled)
	m.publish(&controldv1.WatchSandboxesResponse{Type: controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_DELETED, Sandbox: snap})
	if pooled {
		m.kickPool(poolID)
	}
	m.wakeSlots()
	return nil
}

// SuspendSandbox freezes a READY sandbox (idempotent when SUSPENDED).
func (m *Manager) SuspendSandbox(ctx context.Context, id string) (*controldv1.Sandbox, error) {
	return m.freezeThaw(ctx, id, true)
}

// ResumeSandbox thaws a SUSPENDED sandbox (idempotent when READY).
func (m *Manager) ResumeSandbox(ctx context.Context, id string) (*controldv1.Sandbox, error) {
	return m.freezeThaw(ctx, id, false)
}

func (m *Manager) freezeThaw(ctx context.Context, id string, freeze bool) (*controldv1.Sandbox, error) {
	if err := rules.SandboxID("id", id); err != nil {
		return nil, err
	}
	sb, err := m.lookup(id)
	if err != nil {
		return nil, err
	}
	sb.op.Lock()
	defer sb.op.Unlock()
	from, to := controldv1.SandboxState_SANDBOX_STATE_READY, controldv1.SandboxState_SANDBOX_STATE_SUSPENDED
	if !freeze {
		from, to = to, from
	}
	m.mu.Lock()
	state, pooled, deleting := sb.rec.Sandbox.State, sb.rec.Pooled, sb.deleting
	m.mu.Unlock()
	switch {
	case deleting:
		return nil, sandboxNotFound(id)
	case pooled:
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "SANDBOX_POOLED", "sandbox %s is held by its pool; claim it first", id)
	case state == to:
		return m.snapshot(sb), nil
	case state != from:
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "SANDBOX_WRONG_STATE", "sandbox %s is %s, must be %s", id, state, from)
	}
	if freeze {
		err = m.rt.Freeze(ctx, id)
	} else {
		err = m.rt.Thaw(ctx, id)
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	return m.update(sb, controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_STATE, nil, func(r *store.SandboxRecord) {
		r.Sandbox.State = to
	})
}

// watchExits marks sandboxes whose task ended on its own.
func (m *Manager) watchExits(exits <-chan runtime.Exit) {
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

func (m *Manager) handleExit(ex runtime.Exit) {
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
func (m *Manager) reapLoop() {
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

// tombstoneTTL is how long a deleted id still deletes successfully.
const tombstoneTTL = 10 * time.Minute

func (m *Manager) reapOnce(now time.Time) {
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

// waterfall records a sandbox's boot milestones: in its record (and watch
// events), as spans under the boot span, and in the phase histogram.
type waterfall struct {
	m      *Manager
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

// requestTag is the tag of what a call with request r creates (nil
// without a request id).
func requestTag(r rules.Request) *store.RequestTag {
	if r.Key == "" {
		return nil
	}
	return &store.RequestTag{Key: r.Key, Fingerprint: r.Fingerprint}
}

// taggedSandboxes returns the live sandboxes a call with request key made
// within the request id's lifetime, by replica index.
func (m *Manager) taggedSandboxes(key string) []*sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*sandbox
	for _, sb := range m.sandboxes {
		r := sb.rec.Request
		if r == nil || r.Key != key || sb.deleting || time.Since(sb.rec.Sandbox.GetCreatedAt().AsTime()) > rules.RequestIDTTL {
			continue
		}
		switch sb.rec.Sandbox.GetState() {
		case controldv1.SandboxState_SANDBOX_STATE_FAILED, controldv1.SandboxState_SANDBOX_STATE_DELETED:
			continue
		}
		out = append(out, sb)
	}
	slices.SortFunc(out, func(a, b *sandbox) int { return a.rec.Request.Index - b.rec.Request.Index })
	return out
}

// ExtendSandbox sets when a sandbox is deleted: ttl from now.
func (m *Manager) ExtendSandbox(_ context.Context, req *controldv1.ExtendSandboxRequest) (*controldv1.Sandbox, error) {
	if err := rules.SandboxID("id", req.GetId()); err != nil {
		return nil, err
	}
	ttl, err := rules.RequiredTTL("ttl", req.GetTtl())
	if err != nil {
		return nil, err
	}
	sb, err := m.lookup(req.GetId())
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	pooled := sb.rec.Pooled
	m.mu.Unlock()
	if pooled {
		// A warm member is its pool's until claimed; a claim sets its TTL.
		return nil, sandboxNotFound(req.GetId())
	}
	return m.update(sb, controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_STATE, nil, func(r *store.SandboxRecord) {
		r.Sandbox.ExpiresAt = timestamppb.New(time.Now().Add(ttl))
	})
}
