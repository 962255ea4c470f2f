package fleet

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/errdefs/errgrpc"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/netpolicy"
	"github.com/forkfleet/forkfleet/api/rules"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/store"
)

// entropyBytes is how much fresh randomness a replica gets on Restored.
const entropyBytes = 64

// forker is the forks concern: N replicas of a checkpoint, each a restore
// verified against it (fork.go). Manager promotes its API; pools fork
// their misses through it.
type forker struct {
	*registry
	verifier *verifier
	transfer *transfer // a fork of a registry reference pulls it first
	// A replica is a sandbox, restored into a fork slot when one is ready.
	*sandboxer
	*warmer
}

// ForkCheckpoint starts count replicas of a checkpoint concurrently and
// reports each one's outcome; a replica that fails is removed completely.
func (m *forker) ForkCheckpoint(ctx context.Context, req *controldv1.ForkCheckpointRequest) (*controldv1.ForkCheckpointResponse, error) {
	resp, err := m.requests.Do(ctx, controldv1.CheckpointService_ForkCheckpoint_FullMethodName, req.GetRequestId(), req,
		func() proto.Message { return &controldv1.ForkCheckpointResponse{} }, m.recoverFork(req),
		func(ctx context.Context, r rules.Request) (proto.Message, error) {
			return m.forkCheckpoint(ctx, req, requestTag(r))
		})
	if err != nil {
		return nil, err
	}
	return resp.(*controldv1.ForkCheckpointResponse), nil
}

// recoverFork answers a repeated ForkCheckpoint whose first call left
// replicas but no stored answer (controld restarted before it): the
// replicas that became usable, and for the others the error that they were
// lost (a replica interrupted before it was usable is removed at start).
func (m *forker) recoverFork(req *controldv1.ForkCheckpointRequest) rules.Recover {
	return func(_ context.Context, key string, fp []byte) (proto.Message, bool, error) {
		tagged := m.taggedSandboxes(key)
		if len(tagged) == 0 {
			return nil, false, nil
		}
		out := make([]*controldv1.ForkReplica, req.GetCount())
		var ckID string
		for _, sb := range tagged {
			ckID = sb.rec.Sandbox.GetCheckpointId()
			if err := rules.CheckFingerprint(key, fp, sb.rec.Request.Fingerprint); err != nil {
				return nil, false, err
			}
			if i := sb.rec.Request.Index; i >= 0 && i < len(out) {
				out[i] = &controldv1.ForkReplica{Sandbox: m.snapshot(sb), Endpoint: m.endpoint(sb), Took: durationpb.New(0)}
			}
		}
		for i, r := range out {
			if r == nil {
				out[i] = &controldv1.ForkReplica{ErrorCode: int32(codes.Unavailable),
					ErrorMessage: "replica lost: controld restarted before it was usable; fork again with a new request_id", Took: durationpb.New(0)}
			}
		}
		return &controldv1.ForkCheckpointResponse{Replicas: out, CheckpointId: ckID}, true, nil
	}
}

