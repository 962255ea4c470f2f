package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/forkfleet/forkfleet/api/aci/wire"
	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/guestsock"
	"github.com/forkfleet/forkfleet/api/netpolicy"
	"github.com/forkfleet/forkfleet/api/rules"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/store"
)

// markerDir is where checkpoint marker files go inside a sandbox: on the
// writable layer (not a tmpfs), so both tiers carry it into their forks.
const markerDir = "/var/lib/forkfleet/markers/"

// levelsFor is what a checkpoint can prove on its forks: the proofs it
// recorded.
func levelsFor(t controldv1.CheckpointTier, rec *store.CheckpointRecord) []controldv1.VerifyLevel {
	// A disk-tier fork boots fresh: only files survive.
	out := []controldv1.VerifyLevel{controldv1.VerifyLevel_VERIFY_LEVEL_MARKER}
	if t != controldv1.CheckpointTier_CHECKPOINT_TIER_DISK {
		out = append(out, controldv1.VerifyLevel_VERIFY_LEVEL_MEMORY, controldv1.VerifyLevel_VERIFY_LEVEL_PIXELS)
		if rec.NetPort != 0 {
			out = append(out, controldv1.VerifyLevel_VERIFY_LEVEL_NETWORK)
		}
	}
	if rec.FSDigest != nil {
		out = append(out, controldv1.VerifyLevel_VERIFY_LEVEL_FILESYSTEM)
	}
	return out
}

func tierToRuntime(t controldv1.CheckpointTier) runtime.CheckpointTier {
	if t == controldv1.CheckpointTier_CHECKPOINT_TIER_DISK {
		return runtime.TierDisk
	}
	return runtime.TierMemory
}

// CreateCheckpoint captures a READY sandbox. The record is written only
// after the runtime finished and the directory is in place under its final
// name.
func (m *Manager) CreateCheckpoint(ctx context.Context, req *controldv1.CreateCheckpointRequest) (*controldv1.Checkpoint, error) {
	resp, err := m.requests.Do(ctx, controldv1.CheckpointService_CreateCheckpoint_FullMethodName, req.GetRequestId(), req,
		func() proto.Message { return &controldv1.CreateCheckpointResponse{} }, m.recoverCheckpoint,
		func(ctx context.Context, r rules.Request) (proto.Message, error) {
			ck, err := m.createCheckpoint(ctx, req, requestTag(r))
			if err != nil {
				return nil, err
			}
			return &controldv1.CreateCheckpointResponse{Checkpoint: ck}, nil
		})
	if err != nil {
		return nil, err
	}
	return resp.(*controldv1.CreateCheckpointResponse).GetCheckpoint(), nil
}

// recoverCheckpoint answers a repeated CreateCheckpoint with the checkpoint
// its first call committed (controld restarted before it answered).
func (m *Manager) recoverCheckpoint(_ context.Context, key string, fp []byte) (proto.Message, bool, error) {
	m.mu.Lock()
	var found *store.CheckpointRecord
	for _, c := range m.checkpoints {
		if r := c.Request; r != nil && r.Key == key && time.Since(c.Checkpoint.GetCreatedAt().AsTime()) <= rules.RequestIDTTL {
			found = c
		}
	}
	m.mu.Unlock()
	if found == nil {
		return nil, false, nil
	}
	if err := rules.CheckFingerprint(key, fp, found.Request.Fingerprint); err != nil {
		return nil, false, err
	}
	ck, err := m.checkpointView(found.Checkpoint.Id)
	if err != nil {
		return nil, false, nil // deleted meanwhile: a new one
	}
	return &controldv1.CreateCheckpointResponse{Checkpoint: ck}, true, nil
}

