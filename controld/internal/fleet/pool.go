package fleet

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/store"
)

// poolParallel bounds concurrent warm-ups per pool: warming competes with
// claimed sandboxes for the same few CPUs.
const poolParallel = 2

// pool is a warm pool and its replenisher.
type pool struct {
	rec    *store.PoolRecord // guarded by Manager.mu
	kick   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
	// persist orders record writes (hit/miss counters).
	persist chan struct{}
}

// CreatePool records a pool and starts filling it.
func (m *Manager) CreatePool(_ context.Context, req *controldv1.CreatePoolRequest) (*controldv1.Pool, error) {
	if err := validateName("name", req.GetName()); err != nil {
		return nil, err
	}
	var ckID string
	switch src := req.GetSource().(type) {
	case nil:
		return nil, errdefs.InvalidField("source", "one of image or checkpoint_id is required")
	case *controldv1.CreatePoolRequest_Image:
		if src.Image == "" {
			return nil, errdefs.InvalidField("image", "must not be empty (omit it for a checkpoint pool)")
		}
		if err := validateImage("image", src.Image); err != nil {
			return nil, err
		}
	case *controldv1.CreatePoolRequest_CheckpointId:
		if err := validateCheckpointRef("checkpoint_id", src.CheckpointId); err != nil {
			return nil, err
		}
		ck, err := m.findCheckpoint(src.CheckpointId)
		if err != nil {
			return nil, err
		}
		ckID = ck.Checkpoint.Id
	}
	if s := req.GetSize(); s < 1 || s > maxPoolSize {
		return nil, errdefs.InvalidField("size", "%d out of range 1..%d", s, maxPoolSize)
	}
	if err := validateScreen("screen", req.GetScreen()); err != nil {
		return nil, err
	}
	if err := validateResources("resources", req.GetResources()); err != nil {
		return nil, err
	}
	if err := validateLabels("labels", req.GetLabels()); err != nil {
		return nil, err
	}
	if ckID != "" && (req.GetScreen() != nil || req.GetResources() != nil) {
		field := "screen"
		if req.GetScreen() == nil {
			field = "resources"
		}
		return nil, errdefs.InvalidField(field, "a checkpoint pool takes its geometry and limits from the checkpoint")
	}
	pb := &controldv1.Pool{
		Id: newID(prefixPool), Name: req.GetName(), Image: req.GetImage(), CheckpointId: ckID,
		Size: req.GetSize(), Labels: copyMap(req.GetLabels()),
		Screen: req.GetScreen(), Resources: req.GetResources(), Frozen: ckID != "",
	}
	rec := &store.PoolRecord{Pool: pb}
	m.mu.Lock()
	if err := m.checkOpen(); err != nil {
		m.mu.Unlock()
		return nil, err
	}
	if pb.Name != "" {
		for _, p := range m.pools {
			if p.rec.Pool.Name == pb.Name {
				m.mu.Unlock()
				return nil, errdefs.WithReason(errdefs.ErrAlreadyExists, "POOL_NAME_TAKEN", "a pool named %q exists", pb.Name)
			}
		}
	}
	if ckID != "" {
		if _, ok := m.checkpoints[ckID]; !ok {
			m.mu.Unlock()
			return nil, checkpointNotFound(ckID)
		}
	}
	m.mu.Unlock()
	if err := m.st.PutPool(rec); err != nil {
		return nil, fmt.Errorf("pool %s: persist: %w", pb.Id, err)
	}
	p := newPool(rec)
	m.mu.Lock()
	m.pools[pb.Id] = p
	m.startPoolLocked(p)
	v := m.poolViewLocked(p)
	m.mu.Unlock()
	return v, nil
}

func newPool(rec *store.PoolRecord) *pool {
	return &pool{rec: rec, kick: make(chan struct{}, 1), done: make(chan struct{}), persist: make(chan struct{}, 1)}
}

func (m *Manager) startPoolLocked(p *pool) {
	ctx, cancel := context.WithCancel(m.ctx)
	p.cancel = cancel
	m.metrics.PoolSize.WithLabelValues(p.rec.Pool.Id).Set(float64(p.rec.Pool.Size))
	if !m.goBackgroundLocked(func() {
		defer close(p.done)
		m.replenish(ctx, p)
	}) {
		close(p.done)
	}
}

