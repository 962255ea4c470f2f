package fleet

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/netpolicy"
	"github.com/forkfleet/forkfleet/api/rules"
	"github.com/forkfleet/forkfleet/controld/internal/store"
)

// poolParallel bounds concurrent warm-ups per pool: warming competes with
// claimed sandboxes for the same few CPUs.
const poolParallel = 2

// pool is a warm pool and its replenisher.
type pool struct {
	rec    *store.PoolRecord // guarded by Manager.mu; Hits and Misses live in hits and misses
	kick   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
	// hits and misses are the claim counters. Atomic because a claim's
	// transaction reads them on the store's committer goroutine, which must
	// not take Manager.mu (see store.Update).
	hits, misses atomic.Uint64
	// thawing holds the hits being handed out; a miss lets them finish
	// before it starts its fork or boot (see claimMiss).
	thawing gate
	// held are admin sessions kept open across the freeze of the frozen
	// members (see freezeWarm).
	held heldSessions
	// ck: an image pool's own checkpoint, which its misses fork from
	// (pool_checkpoint.go); the replenisher's only.
	ck poolCheckpoint
	// missForks bounds the misses that fork at once (maxMissForks);
	// missing counts the misses forking and missPeak the most of them at
	// once since missing was last 0 (see forkMissReplica).
	missForks         chan struct{}
	missMu            sync.Mutex
	missing, missPeak int
	// buildChecked is when the replenisher last compared an image pool's
	// members' builds with what its image's name names (its only).
	buildChecked time.Time
}

// pooler is the pools concern: warm pools, their replenishers and their
// claims (pool.go, pool_claim.go, pool_session.go, pool_checkpoint.go).
// Manager promotes its API.
type pooler struct {
	*registry
	// What a pool's members are made of: sandboxes booted or forked, and
	// an image pool's own checkpoint.
	*sandboxer
	*checkpointer
	*forker
}