func (m *Manager) createCheckpoint(ctx context.Context, req *controldv1.CreateCheckpointRequest, tag *store.RequestTag) (*controldv1.Checkpoint, error) {
	start := time.Now()
	if err := rules.SandboxID("sandbox_id", req.GetSandboxId()); err != nil {
		return nil, err
	}
	tier, err := rules.Tier("tier", req.GetTier())
	if err != nil {
		return nil, err
	}
	if err := rules.Name("name", req.GetName()); err != nil {
		return nil, err
	}
	if err := rules.Labels("labels", req.GetLabels()); err != nil {
		return nil, err
	}
	sb, err := m.lookup(req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	sb.op.Lock()
	defer sb.op.Unlock()
	m.mu.Lock()
	src := cloneRecord(sb.rec)
	deleting := sb.deleting
	m.mu.Unlock()
	switch {
	case deleting:
		return nil, sandboxNotFound(req.GetSandboxId())
	case src.Pooled:
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "SANDBOX_POOLED", "sandbox %s is held by its pool; claim it first", src.Sandbox.Id)
	case src.Sandbox.State != controldv1.SandboxState_SANDBOX_STATE_READY:
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "SANDBOX_WRONG_STATE",
			"sandbox %s is %s; only a READY sandbox can be checkpointed", src.Sandbox.Id, src.Sandbox.State)
	}
	if req.GetName() != "" {
		if _, err := m.findCheckpoint(req.GetName()); err == nil {
			return nil, errdefs.WithReason(errdefs.ErrAlreadyExists, "CHECKPOINT_NAME_TAKEN", "a checkpoint named %q exists", req.GetName())
		}
	}

	id := rules.NewID(rules.PrefixCheckpoint)
	ctx, span := m.tracer.Start(ctx, "checkpoint.create", trace.WithAttributes(
		attribute.String("checkpoint.id", id), attribute.String("sandbox.id", src.Sandbox.Id), attribute.String("tier", tier.String())))
	defer span.End()
	fail := func(err error) (*controldv1.Checkpoint, error) {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return nil, err
	}

	rec := &store.CheckpointRecord{
		Env:         copyMap(src.Env),
		AdminToken:  src.AdminToken,
		Generation:  src.Sandbox.Generation,
		MarkerPath:  markerDir + id,
		MarkerValue: []byte(newToken()),
	}
	if tier == controldv1.CheckpointTier_CHECKPOINT_TIER_MEMORY {
		rec.MemoryValue = randomBytes(32)
		rec.NetValue = randomBytes(32)
	}
	tmp := m.tmpCheckpointDir(id)
	spec := runtime.CheckpointSpec{
		Dir:  tmp,
		Tier: tierToRuntime(tier),
		Stop: req.GetStop(),
		BeforeFreeze: func(ctx context.Context) error {
			return m.prepareCheckpointGuest(ctx, sb, src, rec)
		},
	}
	rctx, rspan := m.tracer.Start(ctx, "checkpoint.runtime")
	res, err := m.rt.Checkpoint(rctx, src.Sandbox.Id, spec)
	rspan.End()
	m.setCheckpointing(sb, false)
	if tier == controldv1.CheckpointTier_CHECKPOINT_TIER_MEMORY && !req.GetStop() {
		// Lifted while the checkpoint is published; done before the reply,
		// so an agent reconnecting right after it is let in.
		lifted := make(chan struct{})
		go func() {
			defer close(lifted)
			m.liftCheckpointHold(ctx, src.ACISocket, src.AdminToken, src.Sandbox.Id)
		}()
		defer func() { <-lifted }()
	}
	if err != nil {
		os.RemoveAll(tmp) // the runtime removes it on failure; make sure
		return fail(fmt.Errorf("checkpoint %s: %w", src.Sandbox.Id, err))
	}
	final := m.checkpointDirFor(id)
	if err := os.Rename(tmp, final); err != nil {
		m.dropRuntimeCheckpoint(res.Ref, tmp)
		return fail(fmt.Errorf("checkpoint %s: publish dir: %w", id, err))
	}
	if err := syncDir(m.opts.CheckpointDir); err != nil {
		m.dropRuntimeCheckpoint(res.Ref, final)
		return fail(fmt.Errorf("checkpoint %s: sync dir: %w", id, err))
	}
	if res.Ref.Dir == "" || res.Ref.Dir == tmp {
		res.Ref.Dir = final
	}
	if res.Ref.Tier == 0 {
		res.Ref.Tier = tierToRuntime(tier)
	}
	if res.Ref.Image == "" {
		res.Ref.Image = src.Sandbox.Image
	}
	rec.Ref = res.Ref
	rec.Checkpoint = &controldv1.Checkpoint{
		Id:                 id,
		Name:               req.GetName(),
		Tier:               tier,
		State:              controldv1.CheckpointState_CHECKPOINT_STATE_READY,
		SourceSandboxId:    src.Sandbox.Id,
		ParentCheckpointId: src.Sandbox.CheckpointId,
		Image:              src.Sandbox.Image,
		RunAsRoot:          src.Sandbox.GetRunAsRoot(),
		Screen:             proto.Clone(src.Sandbox.Screen).(*controldv1.Screen),
		Resources:          proto.Clone(src.Sandbox.Resources).(*controldv1.Resources),
		Labels:             copyMap(req.GetLabels()),
		CreatedAt:          timestamppb.New(start),
		MemoryBytes:        res.MemoryBytes,
		LayerBytes:         res.LayerBytes,
		Timing: &controldv1.CheckpointTiming{
			Frozen: durationpb.New(res.Frozen), Dump: durationpb.New(res.Dump),
			Layer: durationpb.New(res.Layer), Total: durationpb.New(time.Since(start)),
		},
		Network: netpolicy.Normalize(src.Sandbox.GetNetwork()),
	}
	rec.FSDigest = res.FSDigest
	rec.Request = tag
	rec.Checkpoint.VerifyLevels = levelsFor(tier, rec)
	if err := m.commitCheckpoint(rec); err != nil {
		m.dropRuntimeCheckpoint(res.Ref, final)
		return fail(err)
	}
	// Its first fork finds a container precreated too.
	m.forkSlotsExpect(id)
	tl := tierLabel(tier)
	m.metrics.CheckpointTotal.WithLabelValues(tl).Observe(time.Since(start).Seconds())
	m.metrics.CheckpointFrozen.WithLabelValues(tl).Observe(res.Frozen.Seconds())
	if tier == controldv1.CheckpointTier_CHECKPOINT_TIER_MEMORY {
		m.metrics.CheckpointStep.WithLabelValues("dump", tl).Observe(res.Dump.Seconds())
		m.metrics.CheckpointBytes.WithLabelValues(tl, "memory").Observe(float64(res.MemoryBytes))
	}
	m.metrics.CheckpointStep.WithLabelValues("layer", tl).Observe(res.Layer.Seconds())
	m.metrics.CheckpointBytes.WithLabelValues(tl, "layer").Observe(float64(res.LayerBytes))
	if req.GetStop() {
		if _, err := m.update(sb, controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_STATE, nil, func(r *store.SandboxRecord) {
			r.Sandbox.State = controldv1.SandboxState_SANDBOX_STATE_STOPPED
			r.Sandbox.StatusMessage = "stopped by checkpoint " + id
		}); err != nil {
			m.log.Error("persist stopped source", "sandbox", src.Sandbox.Id, "err", err)
		}
	}
	return m.checkpointView(id)
}