func (m *Manager) kickPool(id string) {
	m.mu.Lock()
	p, ok := m.pools[id]
	m.mu.Unlock()
	if ok {
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
}

// poolMembersLocked returns the pool's unclaimed sandboxes: warm ones
// (claimable) and ones still warming.
func (m *Manager) poolMembersLocked(p *pool) (warm, warming []*sandbox) {
	want := controldv1.SandboxState_SANDBOX_STATE_READY
	if p.rec.Pool.Frozen {
		want = controldv1.SandboxState_SANDBOX_STATE_SUSPENDED
	}
	for _, sb := range m.sandboxes {
		if !sb.rec.Pooled || sb.rec.Sandbox.PoolId != p.rec.Pool.Id || sb.deleting || sb.claimed {
			continue
		}
		switch sb.rec.Sandbox.State {
		case want:
			warm = append(warm, sb)
		case controldv1.SandboxState_SANDBOX_STATE_CREATING, controldv1.SandboxState_SANDBOX_STATE_BOOTING:
			warming = append(warming, sb)
		}
	}
	return warm, warming
}

func (m *Manager) poolViewLocked(p *pool) *controldv1.Pool {
	v := proto.Clone(p.rec.Pool).(*controldv1.Pool)
	warm, _ := m.poolMembersLocked(p)
	v.Available = uint32(len(warm))
	m.metrics.PoolAvailable.WithLabelValues(v.Id).Set(float64(v.Available))
	return v
}

// replenish keeps the pool at its size until ctx ends.
func (m *Manager) replenish(ctx context.Context, p *pool) {
	retry := m.opts.PoolRetry
	resync := time.NewTicker(5 * time.Second)
	defer resync.Stop()
	for {
		m.mu.Lock()
		warm, warming := m.poolMembersLocked(p)
		need := int(p.rec.Pool.Size) - len(warm) - len(warming)
		m.poolViewLocked(p)
		m.mu.Unlock()
		if need > 0 {
			n := min(need, poolParallel)
			errs := make(chan error, n)
			for range n {
				go func() { errs <- m.warmOne(ctx, p) }()
			}
			var failed error
			for range n {
				if err := <-errs; err != nil {
					failed = err
				}
			}
			if ctx.Err() != nil {
				return
			}
			if failed == nil {
				retry = m.opts.PoolRetry
				continue
			}
			m.log.Warn("pool refill failed", "pool", p.rec.Pool.Id, "err", failed, "retry_in", retry)
			select {
			case <-ctx.Done():
				return
			case <-time.After(retry):
			}
			retry = min(2*retry, 30*time.Second)
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		case <-resync.C:
		}
	}
}

// warmOne adds one warm sandbox to the pool (deleting it on failure).
func (m *Manager) warmOne(ctx context.Context, p *pool) error {
	m.mu.Lock()
	pb := proto.Clone(p.rec.Pool).(*controldv1.Pool)
	var ck *store.CheckpointRecord
	if pb.CheckpointId != "" {
		ck = m.checkpoints[pb.CheckpointId]
	}
	m.mu.Unlock()
	t0 := time.Now()
	if pb.CheckpointId != "" {
		if ck == nil {
			return checkpointNotFound(pb.CheckpointId)
		}
		levels := ck.Checkpoint.VerifyLevels
		rep := m.forkReplica(ctx, t0, ck, forkParams{labels: pb.Labels, levels: levels, poolID: pb.Id, pooled: true, freeze: true})
		if rep.ErrorCode != 0 {
			return fmt.Errorf("warm fork: %s", rep.ErrorMessage)
		}
		return nil
	}
	sb, err := m.newSandbox(sandboxParams{
		image: pb.Image, resources: pb.Resources, screen: pb.Screen, labels: pb.Labels, poolID: pb.Id, pooled: true,
	}, t0)
	if err != nil {
		return err
	}
	m.startBoot(sb, t0, "pool")
	if _, err := m.waitSettled(ctx, sb); err != nil {
		if derr := m.deleteSandbox(m.ctx, sb, "pool warm-up failed"); derr != nil {
			m.log.Error("remove failed pool sandbox", "sandbox", sb.rec.Sandbox.GetId(), "err", derr)
		}
		return err
	}
	m.kickPool(pb.Id) // refresh the available gauge
	return nil
}

// findPool resolves a pool id.
func (m *Manager) findPool(id string) (*pool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.pools[id]
	if !ok {
		return nil, poolNotFound(id)
	}
	return p, nil
}

// GetPool returns a pool.
func (m *Manager) GetPool(_ context.Context, id string) (*controldv1.Pool, error) {
	if err := validatePoolID("id", id); err != nil {
		return nil, err
	}
	p, err := m.findPool(id)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.poolViewLocked(p), nil
}

// ListPools returns every pool, by name then id.
func (m *Manager) ListPools(context.Context) ([]*controldv1.Pool, error) {
	m.mu.Lock()
	out := make([]*controldv1.Pool, 0, len(m.pools))
	for _, p := range m.pools {
		out = append(out, m.poolViewLocked(p))
	}
	m.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Id < out[j].Id
	})
	return out, nil
}