func (m *forker) forkCheckpoint(ctx context.Context, req *controldv1.ForkCheckpointRequest, tag *store.RequestTag) (*controldv1.ForkCheckpointResponse, error) {
	t0 := time.Now()
	if err := rules.ForkSource(req); err != nil {
		return nil, err
	}
	if err := rules.ForkCount("count", req.GetCount()); err != nil {
		return nil, err
	}
	if err := rules.Labels("labels", req.GetLabels()); err != nil {
		return nil, err
	}
	ttl, err := rules.Duration("ttl", req.GetTtl(), rules.MaxTTL)
	if err != nil {
		return nil, err
	}
	var ck *store.CheckpointRecord
	if ref := req.GetCheckpointReference(); ref != "" {
		ck, err = m.transfer.remote(ctx, ref)
	} else {
		ck, err = m.findCheckpoint(req.GetCheckpointId())
	}
	if err != nil {
		return nil, err
	}
	levels, err := rules.VerifyLevels("verify", req.GetVerify(), ck.Checkpoint.VerifyLevels)
	if err != nil {
		return nil, err
	}
	// Checked once for all replicas (each resolves again as it registers).
	if _, err := m.opts.Limits.Resolve("resources", req.GetResources(), ck.Checkpoint.GetResources()); err != nil {
		return nil, err
	}
	policy, err := netpolicy.PolicyFor("network_policy", netpolicy.Mode(ck.Checkpoint.GetNetwork()), req.GetNetworkPolicy(), ck.Checkpoint.GetNetwork().GetPolicy())
	if err != nil {
		return nil, err
	}
	if err := m.checkEgress(ck.Checkpoint.GetNetwork()); err != nil {
		return nil, err
	}
	mode, err := rules.RestoreMode("restore_mode", req.GetRestoreMode(), ck.Checkpoint.GetTier())
	if err != nil {
		return nil, err
	}
	lazy, err := m.restoreLazily(ctx, mode, ck)
	if err != nil {
		return nil, err
	}
	ctx, span := m.tracer.Start(ctx, "checkpoint.fork", trace.WithAttributes(
		attribute.String("checkpoint.id", ck.Checkpoint.Id), attribute.Int("count", int(req.GetCount())),
		attribute.Bool("fork.lazy", lazy)))
	defer span.End()
	m.forkSlotsBegin(ck.Checkpoint.Id, int(req.GetCount()), lazy)
	defer m.forkSlotsEnd()
	n := int(req.GetCount())
	out := make([]*controldv1.ForkReplica, n)
	// The replicas of a fan-out hold their apps until every one is
	// verified: on a busy host the cores go to the restores still running,
	// not to the pages of the replicas restored first.
	var held []Guest
	if n > 1 {
		held = make([]Guest, n)
	}
	done := make(chan struct{}, n)
	for i := range n {
		go func() {
			defer func() { done <- struct{}{} }()
			p := forkParams{labels: req.GetLabels(), ttl: ttl, levels: levels, resources: req.GetResources(), policy: policy,
				request: replicaTag(tag, i), lazy: lazy}
			if held != nil {
				p.keep = func(g Guest) { held[i] = g }
			}
			out[i] = m.forkReplica(ctx, t0, ck, p)
		}()
	}
	for range n {
		<-done
	}
	m.resumeHeld(ctx, t0, out, held)
	if lazy {
		m.completeLazy(out)
	}
	m.recordForked(ck.Checkpoint.Id, ck.Checkpoint.GetSourceSandboxId(), out, req.GetRecord())
	return &controldv1.ForkCheckpointResponse{Replicas: out, CheckpointId: ck.Checkpoint.Id}, nil
}

// restoreLazily resolves a fork's restore mode: LAZY when the runtime can
// restore ck lazily (else FAILED_PRECONDITION), AUTO when it can, it is
// safe on this host, and ck holds at least Options.LazyMinBytes of pages.
func (m *forker) restoreLazily(ctx context.Context, mode controldv1.RestoreMode, ck *store.CheckpointRecord) (bool, error) {
	if mode == controldv1.RestoreMode_RESTORE_MODE_EAGER || ck.Checkpoint.GetTier() == controldv1.CheckpointTier_CHECKPOINT_TIER_DISK {
		return false, nil
	}
	lr, ok := runtime.As[runtime.LazyRestorer](m.rt)
	if !ok {
		if mode == controldv1.RestoreMode_RESTORE_MODE_LAZY {
			return false, errdefs.WithReason(errdefs.ErrFailedPrecondition, "LAZY_RESTORE_UNAVAILABLE", "this runtime restores eagerly only")
		}
		return false, nil
	}
	if mode == controldv1.RestoreMode_RESTORE_MODE_AUTO && (m.opts.LazyMinBytes <= 0 || !lr.LazySafe()) {
		return false, nil
	}
	n, err := lr.LazyBytes(ctx, ck.Ref)
	if mode == controldv1.RestoreMode_RESTORE_MODE_LAZY {
		return err == nil, err
	}
	return err == nil && n >= m.opts.LazyMinBytes, nil
}