// prepareCheckpointGuest readies a sandbox for its dump, while the runtime
// prepares the checkpoint's layer: it records the proofs (the marker file,
// the memory value) over one admin session, closes every connection from
// outside (CRIU would have to dump them), and records the settled frame. The
// session is closed before it returns: it would be part of the dump too.
func (m *Manager) prepareCheckpointGuest(ctx context.Context, sb *sandbox, src *store.SandboxRecord, rec *store.CheckpointRecord) error {
	ctx, span := m.tracer.Start(ctx, "checkpoint.before_freeze")
	defer span.End()
	g, err := m.dialGuest(ctx, src.ACISocket, src.AdminToken)
	if err != nil {
		return err
	}
	defer g.Close()
	// The proofs are sent without waiting for each other or for the
	// preparation (guestd runs a session's requests in order): only their
	// round trips overlap.
	proofs := make(chan error, 1)
	go func() {
		if err := g.PutFile(ctx, rec.MarkerPath, rec.MarkerValue, 0o600); err != nil {
			proofs <- fmt.Errorf("write marker: %w", err)
			return
		}
		if rec.MemoryValue != nil {
			if err := g.MemoryMark(ctx, rec.MemoryValue); err != nil {
				proofs <- fmt.Errorf("memory mark: %w", err)
				return
			}
		}
		if rec.NetValue != nil {
			// The listener CRIU carries into every replica; a guestd that
			// cannot hold one leaves the checkpoint without the network
			// proof (and says why), not without a checkpoint.
			port, err := g.NetProbeListen(ctx, rec.NetValue)
			if err != nil {
				m.log.Warn("checkpoint without the network proof", "sandbox", src.Sandbox.Id, "err", err)
				rec.NetValue = nil
			}
			rec.NetPort = port
		}
		proofs <- nil
	}()
	prepared := func() error {
		// No connection from outside may be open at the dump: ours, and
		// agents' through the gateway or guestd's socket (they reconnect
		// afterwards).
		m.setCheckpointing(sb, true)
		if m.opts.DropConnections != nil {
			m.opts.DropConnections(src.Sandbox.Id)
		}
		if rec.MemoryValue == nil {
			return nil
		}
		// With every agent gone only the apps can still draw: the hash of a
		// settled screen here is the frame the freeze captures, the pixel
		// proof of every replica.
		h, err := g.CheckpointPrepare(ctx, checkpointHold, m.opts.FrameSettle)
		if err != nil {
			return fmt.Errorf("prepare guest: %w", err)
		}
		rec.FrameHash = h
		return nil
	}()
	if err := errors.Join(<-proofs, prepared); err != nil {
		return err
	}
	return g.Close()
}

// checkpointHold bounds how long guestd refuses agent sessions around a dump
// should controld fail to lift the hold.
const checkpointHold = 10 * time.Second