// DeletePool stops refilling and deletes the pool's unclaimed sandboxes.
// Claimed sandboxes are not touched.
func (m *Manager) DeletePool(ctx context.Context, id string) error {
	if err := validatePoolID("id", id); err != nil {
		return err
	}
	p, err := m.findPool(id)
	if err != nil {
		return err
	}
	p.cancel()
	<-p.done
	m.mu.Lock()
	var members []*sandbox
	for _, sb := range m.sandboxes {
		if sb.rec.Pooled && sb.rec.Sandbox.PoolId == id {
			members = append(members, sb)
		}
	}
	m.mu.Unlock()
	var errs []error
	for _, sb := range members {
		if err := m.deleteSandbox(ctx, sb, "pool deleted"); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		// Leave the record so a retry finishes the job.
		m.mu.Lock()
		if _, still := m.pools[id]; still {
			np := newPool(p.rec)
			m.pools[id] = np
			m.startPoolLocked(np)
		}
		m.mu.Unlock()
		return fmt.Errorf("pool %s: %w", id, err)
	}
	if err := m.st.Update(func(tx *store.Tx) error { return tx.DeletePool(id) }); err != nil {
		return fmt.Errorf("pool %s: remove record: %w", id, err)
	}
	m.mu.Lock()
	delete(m.pools, id)
	m.mu.Unlock()
	m.metrics.PoolSize.DeleteLabelValues(id)
	m.metrics.PoolAvailable.DeleteLabelValues(id)
	return nil
}

// ClaimPool hands out a usable sandbox: a warm one (a hit) or, when none is
// available, a fresh boot or fork (a miss).
func (m *Manager) ClaimPool(ctx context.Context, req *controldv1.ClaimPoolRequest) (*controldv1.Sandbox, *controldv1.Endpoint, bool, time.Duration, error) {
	t0 := time.Now()
	if err := validatePoolID("pool_id", req.GetPoolId()); err != nil {
		return nil, nil, false, 0, err
	}
	if err := validateLabels("labels", req.GetLabels()); err != nil {
		return nil, nil, false, 0, err
	}
	ttl, err := durationField("ttl", req.GetTtl(), maxTTL)
	if err != nil {
		return nil, nil, false, 0, err
	}
	p, err := m.findPool(req.GetPoolId())
	if err != nil {
		return nil, nil, false, 0, err
	}
	labels := copyMap(p.rec.Pool.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	for k, v := range req.GetLabels() {
		labels[k] = v
	}
	labels[PoolIDLabel] = p.rec.Pool.Id
	// Try warm sandboxes until one works; a broken one is removed.
	for {
		sb := m.takeWarm(p)
		if sb == nil {
			break
		}
		s, err := m.claimWarm(ctx, p, sb, labels, ttl, t0)
		if err == nil {
			m.recordClaim(p, "hit", t0)
			return s, m.endpoint(sb), true, time.Since(t0), nil
		}
		m.log.Warn("warm sandbox unusable, trying the next", "pool", p.rec.Pool.Id, "sandbox", sb.rec.Sandbox.GetId(), "err", err)
		if derr := m.deleteSandbox(ctx, sb, "claim failed: "+err.Error()); derr != nil {
			m.log.Error("remove unusable pooled sandbox", "sandbox", sb.rec.Sandbox.GetId(), "err", derr)
		}
		if ctx.Err() != nil {
			m.recordClaim(p, "error", t0)
			return nil, nil, false, 0, ctx.Err()
		}
	}
	m.kickPool(p.rec.Pool.Id)
	s, ep, err := m.claimMiss(ctx, p, labels, ttl, t0)
	if err != nil {
		m.recordClaim(p, "error", t0)
		return nil, nil, false, 0, err
	}
	m.recordClaim(p, "miss", t0)
	return s, ep, false, time.Since(t0), nil
}

// takeWarm reserves a warm sandbox of p, oldest first (it has waited
// longest, and its KSM pages are most merged).
func (m *Manager) takeWarm(p *pool) *sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	warm, _ := m.poolMembersLocked(p)
	if len(warm) == 0 {
		return nil
	}
	sort.Slice(warm, func(i, j int) bool {
		return warm[i].rec.Sandbox.GetReadyAt().AsTime().Before(warm[j].rec.Sandbox.GetReadyAt().AsTime())
	})
	warm[0].claimed = true
	return warm[0]
}

