package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/limits"
	"github.com/forkfleet/forkfleet/api/netpolicy"
	"github.com/forkfleet/forkfleet/api/rules"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/store"
)

const defaultWaitTimeout = 60 * time.Second

// sandboxer is the sandboxes concern: a sandbox's create, boot, lifecycle
// and exit (sandbox.go, boot.go, exits.go), its limits, network, view
// tickets and recording (limits.go, network.go, view.go, recording.go), and
// its endpoint and route (manager.go). Manager promotes its API; pools,
// checkpoints and forks make and remove sandboxes through it.
type sandboxer struct {
	*registry
	// viewMu guards viewTickets (view.go), by the SHA-256 of the ticket.
	viewMu      sync.Mutex
	viewTickets map[[32]byte]viewTicket
	// A create takes a warm slot when one matches; a pooled sandbox's
	// exit refills its pool.
	*warmer
	*pooler
}

// CreateSandbox validates req, records the sandbox and boots it. It returns
// once the task runs (or, with wait_ready, once the desktop is usable).
func (m *sandboxer) CreateSandbox(ctx context.Context, req *controldv1.CreateSandboxRequest) (*controldv1.Sandbox, *controldv1.Endpoint, error) {
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
func (m *sandboxer) recoverCreate(req *controldv1.CreateSandboxRequest) rules.Recover {
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

func (m *sandboxer) createSandbox(ctx context.Context, req *controldv1.CreateSandboxRequest, tag *store.RequestTag) (*controldv1.Sandbox, *controldv1.Endpoint, error) {
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
func (m *sandboxer) newSandbox(p sandboxParams, t0 time.Time) (*sandbox, error) {
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
func (m *sandboxer) registerSandbox(p sandboxParams, t0 time.Time, take func(*store.SandboxRecord) (runtime.BootSpec, bool), undo func(id string)) (*sandbox, bool, error) {
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
func (m *sandboxer) heldLocked() limits.Usage {
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
func (m *sandboxer) newRecord(p sandboxParams, t0 time.Time) (*store.SandboxRecord, error) {
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

func (m *sandboxer) bootSpec(sb *sandbox) runtime.BootSpec {
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
		// A fork slot is precreated from the same record: it starts
		// boosted too.
		StartupCPUWeight: startupCPUWeight(r),
	}
}

// forkStartupBoost is how much a replica of an on-demand fork outweighs
// running sandboxes for the CPU until it is usable.
const forkStartupBoost = 8

// startupCPUWeight is the CPU weight a replica of an on-demand fork starts
// with (0: its own). Its restore runs in its cgroup (runc puts CRIU there)
// and is CPU-bound: at a fan-out of N on a 2-core host, N restores shared
// the cores at equal weight with every running sandbox, the fork's source
// among them (a browser page that animates takes a third of a core), and
// with the replicas restored first, which run their apps while the last
// ones restore. Boosted 8 to 1, a fork takes the cores it needs, as a
// person waits for it; replicaFork.settleCPU gives each replica its own
// weight as soon as it is usable. Pool refills run in the background, at
// their own weight.
func startupCPUWeight(r *store.SandboxRecord) uint32 {
	if r.Sandbox.GetCheckpointId() == "" || r.Pooled {
		return 0
	}
	w := r.Sandbox.GetResources().GetCpuWeight()
	if w == 0 {
		w = 100 // the kernel's default
	}
	return min(w*forkStartupBoost, limits.MaxCPUWeight)
}

// GetSandbox returns one sandbox.
func (m *sandboxer) GetSandbox(_ context.Context, id string) (*controldv1.Sandbox, error) {
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
func (m *sandboxer) SandboxEndpoint(_ context.Context, id string) (*controldv1.Endpoint, error) {
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
func (m *sandboxer) ListSandboxes(_ context.Context, req *controldv1.ListSandboxesRequest) ([]*controldv1.Sandbox, string, error) {
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
func (m *sandboxer) WaitSandboxReady(ctx context.Context, id string, timeout *durationpb.Duration) (*controldv1.Sandbox, error) {
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
func (m *sandboxer) DeleteSandbox(ctx context.Context, id string) error {
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
func (m *sandboxer) deleteSandbox(ctx context.Context, sb *sandbox, why string) error {
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
func (m *sandboxer) forget(sb *sandbox) error {
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
func (m *sandboxer) SuspendSandbox(ctx context.Context, id string) (*controldv1.Sandbox, error) {
	return m.freezeThaw(ctx, id, true)
}

// ResumeSandbox thaws a SUSPENDED sandbox (idempotent when READY).
func (m *sandboxer) ResumeSandbox(ctx context.Context, id string) (*controldv1.Sandbox, error) {
	return m.freezeThaw(ctx, id, false)
}

func (m *sandboxer) freezeThaw(ctx context.Context, id string, freeze bool) (*controldv1.Sandbox, error) {
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

// tombstoneTTL is how long a deleted id still deletes successfully.
const tombstoneTTL = 10 * time.Minute

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
func (m *sandboxer) taggedSandboxes(key string) []*sandbox {
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
func (m *sandboxer) ExtendSandbox(_ context.Context, req *controldv1.ExtendSandboxRequest) (*controldv1.Sandbox, error) {
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