// liftCheckpointHold lets agents reconnect to a source that runs on. Best
// effort: the hold expires by itself.
func (m *Manager) liftCheckpointHold(ctx context.Context, socket guestsock.Addr, token, id string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	g, err := m.dialGuest(ctx, socket, token)
	if err == nil {
		err = g.CheckpointDone(ctx)
		g.Close()
	}
	if err != nil {
		m.log.Warn("lift checkpoint hold", "sandbox", id, "err", err)
	}
}

func (m *Manager) setCheckpointing(sb *sandbox, v bool) {
	m.mu.Lock()
	sb.checkpointing = v
	m.mu.Unlock()
}

// commitCheckpoint writes a new checkpoint record together with its
// parent's child list, in one transaction.
func (m *Manager) commitCheckpoint(rec *store.CheckpointRecord) error {
	m.ckMu.Lock()
	defer m.ckMu.Unlock()
	m.mu.Lock()
	if n := rec.Checkpoint.Name; n != "" {
		for _, c := range m.checkpoints {
			if c.Checkpoint.Name == n {
				m.mu.Unlock()
				return errdefs.WithReason(errdefs.ErrAlreadyExists, "CHECKPOINT_NAME_TAKEN", "a checkpoint named %q exists", n)
			}
		}
	}
	var parent *store.CheckpointRecord
	if p, ok := m.checkpoints[rec.Checkpoint.ParentCheckpointId]; ok {
		parent = cloneCheckpoint(p)
		parent.Checkpoint.ChildIds = append(parent.Checkpoint.ChildIds, rec.Checkpoint.Id)
	}
	m.mu.Unlock()
	err := m.st.Update(func(tx *store.Tx) error {
		if parent != nil {
			if err := tx.PutCheckpoint(parent); err != nil {
				return err
			}
		}
		return tx.PutCheckpoint(rec)
	})
	if err != nil {
		return fmt.Errorf("checkpoint %s: persist: %w", rec.Checkpoint.Id, err)
	}
	m.mu.Lock()
	m.checkpoints[rec.Checkpoint.Id] = rec
	if parent != nil {
		m.checkpoints[parent.Checkpoint.Id] = parent
	}
	m.mu.Unlock()
	return nil
}

func cloneCheckpoint(r *store.CheckpointRecord) *store.CheckpointRecord {
	c := *r
	c.Checkpoint = proto.Clone(r.Checkpoint).(*controldv1.Checkpoint)
	return &c
}

// dropRuntimeCheckpoint undoes a runtime checkpoint that never got a record.
func (m *Manager) dropRuntimeCheckpoint(ref runtime.CheckpointRef, dir string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(m.ctx), time.Minute)
	defer cancel()
	ref.Dir = dir
	if err := m.rt.DeleteCheckpoint(ctx, ref); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		m.log.Error("release unrecorded checkpoint", "dir", dir, "err", err)
	}
	os.RemoveAll(dir)
}

// findCheckpoint resolves an id or a name.
func (m *Manager) findCheckpoint(idOrName string) (*store.CheckpointRecord, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c, ok := m.checkpoints[idOrName]; ok {
		return c, nil
	}
	for _, c := range m.checkpoints {
		if c.Checkpoint.Name == idOrName {
			return c, nil
		}
	}
	return nil, checkpointNotFound(idOrName)
}

// checkpointView returns the public record with its live fork count.
func (m *Manager) checkpointView(id string) (*controldv1.Checkpoint, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.checkpoints[id]
	if !ok {
		return nil, checkpointNotFound(id)
	}
	return m.checkpointViewLocked(c), nil
}

func (m *Manager) checkpointViewLocked(c *store.CheckpointRecord) *controldv1.Checkpoint {
	v := proto.Clone(c.Checkpoint).(*controldv1.Checkpoint)
	v.LiveForks = uint32(m.liveForksLocked(c.Checkpoint.Id))
	// This host holds it, whichever host took it (an import's record says
	// its source's).
	v.Host = m.opts.Host
	return v
}

func (m *Manager) liveForksLocked(ckID string) int {
	n := 0
	for _, sb := range m.sandboxes {
		if sb.rec.Sandbox.CheckpointId == ckID && !sb.deleting {
			n++
		}
	}
	return n
}

// GetCheckpoint returns a checkpoint by id or name.
func (m *Manager) GetCheckpoint(_ context.Context, idOrName string) (*controldv1.Checkpoint, error) {
	if err := rules.CheckpointRef("id", idOrName); err != nil {
		return nil, err
	}
	c, err := m.findCheckpoint(idOrName)
	if err != nil {
		return nil, err
	}
	return m.checkpointView(c.Checkpoint.Id)
}