// CreatePool records a pool and starts filling it.
func (m *pooler) CreatePool(_ context.Context, req *controldv1.CreatePoolRequest) (*controldv1.Pool, error) {
	if err := rules.Name("name", req.GetName()); err != nil {
		return nil, err
	}
	var (
		ckID  string
		ckRes *controldv1.Resources // a checkpoint pool's base limits
		ckNet *controldv1.Network   // a checkpoint pool's network
	)
	switch src := req.GetSource().(type) {
	case nil:
		return nil, errdefs.InvalidField("source", "one of image or checkpoint_id is required")
	case *controldv1.CreatePoolRequest_Image:
		if src.Image == "" {
			return nil, errdefs.InvalidField("image", "must not be empty (omit it for a checkpoint pool)")
		}
		if err := rules.Image("image", src.Image); err != nil {
			return nil, err
		}
	case *controldv1.CreatePoolRequest_CheckpointId:
		if err := rules.CheckpointRef("checkpoint_id", src.CheckpointId); err != nil {
			return nil, err
		}
		ck, err := m.findCheckpoint(src.CheckpointId)
		if err != nil {
			return nil, err
		}
		ckID, ckRes, ckNet = ck.Checkpoint.Id, ck.Checkpoint.GetResources(), ck.Checkpoint.GetNetwork()
	}
	if s := req.GetSize(); s < 1 || s > rules.MaxPoolSize {
		return nil, errdefs.InvalidField("size", "%d out of range 1..%d", s, rules.MaxPoolSize)
	}
	if err := rules.Screen("screen", req.GetScreen()); err != nil {
		return nil, err
	}
	// The pool records its members' effective limits.
	res, err := m.opts.Limits.Resolve("resources", req.GetResources(), ckRes)
	if err != nil {
		return nil, err
	}
	if err := rules.Labels("labels", req.GetLabels()); err != nil {
		return nil, err
	}
	if ckID != "" && req.GetScreen() != nil {
		return nil, errdefs.InvalidField("screen", "a checkpoint pool takes its geometry from the checkpoint")
	}
	nw, err := netpolicy.PoolNetwork("network", req.GetNetwork(), ckID != "", ckNet)
	if err != nil {
		return nil, err
	}
	if err := m.checkEgress(nw); err != nil {
		return nil, err
	}
	pb := &controldv1.Pool{
		Id: rules.NewID(rules.PrefixPool), Name: req.GetName(), Image: req.GetImage(), CheckpointId: ckID,
		Size: req.GetSize(), Labels: copyMap(req.GetLabels()),
		Screen: req.GetScreen(), Resources: res, Frozen: ckID != "", Network: nw,
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
	p := &pool{rec: rec, kick: make(chan struct{}, 1), done: make(chan struct{}), missForks: make(chan struct{}, maxMissForks)}
	p.hits.Store(rec.Pool.GetHits())
	p.misses.Store(rec.Pool.GetMisses())
	return p
}

// recordLocked is p's durable record with the current counters.
func (p *pool) recordLocked() *store.PoolRecord {
	pb := proto.Clone(p.rec.Pool).(*controldv1.Pool)
	pb.Hits, pb.Misses = p.hits.Load(), p.misses.Load()
	return &store.PoolRecord{Pool: pb, Env: p.rec.Env}
}

func (m *pooler) startPoolLocked(p *pool) {
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

func (m *pooler) kickPool(id string) {
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
func (m *pooler) poolMembersLocked(p *pool) (warm, warming []*sandbox) {
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

func (m *pooler) poolViewLocked(p *pool) *controldv1.Pool {
	v := p.recordLocked().Pool
	v.Host = m.opts.Host
	warm, _ := m.poolMembersLocked(p)
	v.Available = uint32(len(warm))
	m.metrics.PoolAvailable.WithLabelValues(v.Id).Set(float64(v.Available))
	return v
}

// replenish keeps the pool at its size until ctx ends.
func (m *pooler) replenish(ctx context.Context, p *pool) {
	retry := m.opts.PoolRetry
	resync := time.NewTicker(5 * time.Second)
	defer resync.Stop()
	var builds <-chan time.Time // an image pool compares its members' builds with the name's
	if p.rec.Pool.GetCheckpointId() == "" {
		t := time.NewTicker(slotImageCheck)
		defer t.Stop()
		builds = t.C
	}
	var deferring time.Time // since when a needed refill waits for claims to go quiet
	defer p.held.closeAll()
	for {
		m.removeStrays(ctx, p)
		m.replaceOldBuilds(ctx, p)
		m.mu.Lock()
		warm, warming := m.poolMembersLocked(p)
		p.held.keepOnly(m.pooledLocked(p))
		need := int(p.rec.Pool.Size) - len(warm) - len(warming)
		m.poolViewLocked(p)
		m.mu.Unlock()
		if need < 0 { // made smaller while refills ran
			m.trimPool(ctx, p)
		}
		if need <= 0 && !p.rec.Pool.GetFrozen() {
			again, ok := m.keepPoolCheckpoint(ctx, p)
			if !ok {
				return
			}
			if again {
				continue
			}
		}
		if need > 0 {
			// A warm-up (a CRIU restore or a desktop boot) takes the CPU
			// a claim burst and its first requests need.
			if deferring.IsZero() {
				deferring = time.Now()
			}
			waited, ok := m.waitClaimsQuiet(ctx, deferring)
			if !ok {
				return
			}
			if waited {
				continue // more may have been claimed meanwhile
			}
			deferring = time.Time{}
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
		case <-builds:
		}
	}
}

// replaceOldBuilds deletes an image pool's waiting members that booted
// from a build its image's name no longer names (an image rebuilt and
// re-imported under it), at most every slotImageCheck: its hits then serve
// the build a miss or a create would, and the replenisher refills. A
// checkpoint pool's members are its checkpoint's build, by design.
func (m *pooler) replaceOldBuilds(ctx context.Context, p *pool) {
	if p.rec.Pool.GetCheckpointId() != "" || time.Since(p.buildChecked) < slotImageCheck {
		return
	}
	p.buildChecked = time.Now()
	m.mu.Lock()
	image := p.rec.Pool.GetImage()
	m.mu.Unlock()
	current := m.imageDigestNow(ctx, image)
	if current == "" {
		return
	}
	var old []*sandbox
	m.mu.Lock()
	warm, _ := m.poolMembersLocked(p)
	for _, sb := range warm {
		if sb.build != "" && sb.build != current {
			sb.claimed = true // no claim takes it now
			old = append(old, sb)
		}
	}
	m.mu.Unlock()
	m.dropMembers(ctx, p, old, "pool member of an older build of its image")
	if len(old) > 0 {
		m.log.Info("pool: members of an older build of its image replaced", "pool", p.rec.Pool.Id, "image", image, "build", current, "members", len(old))
	}
}

// warmOne adds one warm sandbox to the pool (deleting it on failure).
func (m *pooler) warmOne(ctx context.Context, p *pool) error {
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
		levels := rules.DefaultLevels(ck.Checkpoint.VerifyLevels)
		// Not frozen by the fork: freezeWarm opens the session a claim
		// resumes it over first. Its apps are stopped from its Restored
		// (the proofs need only guestd and the X server) until that claim:
		// a waiting member holds the checkpoint's memory, not what its page
		// would do until the freeze.
		rep := m.forkReplica(ctx, t0, ck, forkParams{resources: pb.Resources, labels: pb.Labels, levels: levels, poolID: pb.Id, pooled: true,
			policy: pb.GetNetwork().GetPolicy()})
		if rep.ErrorCode != 0 {
			return fmt.Errorf("warm fork: %s", rep.ErrorMessage)
		}
		return m.freezeWarm(ctx, p, rep.Sandbox.GetId())
	}
	sb, err := m.newSandbox(sandboxParams{
		image: pb.Image, resources: pb.Resources, screen: pb.Screen, labels: pb.Labels, poolID: pb.Id, pooled: true,
		network: pb.GetNetwork(),
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
func (m *pooler) findPool(id string) (*pool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.pools[id]
	if !ok {
		return nil, poolNotFound(id)
	}
	return p, nil
}

// GetPool returns a pool.
func (m *pooler) GetPool(_ context.Context, id string) (*controldv1.Pool, error) {
	if err := rules.PoolID("id", id); err != nil {
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

// ListPools returns the page of pools the request asks for (by id) and the
// next page's token.
func (m *pooler) ListPools(_ context.Context, req *controldv1.ListPoolsRequest) ([]*controldv1.Pool, string, error) {
	m.mu.Lock()
	out := make([]*controldv1.Pool, 0, len(m.pools))
	for _, p := range m.pools {
		out = append(out, m.poolViewLocked(p))
	}
	m.mu.Unlock()
	return rules.Page(out, rules.PoolKey, req.GetPageSize(), req.GetPageToken(), req)
}

// UpdatePool changes a pool's size: the replenisher fills a larger pool and
// removes the warm members past a smaller one (newest first, warming ones
// before warm ones); claimed sandboxes are not the pool's any more.
func (m *pooler) UpdatePool(ctx context.Context, req *controldv1.UpdatePoolRequest) (*controldv1.Pool, error) {
	if err := rules.PoolID("id", req.GetId()); err != nil {
		return nil, err
	}
	if err := rules.PoolSize("size", req.GetSize()); err != nil {
		return nil, err
	}
	p, err := m.findPool(req.GetId())
	if err != nil {
		return nil, err
	}
	id := req.GetId()
	// In memory first: every write of the pool's record (claims' counters
	// too) then carries the new size.
	m.mu.Lock()
	old := p.rec.Pool.Size
	p.rec.Pool.Size = req.GetSize()
	m.mu.Unlock()
	if err := m.persistPool(p); err != nil {
		m.mu.Lock()
		p.rec.Pool.Size = old
		m.mu.Unlock()
		return nil, fmt.Errorf("pool %s: persist: %w", id, err)
	}
	m.mu.Lock()
	if m.pools[id] != p {
		m.mu.Unlock()
		return nil, poolNotFound(id) // deleted meanwhile
	}
	m.metrics.PoolSize.WithLabelValues(id).Set(float64(req.GetSize()))
	m.mu.Unlock()
	m.trimPool(ctx, p)
	m.kickPool(id)
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.poolViewLocked(p), nil
}

// trimPool removes the members past the pool's size.
func (m *pooler) trimPool(ctx context.Context, p *pool) {
	m.mu.Lock()
	warm, warming := m.poolMembersLocked(p)
	excess := len(warm) + len(warming) - int(p.rec.Pool.Size)
	newestFirst := func(s []*sandbox) {
		sort.Slice(s, func(i, j int) bool {
			return s[i].rec.Sandbox.GetCreatedAt().AsTime().After(s[j].rec.Sandbox.GetCreatedAt().AsTime())
		})
	}
	newestFirst(warming)
	newestFirst(warm)
	// Warm ones first: a warming one is a refill in progress, whose
	// failure would hold the next refills back.
	var drop []*sandbox
	for _, sb := range append(warm, warming...) {
		if len(drop) >= excess {
			break
		}
		sb.claimed = true // no claim takes it now
		drop = append(drop, sb)
	}
	m.mu.Unlock()
	m.dropMembers(ctx, p, drop, "pool made smaller")
}

// dropMembers deletes members of p that the caller marked claimed (so no
// claim takes them), for the reason why.
func (m *pooler) dropMembers(ctx context.Context, p *pool, drop []*sandbox, why string) {
	for _, sb := range drop {
		if err := m.deleteSandbox(ctx, sb, why); err != nil {
			m.log.Warn("remove a pool member", "pool", p.rec.Pool.Id, "sandbox", sb.rec.Sandbox.GetId(), "why", why, "err", err)
		}
	}
}

// DeletePool stops refilling and deletes the pool's unclaimed sandboxes.
// Claimed sandboxes are not touched.
func (m *pooler) DeletePool(ctx context.Context, id string) error {
	if err := rules.PoolID("id", id); err != nil {
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
	if err := errors.Join(errs...); err == nil {
		// Its checkpoint goes now, or with the last claimed fork of it.
		m.retirePoolCheckpoints(ctx, id)
	}
	if err := errors.Join(errs...); err != nil {
		// Leave the record so a retry finishes the job.
		m.mu.Lock()
		if _, still := m.pools[id]; still {
			np := newPool(p.recordLocked())
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
	// Under the lock: a claim finishing now counts only while its pool is
	// there (recordClaim), so no series of the pool outlives it.
	m.metrics.PoolSize.DeleteLabelValues(id)
	m.metrics.PoolAvailable.DeleteLabelValues(id)
	m.metrics.PoolClaims.DeletePartialMatch(prometheus.Labels{"pool": id})
	m.mu.Unlock()
	return nil
}