// completeLazy has the runtime copy the remaining pages of a lazy fork's
// verified replicas (a fan-out's once all are verified and resumed: until
// then the cores go to the restores and faults).
func (m *forker) completeLazy(out []*controldv1.ForkReplica) {
	lr, ok := runtime.As[runtime.LazyRestorer](m.rt)
	if !ok {
		return
	}
	for _, rep := range out {
		if id := rep.GetSandbox().GetId(); id != "" {
			if st, ok := lr.LazyStats(id); ok {
				rep.LazyRestore = &controldv1.LazyRestoreStats{LazyPages: st.LazyPages, Faults: st.Faults, FaultPages: st.FaultPages,
					HotPages: st.HotPages}
			}
			lr.CompleteRestore(id)
		}
	}
}

// resumeHeld lets the held replicas of a fan-out run their apps, over the
// sessions their forks kept, and closes those. A replica that does not
// answer is removed and reported failed.
func (m *forker) resumeHeld(ctx context.Context, t0 time.Time, out []*controldv1.ForkReplica, held []Guest) {
	if held == nil {
		return
	}
	ctx, span := m.tracer.Start(ctx, "fork.resume_apps")
	defer span.End()
	done := make(chan struct{}, len(held))
	for i, g := range held {
		go func() {
			defer func() { done <- struct{}{} }()
			if g == nil {
				return
			}
			err := g.ResumeApps(ctx)
			g.Close()
			if err == nil {
				return
			}
			if sb, lerr := m.lookup(out[i].GetSandbox().GetId()); lerr == nil {
				if derr := m.deleteSandbox(ctx, sb, "resume apps failed: "+err.Error()); derr != nil {
					m.log.Error("remove replica whose apps did not resume", "sandbox", sb.rec.Sandbox.GetId(), "err", derr)
				}
			}
			m.metrics.Forks.WithLabelValues(codes.Unavailable.String()).Inc()
			out[i] = &controldv1.ForkReplica{ErrorCode: int32(codes.Unavailable), ErrorMessage: "resume apps: " + err.Error(),
				Took: durationpb.New(time.Since(t0))}
		}()
	}
	for range held {
		<-done
	}
}

type forkParams struct {
	// policy is the replica's network policy (mode egress); nil: none.
	policy *controldv1.NetworkPolicy
	// resources are the replica's limits; fields left 0 keep the
	// checkpoint's.
	resources *controldv1.Resources
	labels    map[string]string
	ttl       time.Duration
	levels    []controldv1.VerifyLevel
	poolID    string
	// pooled: a frozen pool's member (pooler.warmOne). Its apps are held
	// stopped from its Restored to its claim (RestoredInfo.HoldApps).
	pooled bool
	freeze bool // pools: freeze after verifying
	// keep, when set, takes the replica's admin session instead of closing
	// it, with the replica's apps held (RestoredInfo.HoldApps) until the
	// caller resumes them (a fan-out, forker.resumeHeld).
	keep func(Guest)
	// request tags the replica with the call (with a request id) making it.
	request *store.RequestTag
	// lazy: the replica's pages are served at first touch
	// (runtime.LazyRestorer); it takes a fork slot made for lazy restores.
	lazy bool
}

// replicaTag is tag for replica i (nil without a request id).
func replicaTag(tag *store.RequestTag, i int) *store.RequestTag {
	if tag == nil {
		return nil
	}
	t := *tag
	t.Index = i
	return &t
}

// forkReplica restores one replica, tells it who it is, verifies it and
// marks it READY (SUSPENDED when p.freeze). On any failure it is deleted.
func (m *forker) forkReplica(ctx context.Context, t0 time.Time, ck *store.CheckpointRecord, p forkParams) *controldv1.ForkReplica {
	sb, rep, err := m.forkStart(ctx, t0, ck, p)
	if err != nil {
		code := errgrpc.Code(err)
		if code == codes.Unknown {
			code = codes.Internal
		}
		m.metrics.Forks.WithLabelValues(code.String()).Inc()
		if sb != nil {
			if derr := m.deleteSandbox(ctx, sb, "fork failed: "+err.Error()); derr != nil {
				m.log.Error("remove failed replica", "sandbox", sb.rec.Sandbox.GetId(), "err", derr)
			}
		}
		rep.Sandbox, rep.Endpoint = nil, nil
		rep.ErrorCode = int32(code)
		rep.ErrorMessage = err.Error()
		rep.Took = durationpb.New(time.Since(t0))
		return rep
	}
	m.metrics.Forks.WithLabelValues(codes.OK.String()).Inc()
	m.metrics.ForkReplica.Observe(time.Since(t0).Seconds())
	rep.Took = durationpb.New(time.Since(t0))
	rep.Sandbox = m.snapshot(sb)
	rep.Endpoint = m.endpoint(sb)
	return rep
}