// ListCheckpoints returns checkpoints matching every label, limited to the
// tree under root_id when set, oldest first.
// ListCheckpoints returns the page of matching checkpoints the request asks
// for (oldest first) and the next page's token.
func (m *Manager) ListCheckpoints(_ context.Context, req *controldv1.ListCheckpointsRequest) ([]*controldv1.Checkpoint, string, error) {
	if err := rules.Labels("labels", req.GetLabels()); err != nil {
		return nil, "", err
	}
	var within map[string]bool
	if root := req.GetRootId(); root != "" {
		if err := rules.CheckpointRef("root_id", root); err != nil {
			return nil, "", err
		}
		c, err := m.findCheckpoint(root)
		if err != nil {
			return nil, "", err
		}
		m.mu.Lock()
		within = m.subtreeLocked(c.Checkpoint.Id)
		m.mu.Unlock()
	}
	m.mu.Lock()
	var out []*controldv1.Checkpoint
	for id, c := range m.checkpoints {
		if within != nil && !within[id] {
			continue
		}
		if !rules.MatchLabels(c.Checkpoint.Labels, req.GetLabels()) {
			continue
		}
		out = append(out, m.checkpointViewLocked(c))
	}
	m.mu.Unlock()
	return rules.Page(out, rules.CheckpointKey, req.GetPageSize(), req.GetPageToken(), req)
}

// subtreeLocked returns root and its descendants.
func (m *Manager) subtreeLocked(root string) map[string]bool {
	seen := map[string]bool{}
	queue := []string{root}
	for len(queue) > 0 {
		id := queue[0]
		queue = queue[1:]
		if seen[id] {
			continue
		}
		seen[id] = true
		if c, ok := m.checkpoints[id]; ok {
			queue = append(queue, c.Checkpoint.ChildIds...)
		}
	}
	return seen
}

// DeleteCheckpoint removes a checkpoint (and with cascade its descendants,
// deepest first). Refused while children exist without cascade, while a
// pool forks from it, or while forks of it run.
func (m *Manager) DeleteCheckpoint(ctx context.Context, idOrName string, cascade bool) ([]string, error) {
	if err := rules.CheckpointRef("id", idOrName); err != nil {
		return nil, err
	}
	m.ckMu.Lock()
	defer m.ckMu.Unlock()
	c, err := m.findCheckpoint(idOrName)
	if err != nil {
		return nil, err
	}
	id := c.Checkpoint.Id
	m.mu.Lock()
	if n := len(c.Checkpoint.ChildIds); n > 0 && !cascade {
		m.mu.Unlock()
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "CHECKPOINT_HAS_CHILDREN",
			"checkpoint %s has %d child checkpoints; delete them first or set cascade", id, n)
	}
	// Post-order: children before parents.
	var order []string
	var walk func(string)
	walk = func(x string) {
		if cc, ok := m.checkpoints[x]; ok {
			for _, ch := range cc.Checkpoint.ChildIds {
				walk(ch)
			}
		}
		order = append(order, x)
	}
	walk(id)
	for _, x := range order {
		if n := m.liveForksLocked(x); n > 0 {
			m.mu.Unlock()
			return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "CHECKPOINT_IN_USE",
				"checkpoint %s has %d live forks; delete them first", x, n)
		}
		for _, p := range m.pools {
			if p.rec.Pool.CheckpointId == x {
				m.mu.Unlock()
				return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "CHECKPOINT_IN_USE",
					"checkpoint %s feeds pool %s; delete the pool first", x, p.rec.Pool.Id)
			}
		}
	}
	m.mu.Unlock()
	var deleted []string
	for _, x := range order {
		if err := m.deleteOneCheckpoint(ctx, x); err != nil {
			return deleted, err
		}
		deleted = append(deleted, x)
	}
	return deleted, nil
}

func (m *Manager) deleteOneCheckpoint(ctx context.Context, id string) error {
	ctx = context.WithoutCancel(ctx)
	m.mu.Lock()
	c, ok := m.checkpoints[id]
	var parent *store.CheckpointRecord
	if ok {
		if p, pok := m.checkpoints[c.Checkpoint.ParentCheckpointId]; pok {
			parent = cloneCheckpoint(p)
			kids := parent.Checkpoint.ChildIds[:0:0]
			for _, k := range parent.Checkpoint.ChildIds {
				if k != id {
					kids = append(kids, k)
				}
			}
			parent.Checkpoint.ChildIds = kids
		}
	}
	m.mu.Unlock()
	if !ok {
		return nil
	}
	m.dropForkSlots(id)
	if err := m.rt.DeleteCheckpoint(ctx, c.Ref); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return fmt.Errorf("checkpoint %s: %w", id, err)
	}
	if err := os.RemoveAll(c.Ref.Dir); err != nil {
		return fmt.Errorf("checkpoint %s: remove dir: %w", id, err)
	}
	if err := m.st.Update(func(tx *store.Tx) error {
		if parent != nil {
			if err := tx.PutCheckpoint(parent); err != nil {
				return err
			}
		}
		return tx.DeleteCheckpoint(id)
	}); err != nil {
		return fmt.Errorf("checkpoint %s: remove record: %w", id, err)
	}
	m.mu.Lock()
	delete(m.checkpoints, id)
	if parent != nil {
		m.checkpoints[parent.Checkpoint.Id] = parent
	}
	m.mu.Unlock()
	return nil
}

