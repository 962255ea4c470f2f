package fleet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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

// checkpointer is the checkpoints concern: creating one from a running
// sandbox (checkpoint.go) and the tree of them (checkpoint_tree.go: get,
// list, delete). Manager promotes its API; transfer moves its checkpoints
// in and out of the host.
type checkpointer struct {
	*registry
	// A new checkpoint becomes its fork slots' most recent one, a deleted
	// one takes its fork slots along, and a pool's own one is the pool's
	// to delete.
	*warmer
	*pooler
}

// CreateCheckpoint captures a READY sandbox. The record is written only
// after the runtime finished and the directory is in place under its final
// name.
func (m *checkpointer) CreateCheckpoint(ctx context.Context, req *controldv1.CreateCheckpointRequest) (*controldv1.Checkpoint, error) {
	resp, err := m.requests.Do(ctx, controldv1.CheckpointService_CreateCheckpoint_FullMethodName, req.GetRequestId(), req,
		func() proto.Message { return &controldv1.CreateCheckpointResponse{} }, m.recoverCheckpoint,
		func(ctx context.Context, r rules.Request) (proto.Message, error) {
			ck, err := m.createCheckpoint(ctx, req, requestTag(r), "")
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
func (m *checkpointer) recoverCheckpoint(_ context.Context, key string, fp []byte) (proto.Message, bool, error) {
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

// createCheckpoint checkpoints a READY sandbox in steps: check the request
// and the source, dump it through the runtime into a temporary directory,
// publish the directory under the checkpoint's id, record the checkpoint,
// and count it. With pool set, the source is a member of that image pool
// and the checkpoint is the pool's own (see pool_checkpoint.go).
func (m *checkpointer) createCheckpoint(ctx context.Context, req *controldv1.CreateCheckpointRequest, tag *store.RequestTag, pool string) (*controldv1.Checkpoint, error) {
	start := time.Now()
	tier, err := checkCreateCheckpoint(req)
	if err != nil {
		return nil, err
	}
	sb, err := m.lookup(req.GetSandboxId())
	if err != nil {
		return nil, err
	}
	sb.op.Lock()
	defer sb.op.Unlock()
	c := &newCheckpoint{m: m, req: req, tag: tag, tier: tier, start: start, sb: sb, pool: pool}
	if err := c.checkSource(); err != nil {
		return nil, err
	}
	src := c.src

	id := rules.NewID(rules.PrefixCheckpoint)
	ctx, span := m.tracer.Start(ctx, "checkpoint.create", trace.WithAttributes(
		attribute.String("checkpoint.id", id), attribute.String("sandbox.id", src.Sandbox.Id), attribute.String("tier", tier.String())))
	defer span.End()
	fail := func(err error) (*controldv1.Checkpoint, error) {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		return nil, err
	}

	c.id, c.rec = id, newCheckpointRecord(id, src, tier)
	res, liftWait, err := c.dump(ctx)
	defer liftWait()
	if err != nil {
		return fail(err)
	}
	final, err := c.publishDir(&res)
	if err != nil {
		return fail(err)
	}
	if res.Ref.Tier == 0 {
		res.Ref.Tier = tierToRuntime(tier)
	}
	if res.Ref.Image == "" {
		res.Ref.Image = src.Sandbox.Image
	}
	c.describe(res)
	if err := m.commitCheckpoint(c.rec); err != nil {
		m.dropRuntimeCheckpoint(res.Ref, final)
		return fail(err)
	}
	// Its first fork finds a container precreated too. A pool's own
	// checkpoint gets fork slots when its misses fork from it, not before.
	if pool == "" {
		m.forkSlotsExpect(id)
	}
	c.observe(res)
	if req.GetStop() {
		c.markSourceStopped()
	}
	return m.checkpointView(id)
}

// newCheckpoint is one CreateCheckpoint in progress: what its steps share.
type newCheckpoint struct {
	m     *checkpointer
	id    string
	req   *controldv1.CreateCheckpointRequest
	tag   *store.RequestTag
	tier  controldv1.CheckpointTier
	start time.Time
	sb    *sandbox             // the source; the caller holds sb.op
	src   *store.SandboxRecord // a copy of its record
	rec   *store.CheckpointRecord
	pool  string // the image pool whose own checkpoint this is, or ""
}

// checkCreateCheckpoint validates a CreateCheckpointRequest and returns its
// tier.
func checkCreateCheckpoint(req *controldv1.CreateCheckpointRequest) (controldv1.CheckpointTier, error) {
	if err := rules.SandboxID("sandbox_id", req.GetSandboxId()); err != nil {
		return 0, err
	}
	tier, err := rules.Tier("tier", req.GetTier())
	if err != nil {
		return 0, err
	}
	if err := rules.Name("name", req.GetName()); err != nil {
		return 0, err
	}
	if err := rules.Labels("labels", req.GetLabels()); err != nil {
		return 0, err
	}
	return tier, nil
}

// checkSource takes a copy of the source's record (c.src) if it can be
// checkpointed now (READY, not pooled, not being deleted) under the
// requested name. The caller holds sb.op.
func (c *newCheckpoint) checkSource() error {
	m, sb, req := c.m, c.sb, c.req
	m.mu.Lock()
	src := cloneRecord(sb.rec)
	deleting := sb.deleting
	m.mu.Unlock()
	switch {
	case deleting:
		return sandboxNotFound(req.GetSandboxId())
	case src.Pooled && (c.pool == "" || src.Sandbox.GetPoolId() != c.pool):
		return errdefs.WithReason(errdefs.ErrFailedPrecondition, "SANDBOX_POOLED", "sandbox %s is held by its pool; claim it first", src.Sandbox.Id)
	case src.Sandbox.State != controldv1.SandboxState_SANDBOX_STATE_READY:
		return errdefs.WithReason(errdefs.ErrFailedPrecondition, "SANDBOX_WRONG_STATE",
			"sandbox %s is %s; only a READY sandbox can be checkpointed", src.Sandbox.Id, src.Sandbox.State)
	}
	if req.GetName() != "" {
		if _, err := m.findCheckpoint(req.GetName()); err == nil {
			return errdefs.WithReason(errdefs.ErrAlreadyExists, "CHECKPOINT_NAME_TAKEN", "a checkpoint named %q exists", req.GetName())
		}
	}
	c.src = src
	return nil
}

// newCheckpointRecord draws the proofs a checkpoint of src will carry: the
// marker file, and for the memory tier the memory and network values.
func newCheckpointRecord(id string, src *store.SandboxRecord, tier controldv1.CheckpointTier) *store.CheckpointRecord {
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
	return rec
}

// dump has the runtime checkpoint the source into the temporary
// directory, the guest prepared beside it (prepareCheckpointGuest). A
// memory-tier source that runs on gets its agents back: the hold is lifted
// at once, and the returned wait, which the caller defers, lets the reply
// go only after it.
func (c *newCheckpoint) dump(ctx context.Context) (runtime.CheckpointResult, func(), error) {
	m, sb, src, rec, stop := c.m, c.sb, c.src, c.rec, c.req.GetStop()
	tmp := m.tmpCheckpointDir(c.id)
	spec := runtime.CheckpointSpec{
		Dir:  tmp,
		Tier: tierToRuntime(c.tier),
		Stop: stop,
		BeforeFreeze: func(ctx context.Context) error {
			return m.prepareCheckpointGuest(ctx, sb, src, rec)
		},
	}
	rctx, rspan := m.tracer.Start(ctx, "checkpoint.runtime")
	res, err := m.rt.Checkpoint(rctx, src.Sandbox.Id, spec)
	rspan.End()
	m.setCheckpointing(sb, false)
	wait := func() {}
	if c.tier == controldv1.CheckpointTier_CHECKPOINT_TIER_MEMORY && !stop {
		lifted := make(chan struct{})
		go func() {
			defer close(lifted)
			m.liftCheckpointHold(ctx, src.ACISocket, src.AdminToken, src.Sandbox.Id)
		}()
		wait = func() { <-lifted }
	}
	if err != nil {
		os.RemoveAll(tmp) // the runtime removes it on failure; make sure
		return res, wait, fmt.Errorf("checkpoint %s: %w", src.Sandbox.Id, err)
	}
	return res, wait, nil
}

// publishDir moves the complete checkpoint from its temporary directory
// to its own, durably; on failure the runtime's checkpoint goes.
func (c *newCheckpoint) publishDir(res *runtime.CheckpointResult) (string, error) {
	m, id := c.m, c.id
	tmp, final := m.tmpCheckpointDir(id), m.checkpointDirFor(id)
	if err := os.Rename(tmp, final); err != nil {
		m.dropRuntimeCheckpoint(res.Ref, tmp)
		return "", fmt.Errorf("checkpoint %s: publish dir: %w", id, err)
	}
	if err := syncDir(m.opts.CheckpointDir); err != nil {
		m.dropRuntimeCheckpoint(res.Ref, final)
		return "", fmt.Errorf("checkpoint %s: sync dir: %w", id, err)
	}
	if res.Ref.Dir == "" || res.Ref.Dir == tmp {
		res.Ref.Dir = final
	}
	return final, nil
}

// describe completes the record: the runtime's reference and proofs, and
// the public Checkpoint.
func (c *newCheckpoint) describe(res runtime.CheckpointResult) {
	rec, req, src, tier, start := c.rec, c.req, c.src, c.tier, c.start
	rec.Ref = res.Ref
	rec.Checkpoint = &controldv1.Checkpoint{
		Id:                 c.id,
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
	rec.Request = c.tag
	if c.pool != "" {
		// Shown as the pool's: ListCheckpoints finds it by the label its
		// claimed sandboxes carry too.
		rec.Pool = c.pool
		rec.Checkpoint.Labels = map[string]string{rules.PoolIDLabel: c.pool}
	}
	rec.Checkpoint.VerifyLevels = levelsFor(tier, rec)
}

// observe counts the checkpoint in the metrics.
func (c *newCheckpoint) observe(res runtime.CheckpointResult) {
	m, tier, start := c.m, c.tier, c.start
	tl := tierLabel(tier)
	m.metrics.CheckpointTotal.WithLabelValues(tl).Observe(time.Since(start).Seconds())
	m.metrics.CheckpointFrozen.WithLabelValues(tl).Observe(res.Frozen.Seconds())
	if tier == controldv1.CheckpointTier_CHECKPOINT_TIER_MEMORY {
		m.metrics.CheckpointStep.WithLabelValues("dump", tl).Observe(res.Dump.Seconds())
		m.metrics.CheckpointBytes.WithLabelValues(tl, "memory").Observe(float64(res.MemoryBytes))
	}
	m.metrics.CheckpointStep.WithLabelValues("layer", tl).Observe(res.Layer.Seconds())
	m.metrics.CheckpointBytes.WithLabelValues(tl, "layer").Observe(float64(res.LayerBytes))
}

// markSourceStopped records that the checkpoint (with stop) stopped its
// source.
func (c *newCheckpoint) markSourceStopped() {
	m := c.m
	if _, err := m.update(c.sb, controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_STATE, nil, func(r *store.SandboxRecord) {
		r.Sandbox.State = controldv1.SandboxState_SANDBOX_STATE_STOPPED
		r.Sandbox.StatusMessage = "stopped by checkpoint " + c.id
	}); err != nil {
		m.log.Error("persist stopped source", "sandbox", c.src.Sandbox.Id, "err", err)
	}
}

// prepareCheckpointGuest readies a sandbox for its dump, while the runtime
// prepares the checkpoint's layer: it records the proofs (the marker file,
// the memory value) over one admin session, closes every connection from
// outside (CRIU would have to dump them), and records the settled frame. The
// session is closed before it returns: it would be part of the dump too.
func (m *checkpointer) prepareCheckpointGuest(ctx context.Context, sb *sandbox, src *store.SandboxRecord, rec *store.CheckpointRecord) error {
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
func (m *checkpointer) liftCheckpointHold(ctx context.Context, socket guestsock.Addr, token, id string) {
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

func (m *checkpointer) setCheckpointing(sb *sandbox, v bool) {
	m.mu.Lock()
	sb.checkpointing = v
	m.mu.Unlock()
}

// commitCheckpoint writes a new checkpoint record together with its
// parent's child list, in one transaction.
func (m *checkpointer) commitCheckpoint(rec *store.CheckpointRecord) error {
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
func (m *checkpointer) dropRuntimeCheckpoint(ref runtime.CheckpointRef, dir string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(m.ctx), time.Minute)
	defer cancel()
	ref.Dir = dir
	if err := m.rt.DeleteCheckpoint(ctx, ref); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		m.log.Error("release unrecorded checkpoint", "dir", dir, "err", err)
	}
	os.RemoveAll(dir)
}

// tierLabel is a tier as a metric label: "memory" or "disk".
func tierLabel(t controldv1.CheckpointTier) string {
	if t == controldv1.CheckpointTier_CHECKPOINT_TIER_DISK {
		return "disk"
	}
	return "memory"
}

// checkpointDirFor and tmpCheckpointDir name a checkpoint's directories: the
// runtime writes into the temporary one, which is renamed into place only
// once complete, so a crash never leaves a half checkpoint under a real name.
func (m *checkpointer) checkpointDirFor(id string) string {
	return filepath.Join(m.opts.CheckpointDir, id)
}

func (m *checkpointer) tmpCheckpointDir(id string) string {
	return filepath.Join(m.opts.CheckpointDir, tmpPrefix+id)
}

const tmpPrefix = ".tmp-"

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