// forkSandboxParams are the parameters of a replica of ck (and of a fork
// slot precreated for ck: its spec must come out the same).
func forkSandboxParams(ck *store.CheckpointRecord, p forkParams) sandboxParams {
	sp := sandboxParams{
		image: ck.Checkpoint.Image, resources: p.resources, baseResources: ck.Checkpoint.Resources, screen: ck.Checkpoint.Screen,
		env: ck.Env, labels: p.labels, ttl: p.ttl, checkpointID: ck.Checkpoint.Id,
		generation: ck.Generation + 1, poolID: p.poolID, pooled: p.pooled, lazyRecord: true,
		runAsRoot: ck.Checkpoint.GetRunAsRoot(), request: p.request,
	}
	// The source's mode (the replica keeps its in-sandbox network).
	sp.network = &controldv1.Network{Mode: netpolicy.Mode(ck.Checkpoint.GetNetwork()), Policy: p.policy}
	return sp
}

// newForkSandbox registers a fork's sandbox; with useSlot it takes a
// container pre-created for forks of ckID (in the fork's restore mode)
// when one is ready.
func (m *forker) newForkSandbox(p sandboxParams, t0 time.Time, ckID string, useSlot, lazy bool) (*sandbox, bool, error) {
	take := func(rec *store.SandboxRecord) (runtime.BootSpec, bool) {
		if useSlot {
			spec := specOf(rec)
			spec.LazyRestore = lazy
			if s := m.takeForkSlotLocked(ckID, spec); s != nil {
				return s.spec, true
			}
		}
		return runtime.BootSpec{}, false
	}
	return m.registerSandbox(p, t0, take, m.discardSlot)
}

// forkStart makes one replica: it registers its sandbox, then runs the
// replica's steps under the fork's work context (cancelled by a delete, the
// request's end or the boot timeout), each traced in the replica's
// waterfall. On failure it returns the sandbox, for the caller to delete.
func (m *forker) forkStart(ctx context.Context, t0 time.Time, ck *store.CheckpointRecord, p forkParams) (*sandbox, *controldv1.ForkReplica, error) {
	rep := &controldv1.ForkReplica{}
	// Pool refills run in the background: fork slots serve requests.
	sb, fromSlot, err := m.newForkSandbox(forkSandboxParams(ck, p), t0, ck.Checkpoint.Id, !p.pooled, p.lazy)
	if err != nil {
		return nil, rep, err
	}
	// The fork's work is cancelable by a concurrent delete, like a boot.
	wctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), t0.Add(m.opts.BootTimeout))
	defer cancel()
	m.mu.Lock()
	sb.cancelWork = cancel
	m.mu.Unlock()
	defer close(sb.workDone)
	// Request cancellation also stops the fork.
	stop := context.AfterFunc(ctx, cancel)
	defer stop()

	f := &replicaFork{m: m, ck: ck, p: p, t0: t0, sb: sb, rep: rep, fromSlot: fromSlot, spec: m.bootSpec(sb),
		memTier: ck.Checkpoint.Tier != controldv1.CheckpointTier_CHECKPOINT_TIER_DISK}
	f.spec.LazyRestore = p.lazy
	rep.RestoreMode = controldv1.RestoreMode_RESTORE_MODE_EAGER
	if p.lazy {
		rep.RestoreMode = controldv1.RestoreMode_RESTORE_MODE_LAZY
	}
	wctx, span := m.tracer.Start(wctx, "fork.replica", trace.WithTimestamp(t0), trace.WithAttributes(
		attribute.String("sandbox.id", f.spec.ID), attribute.String("checkpoint.id", ck.Checkpoint.Id),
		attribute.Bool("fork.slot", fromSlot)))
	f.wf = &waterfall{m: m.sandboxer, sb: sb, t0: t0, kind: "fork", span: span}
	if p.pooled {
		f.wf.kind = "pool"
	}
	defer f.closeSession()
	for _, step := range []func(context.Context) error{
		f.restore,     // the runtime restores the checkpoint
		f.dial,        // an admin session with the replica's guestd
		f.identify,    // Restored, the proofs and readiness, side by side
		f.checkProofs, // every proof asked for held
		f.endSession,  // the session is closed before the replica is handed out
		f.freeze,      // pooled replicas wait frozen
		f.settleCPU,   // its own CPU weight, after the startup boost
		f.markUsable,  // READY (or SUSPENDED), the waterfall ended
	} {
		if err := step(wctx); err != nil {
			return sb, rep, err
		}
	}
	return sb, rep, nil
}