// VerifySandbox runs the verifiers of the sandbox's checkpoint against it.
func (m *Manager) VerifySandbox(ctx context.Context, req *controldv1.VerifySandboxRequest) ([]*controldv1.VerifyResult, error) {
	if err := rules.SandboxID("id", req.GetId()); err != nil {
		return nil, err
	}
	sb, err := m.lookup(req.GetId())
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	rec := cloneRecord(sb.rec)
	m.mu.Unlock()
	if rec.Sandbox.CheckpointId == "" {
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "NOT_A_FORK", "sandbox %s was not forked from a checkpoint", rec.Sandbox.Id)
	}
	ck, err := m.findCheckpoint(rec.Sandbox.CheckpointId)
	if err != nil {
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "CHECKPOINT_GONE", "checkpoint %s of sandbox %s no longer exists", rec.Sandbox.CheckpointId, rec.Sandbox.Id)
	}
	levels, err := rules.VerifyLevels("levels", req.GetLevels(), ck.Checkpoint.VerifyLevels)
	if err != nil {
		return nil, err
	}
	if rec.Sandbox.State != controldv1.SandboxState_SANDBOX_STATE_READY {
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "SANDBOX_WRONG_STATE", "sandbox %s is %s, must be READY", rec.Sandbox.Id, rec.Sandbox.State)
	}
	g, err := m.dialGuest(ctx, rec.ACISocket, rec.AdminToken)
	if err != nil {
		return nil, err
	}
	defer g.Close()
	return m.verify(ctx, g, rec.Sandbox.Id, ck, levels, nil), nil
}

// verify runs the requested verifiers; each reports its own outcome, in
// the order of levels. They are independent reads over one session (Guest
// methods may be called concurrently), so they run at once: a fork is
// usable after the slowest proof, not after their sum. born, for a fresh
// replica, delivers the hash of its first frame from Restored (see
// verifyPixels).
func (m *Manager) verify(ctx context.Context, g Guest, id string, ck *store.CheckpointRecord, levels []controldv1.VerifyLevel, born <-chan []byte) []*controldv1.VerifyResult {
	out := make([]*controldv1.VerifyResult, len(levels))
	done := make(chan struct{}, len(levels))
	for i, l := range levels {
		go func() {
			defer func() { done <- struct{}{} }()
			start := time.Now()
			ok, detail := m.verifyOne(ctx, g, id, ck, l, born)
			out[i] = &controldv1.VerifyResult{Level: l, Ok: ok, Detail: detail, Took: durationpb.New(time.Since(start))}
		}()
	}
	for range levels {
		<-done
	}
	return out
}