func (m *Manager) claimWarm(ctx context.Context, p *pool, sb *sandbox, labels map[string]string, ttl time.Duration, t0 time.Time) (*controldv1.Sandbox, error) {
	sb.op.Lock()
	defer sb.op.Unlock()
	m.mu.Lock()
	if sb.deleting {
		m.mu.Unlock()
		return nil, sandboxNotFound(sb.rec.Sandbox.GetId())
	}
	id, sock, admin := sb.rec.Sandbox.Id, sb.rec.ACISocket, sb.rec.AdminToken
	m.mu.Unlock()
	if p.rec.Pool.Frozen {
		if err := m.rt.Thaw(ctx, id); err != nil {
			return nil, fmt.Errorf("thaw: %w", err)
		}
		// One quick round trip proves guestd runs again after the thaw.
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := m.pingGuest(pctx, sock, admin)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("ping after thaw: %w", err)
		}
	}
	m.kickPool(p.rec.Pool.Id)
	return m.update(sb, controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_STATE, nil, func(r *store.SandboxRecord) {
		r.Pooled = false
		r.Sandbox.State = controldv1.SandboxState_SANDBOX_STATE_READY
		r.Sandbox.Labels = copyMap(labels)
		if ttl > 0 {
			r.Sandbox.ExpiresAt = timestampNow(t0.Add(ttl))
		}
	})
}

func (m *Manager) pingGuest(ctx context.Context, sock, token string) error {
	g, err := m.dialGuest(ctx, sock, token)
	if err != nil {
		return err
	}
	defer g.Close()
	return g.Ping(ctx)
}

// claimMiss serves a claim without a warm sandbox.
func (m *Manager) claimMiss(ctx context.Context, p *pool, labels map[string]string, ttl time.Duration, t0 time.Time) (*controldv1.Sandbox, *controldv1.Endpoint, error) {
	m.mu.Lock()
	pb := proto.Clone(p.rec.Pool).(*controldv1.Pool)
	var ck *store.CheckpointRecord
	if pb.CheckpointId != "" {
		ck = m.checkpoints[pb.CheckpointId]
	}
	m.mu.Unlock()
	if pb.CheckpointId != "" {
		if ck == nil {
			return nil, nil, checkpointNotFound(pb.CheckpointId)
		}
		rep := m.forkReplica(ctx, t0, ck, forkParams{labels: labels, ttl: ttl, levels: ck.Checkpoint.VerifyLevels, poolID: pb.Id})
		if rep.ErrorCode != 0 {
			return nil, nil, fmt.Errorf("pool %s: fork on miss: %w", pb.Id, errdefs.FromGRPC(statusError(rep)))
		}
		return rep.Sandbox, rep.Endpoint, nil
	}
	sb, err := m.newSandbox(sandboxParams{image: pb.Image, resources: pb.Resources, screen: pb.Screen, labels: labels, ttl: ttl, poolID: pb.Id, warmSlot: true}, t0)
	if err != nil {
		return nil, nil, err
	}
	m.startBoot(sb, t0, "boot")
	s, err := m.waitSettled(ctx, sb)
	if err != nil {
		return nil, nil, fmt.Errorf("pool %s: boot on miss (sandbox %s): %w", pb.Id, sb.rec.Sandbox.GetId(), err)
	}
	return s, m.endpoint(sb), nil
}

func (m *Manager) recordClaim(p *pool, result string, t0 time.Time) {
	d := time.Since(t0)
	id := p.rec.Pool.Id
	m.metrics.PoolClaims.WithLabelValues(id, result).Inc()
	m.metrics.ClaimLatency.WithLabelValues(result).Observe(d.Seconds())
	if result == "error" {
		return
	}
	p.persist <- struct{}{}
	defer func() { <-p.persist }()
	m.mu.Lock()
	if result == "hit" {
		p.rec.Pool.Hits++
	} else {
		p.rec.Pool.Misses++
	}
	rec := &store.PoolRecord{Pool: proto.Clone(p.rec.Pool).(*controldv1.Pool), Env: p.rec.Env}
	_, live := m.pools[id]
	m.mu.Unlock()
	if !live {
		return
	}
	if err := m.st.PutPool(rec); err != nil {
		m.log.Error("persist pool counters", "pool", id, "err", err)
	}
}

func statusError(rep *controldv1.ForkReplica) error {
	return status.Error(codes.Code(rep.ErrorCode), rep.ErrorMessage)
}