// replicaFork is one replica of a fork in progress: what its steps share.
type replicaFork struct {
	m        *forker
	ck       *store.CheckpointRecord
	p        forkParams
	t0       time.Time
	sb       *sandbox
	rep      *controldv1.ForkReplica
	fromSlot bool // a container precreated for forks of ck
	memTier  bool
	spec     runtime.BootSpec
	wf       *waterfall
	// restore, dial
	inst runtime.Instance
	g    Guest
}

// fail ends the replica's waterfall with err and returns err, wrapped with
// what failed when what is not empty (the span records err itself).
func (f *replicaFork) fail(err error, what string) error {
	f.wf.end(err)
	if what == "" {
		return err
	}
	return fmt.Errorf("%s: %w", what, err)
}

// restore has the runtime restore the checkpoint as the replica's sandbox.
func (f *replicaFork) restore(ctx context.Context) error {
	m, sb := f.m, f.sb
	rctx, rcancel := uncancelable(ctx)
	inst, err := m.rt.Restore(rctx, f.spec, f.ck.Ref)
	rcancel()
	sb.startErr = err
	close(sb.started)
	if err != nil {
		return f.fail(err, "restore")
	}
	f.inst = inst
	phases := inst
	if f.fromSlot {
		// The container was created ahead: no create phase on this path.
		phases.CreatedAt = f.t0
	}
	f.wf.runtimePhases(phases)
	m.mu.Lock()
	sb.build = inst.ImageDigest
	m.mu.Unlock()
	m.touch(sb, controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_STATE, nil, func(r *store.SandboxRecord) {
		r.ACISocket = inst.ACISocket
		r.Sandbox.State = controldv1.SandboxState_SANDBOX_STATE_BOOTING
	})
	return nil
}

// dial opens an admin session with the replica's guestd. A restored guestd
// knows only its checkpoint's tokens (the source's) until Restored installs
// the replica's own; a disk-tier fork booted with its own.
func (f *replicaFork) dial(ctx context.Context) error {
	dialToken := f.spec.AdminToken
	if f.memTier {
		dialToken = f.ck.AdminToken
	}
	g, err := f.m.dialGuest(ctx, f.inst.ACISocket, dialToken)
	if err != nil {
		return f.fail(err, "")
	}
	f.g = g
	f.wf.phase(PhaseGuestdListening, time.Now())
	return nil
}