func (m *Manager) verifyOne(ctx context.Context, g Guest, id string, ck *store.CheckpointRecord, l controldv1.VerifyLevel, born <-chan []byte) (bool, string) {
	ctx, span := m.tracer.Start(ctx, "verify."+l.String())
	defer span.End()
	switch l {
	case controldv1.VerifyLevel_VERIFY_LEVEL_MARKER:
		got, err := g.GetFile(ctx, ck.MarkerPath)
		if err != nil {
			return false, fmt.Sprintf("read %s: %v", ck.MarkerPath, err)
		}
		if !bytes.Equal(got, ck.MarkerValue) {
			return false, fmt.Sprintf("%s holds %d bytes that differ from the marker written at checkpoint", ck.MarkerPath, len(got))
		}
		return true, "marker file reads back"
	case controldv1.VerifyLevel_VERIFY_LEVEL_MEMORY:
		nonce := randomBytes(32)
		got, err := g.MemoryChallenge(ctx, nonce)
		if err != nil {
			return false, fmt.Sprintf("memory challenge: %v", err)
		}
		if !wire.ProofOK(ck.MemoryValue, nonce, got) {
			return false, "memory challenge answer does not match the value marked before the checkpoint"
		}
		return true, "in-memory value answers a fresh challenge"
	case controldv1.VerifyLevel_VERIFY_LEVEL_PIXELS:
		return m.verifyPixels(ctx, g, ck, born)
	case controldv1.VerifyLevel_VERIFY_LEVEL_NETWORK:
		nonce := randomBytes(32)
		got, err := g.NetProbe(ctx, ck.NetPort, nonce)
		if err != nil {
			return false, fmt.Sprintf("connect to the restored listener 127.0.0.1:%d from inside the replica: %v", ck.NetPort, err)
		}
		if !wire.ProofOK(ck.NetValue, nonce, got) {
			return false, fmt.Sprintf("the listener on 127.0.0.1:%d answered, but not with the checkpoint's value", ck.NetPort)
		}
		return true, fmt.Sprintf("the restored listener on 127.0.0.1:%d accepts over the replica's loopback", ck.NetPort)
	case controldv1.VerifyLevel_VERIFY_LEVEL_FILESYSTEM:
		d, ok := runtime.As[runtime.LayerDigester](m.rt)
		if !ok {
			return false, "the runtime cannot digest a sandbox's files"
		}
		got, err := d.LayerDigest(ctx, id)
		if err != nil {
			return false, fmt.Sprintf("filesystem digest: %v", err)
		}
		if !bytes.Equal(got, ck.FSDigest) {
			return false, fmt.Sprintf("filesystem digest %x differs from %x at checkpoint", got, ck.FSDigest)
		}
		return true, "the files outside volatile paths are the checkpoint's"
	}
	return false, fmt.Sprintf("unknown level %s", l)
}

// verifyPixels proves the replica's screen is the checkpoint's. A fresh
// replica reports its first frame with Restored: guestd captured it under
// the X server grab the dump carried, before any app of the replica drew,
// so it is the exact frame of the checkpoint on a page that animates too,
// and any difference fails. Without it (a live replica re-verified, or a
// checkpoint whose guestd predates the grab) the replica's current screen
// is compared: at once, then after it has been still for FrameSettle.
func (m *Manager) verifyPixels(ctx context.Context, g Guest, ck *store.CheckpointRecord, born <-chan []byte) (bool, string) {
	if born != nil {
		var first []byte
		select {
		case first = <-born:
		case <-ctx.Done():
			return false, fmt.Sprintf("first frame: %v", ctx.Err())
		}
		if len(first) > 0 {
			if !bytes.Equal(first, ck.FrameHash) {
				return false, fmt.Sprintf("first frame hash %x differs from %x recorded at checkpoint", first, ck.FrameHash)
			}
			return true, "first frame hash equals the checkpoint's"
		}
	}
	{
		got, err := g.FrameHash(ctx, 0)
		if err == nil && bytes.Equal(got, ck.FrameHash) {
			return true, "frame hash equals the checkpoint's"
		}
		got, err = g.FrameHash(ctx, m.opts.FrameSettle)
		if err != nil {
			return false, fmt.Sprintf("frame hash: %v", err)
		}
		if !bytes.Equal(got, ck.FrameHash) {
			return false, fmt.Sprintf("settled frame hash %x differs from %x recorded at checkpoint", got, ck.FrameHash)
		}
		return true, "settled frame hash equals the checkpoint's"
	}
}

// exportedCheckpoint is the metadata an exported checkpoint image carries.
type exportedCheckpoint struct {
	Version int                     `json:"version"`
	Record  *store.CheckpointRecord `json:"record"`
}

// ExportCheckpoint writes a checkpoint as an OCI image (runtime permitting).
func (m *Manager) ExportCheckpoint(ctx context.Context, req *controldv1.ExportCheckpointRequest) (*controldv1.ExportCheckpointResponse, error) {
	if err := rules.CheckpointRef("id", req.GetId()); err != nil {
		return nil, err
	}
	if req.GetReference() == "" {
		return nil, errdefs.InvalidField("reference", "required")
	}
	if err := rules.Image("reference", req.GetReference()); err != nil {
		return nil, err
	}
	c, err := m.findCheckpoint(req.GetId())
	if err != nil {
		return nil, err
	}
	ex, err := exporterOf(m.rt)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	rec := cloneCheckpoint(c)
	m.mu.Unlock()
	rec.Checkpoint.ChildIds = nil
	meta, err := json.Marshal(exportedCheckpoint{Version: 1, Record: rec})
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: encode metadata: %w", rec.Checkpoint.Id, err)
	}
	ctx, span := m.tracer.Start(ctx, "checkpoint.export")
	defer span.End()
	var reg runtime.CheckpointRegistry
	if req.GetPush() {
		if reg, err = registryOf(m.rt); err != nil {
			return nil, err
		}
	}
	res, err := ex.ExportCheckpoint(ctx, rec.Ref, meta, req.GetReference())
	if err != nil {
		return nil, fmt.Errorf("export checkpoint %s: %w", rec.Checkpoint.Id, err)
	}
	resp := &controldv1.ExportCheckpointResponse{Reference: res.Reference, Digest: res.Digest, SizeBytes: res.SizeBytes}
	if reg != nil {
		if resp.PushedBytes, err = m.push(ctx, reg, req.GetReference()); err != nil {
			return nil, fmt.Errorf("push checkpoint %s: %w", rec.Checkpoint.Id, err)
		}
	}
	return resp, nil
}

// ImportCheckpoint materialises an exported checkpoint image as a new local
// checkpoint (a new id; proofs, labels and name kept), pulling it from its
// registry first when asked.
func (m *Manager) ImportCheckpoint(ctx context.Context, req *controldv1.ImportCheckpointRequest) (*controldv1.ImportCheckpointResponse, error) {
	if req.GetReference() == "" {
		return nil, errdefs.InvalidField("reference", "required")
	}
	if err := rules.Image("reference", req.GetReference()); err != nil {
		return nil, err
	}
	resp := &controldv1.ImportCheckpointResponse{}
	if req.GetPull() {
		reg, err := registryOf(m.rt)
		if err != nil {
			return nil, err
		}
		resp.PulledBytes, err = m.pull(ctx, reg, req.GetReference())
		if err != nil {
			return nil, fmt.Errorf("pull %s: %w", req.GetReference(), err)
		}
	}
	ck, err := m.importCheckpoint(ctx, req.GetReference(), "")
	if err != nil {
		return nil, err
	}
	resp.Checkpoint = ck
	return resp, nil
}

// importCheckpoint imports the image name from the content store. With
// digest (a fork's import of a registry checkpoint) the checkpoint is a
// cache of that image: it takes no name and records the digest.
func (m *Manager) importCheckpoint(ctx context.Context, name, digest string) (*controldv1.Checkpoint, error) {
	ex, err := exporterOf(m.rt)
	if err != nil {
		return nil, err
	}
	ctx, span := m.tracer.Start(ctx, "checkpoint.import")
	defer span.End()
	id := rules.NewID(rules.PrefixCheckpoint)
	tmp := m.tmpCheckpointDir(id)
	ref, meta, err := ex.ImportCheckpoint(ctx, name, tmp)
	if err != nil {
		os.RemoveAll(tmp)
		return nil, fmt.Errorf("import %s: %w", name, err)
	}
	var ec exportedCheckpoint
	if err := json.Unmarshal(meta, &ec); err != nil || ec.Record == nil || ec.Record.Checkpoint == nil {
		m.dropRuntimeCheckpoint(ref, tmp)
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "NOT_A_CHECKPOINT_IMAGE",
			"%s carries no forkfleet checkpoint metadata", name)
	}
	final := m.checkpointDirFor(id)
	if err := os.Rename(tmp, final); err != nil {
		m.dropRuntimeCheckpoint(ref, tmp)
		return nil, fmt.Errorf("import %s: publish dir: %w", name, err)
	}
	if err := syncDir(m.opts.CheckpointDir); err != nil {
		m.dropRuntimeCheckpoint(ref, final)
		return nil, fmt.Errorf("import %s: %w", name, err)
	}
	if ref.Dir == "" || ref.Dir == tmp {
		ref.Dir = final
	}
	rec := ec.Record
	rec.Ref = ref
	rec.Checkpoint.Id = id
	rec.Checkpoint.ChildIds = nil
	rec.Checkpoint.LiveForks = 0
	rec.Checkpoint.State = controldv1.CheckpointState_CHECKPOINT_STATE_READY
	rec.ImportedDigest = ""
	if digest != "" {
		rec.Checkpoint.Name, rec.ImportedDigest = "", digest
	}
	m.mu.Lock()
	if _, ok := m.checkpoints[rec.Checkpoint.ParentCheckpointId]; !ok {
		rec.Checkpoint.ParentCheckpointId = ""
	}
	m.mu.Unlock()
	if err := m.commitCheckpoint(rec); err != nil {
		m.dropRuntimeCheckpoint(ref, final)
		return nil, err
	}
	// Its first fork finds a container precreated too, as a local
	// checkpoint's does.
	m.forkSlotsExpect(id)
	return m.checkpointView(id)
}

// tierLabel is a tier as a metric label: "memory" or "disk".
func tierLabel(t controldv1.CheckpointTier) string {
	if t == controldv1.CheckpointTier_CHECKPOINT_TIER_DISK {
		return "disk"
	}
	return "memory"
}