// identify tells the replica who it is (Restored: its identity, fresh
// entropy), proves it is its checkpoint (p.levels) and waits until its
// desktop is usable. A disk-tier fork boots its desktop fresh: usable when
// guestd says so, its waterfall with a boot's guest milestones (X up,
// painted, windows mapped, focused: where a fresh session's time goes). A
// memory-tier replica was usable at the checkpoint (its
// guestd kept that); asking costs one round trip next to the restored
// notification and the proofs, and proves its display answers. Restored and
// the proofs are independent requests on one session: they run at once,
// and the replica is usable only when both are done.
func (f *replicaFork) identify(ctx context.Context) error {
	m, g, spec := f.m, f.g, f.spec
	usable := make(chan error, 1)
	if f.memTier {
		go func() {
			_, err := g.WaitReady(ctx, nil)
			usable <- err
		}()
	} else {
		seen := map[string]bool{}
		if _, err := g.WaitReady(ctx, func(s ReadyState) { f.wf.guestPhases(s, f.inst.TaskStartedAt, seen) }); err != nil {
			return f.fail(err, "desktop not ready")
		}
		usable <- nil
	}
	info := RestoredInfo{SandboxID: spec.ID, Token: spec.ACIToken, AdminToken: spec.AdminToken,
		Generation: f.sb.rec.Sandbox.Generation, Entropy: randomBytes(entropyBytes), HoldApps: f.p.pooled || f.p.keep != nil}
	restored := make(chan error, 1)
	born := make(chan []byte, 1) // the replica's first frame, for the pixel proof
	rctx, rs := m.tracer.Start(ctx, "fork.restored")
	go func() {
		defer rs.End()
		res, err := g.Restored(rctx, info)
		born <- res.FrameHash
		restored <- err
	}()
	if len(f.p.levels) > 0 {
		f.rep.Verification = m.verifier.verify(ctx, g, spec.ID, f.ck, f.p.levels, born)
	}
	if err := <-restored; err != nil {
		return f.fail(err, "restored notification")
	}
	if err := <-usable; err != nil {
		return f.fail(err, "desktop not ready")
	}
	return nil
}

// checkProofs fails the replica when a proof it was asked for failed.
func (f *replicaFork) checkProofs(context.Context) error {
	var failed []string
	for _, v := range f.rep.Verification {
		if !v.Ok {
			failed = append(failed, fmt.Sprintf("%s: %s", v.Level, v.Detail))
		}
	}
	if len(failed) > 0 {
		return f.fail(errdefs.WithReason(errdefs.ErrFailedPrecondition, "VERIFY_FAILED", "replica failed verification: %s", strings.Join(failed, "; ")), "")
	}
	return nil
}

// endSession closes the admin session, whose end the replica's user should
// not see.
func (f *replicaFork) endSession(context.Context) error {
	if f.p.keep != nil {
		f.p.keep(f.g)
		f.g = nil
		return nil
	}
	if err := f.g.Close(); err != nil {
		f.m.log.Debug("close replica session", "sandbox", f.spec.ID, "err", err)
	}
	return nil
}

// closeSession closes the session whatever happened (Close is idempotent).
func (f *replicaFork) closeSession() {
	if f.g != nil {
		f.g.Close()
	}
}

// freeze freezes a replica that waits in a pool.
func (f *replicaFork) freeze(ctx context.Context) error {
	if !f.p.freeze {
		return nil
	}
	if err := f.m.rt.Freeze(ctx, f.spec.ID); err != nil {
		return f.fail(err, "freeze")
	}
	return nil
}

// settleCPU ends the replica's startup boost (startupCPUWeight): from now
// on it shares the cores at the weight it asked for.
func (f *replicaFork) settleCPU(ctx context.Context) error {
	if f.spec.StartupCPUWeight == 0 {
		return nil
	}
	w, ok := runtime.As[runtime.CPUWeighter](f.m.rt)
	if !ok {
		return nil
	}
	if err := w.SetCPUWeight(ctx, f.spec.ID, f.spec.CPUWeight); err != nil {
		return f.fail(err, "cpu weight")
	}
	return nil
}

// markUsable records the replica READY (SUSPENDED when frozen) and ends
// its waterfall.
func (f *replicaFork) markUsable(context.Context) error {
	now := time.Now()
	f.wf.phase(PhaseUsable, now)
	state := controldv1.SandboxState_SANDBOX_STATE_READY
	if f.p.freeze {
		state = controldv1.SandboxState_SANDBOX_STATE_SUSPENDED
	}
	if _, err := f.m.update(f.sb, controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_STATE, nil, func(r *store.SandboxRecord) {
		r.Sandbox.State = state
		r.Sandbox.ReadyAt = timestampNow(now)
	}); err != nil {
		return f.fail(err, "")
	}
	f.wf.end(nil)
	closeOnce(f.sb.settled)
	return nil
}
