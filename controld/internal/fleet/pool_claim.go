package fleet

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/forkfleet/forkfleet/api/errdefs/errgrpc"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/guestsock"
	"github.com/forkfleet/forkfleet/api/netpolicy"
	"github.com/forkfleet/forkfleet/api/rules"
	"github.com/forkfleet/forkfleet/controld/internal/store"
)

// Refills wait until no claim of any pool has ended for poolQuiet (and
// none is in flight), so a warm-up (hundreds of ms of CPU for a CRIU
// restore on a 2-core host) does not run while a claim burst thaws its
// sandboxes and their clients make their first requests. poolMaxDefer
// bounds the wait so a steady stream of claims still gets its pool
// refilled. Boot and fork slots hold their precreates the same way, for at
// most slotRefillHold (warmslots.go, forkslots.go).
const (
	poolQuiet    = 150 * time.Millisecond
	poolMaxDefer = 2 * time.Second
)

// A miss yields to the hits of its burst: it starts its fork or boot once
// no hit is in flight and the last one ended missGrace ago (the time its
// client needs for a first request), waiting missYield at most.
const (
	missGrace = 10 * time.Millisecond
	missYield = 50 * time.Millisecond
)

// gate counts work in flight and lets others wait until there is none.
type gate struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0
	last time.Time     // when n last dropped to 0
}

func (g *gate) enter() {
	g.mu.Lock()
	if g.n == 0 {
		g.idle = make(chan struct{})
	}
	g.n++
	g.mu.Unlock()
}

func (g *gate) leave() {
	g.mu.Lock()
	g.n--
	if g.n == 0 {
		g.last = time.Now()
		close(g.idle)
	}
	g.mu.Unlock()
}

// quietIn is how long until nothing will have been in flight for grace:
// grace while something is, 0 once it has been quiet that long.
func (g *gate) quietIn(grace time.Duration) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.n > 0 {
		return grace
	}
	return max(grace-time.Since(g.last), 0)
}

// wait returns once nothing has been in flight for grace, after at most
// limit, or when ctx ends.
func (g *gate) wait(ctx context.Context, grace, limit time.Duration) {
	t := time.NewTimer(limit)
	defer t.Stop()
	for {
		g.mu.Lock()
		n, idle, rest := g.n, g.idle, grace-time.Since(g.last)
		g.mu.Unlock()
		if n == 0 && rest <= 0 {
			return
		}
		var quiet <-chan time.Time
		if n == 0 {
			idle = nil
			qt := time.NewTimer(rest)
			defer qt.Stop()
			quiet = qt.C
		}
		select {
		case <-idle:
		case <-quiet:
			return
		case <-t.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// maxMissForks bounds the misses of one pool that fork at once: a burst
// far beyond the pool queues its misses rather than starting a restore
// each on the host's few cores at once (where every replica would take as
// long as the slowest, and memory peaks), each waiting only as long as its
// claim's deadline allows. Eight is about where a fan-out's wall on 2
// vCPUs stops gaining from running restores side by side (forks.md).
const maxMissForks = 8

// pingTimeout bounds the round trip that proves a thawed guestd runs.
const pingTimeout = 5 * time.Second

// waitClaimsQuiet waits until the host's claims have been quiet for
// poolQuiet, or until poolMaxDefer after since. waited reports whether it
// had to wait; ok is false when ctx ended.
func (m *pooler) waitClaimsQuiet(ctx context.Context, since time.Time) (waited, ok bool) {
	deadline := since.Add(poolMaxDefer)
	for {
		wait := min(m.claims.quietIn(poolQuiet), time.Until(deadline))
		if wait <= 0 {
			return waited, true
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return waited, false
		case <-t.C:
		}
		waited = true
	}
}

// claimWarm hands out sb, a warm member of p that takeWarm reserved.
//
// For a frozen pool it thaws sb and lets its apps run (they were held
// stopped since the restore), the round trip that proves guestd runs.
// The replica's identity (own ACI and admin tokens, sandbox id, generation, fresh
// entropy) was installed before it was frozen (forkStart sends Restored
// ahead of the freeze), so nothing per replica is left for the claim.
//
// The claim is made durable (sandbox record and the pool's hit counter,
// store.Claim: one fdatasync of the claim journal) while the thaw and the
// ping run, and Claim returns only after both: a crash after Claim returned
// finds the sandbox claimed (never back in the pool, never handed out
// twice). A crash before can leave a claimed record nobody received: its TTL
// or a delete removes it.
func (m *pooler) claimWarm(ctx context.Context, p *pool, sb *sandbox, labels map[string]string, ttl time.Duration, nw *controldv1.Network, t0 time.Time,
	tag *store.RequestTag) (*controldv1.Sandbox, error) {
	ctx, span := m.tracer.Start(ctx, "pool.claim")
	defer span.End()
	sb.op.Lock()
	defer sb.op.Unlock()
	m.mu.Lock()
	if sb.deleting {
		m.mu.Unlock()
		return nil, sandboxNotFound(sb.rec.Sandbox.GetId())
	}
	id, sock, admin := sb.rec.Sandbox.Id, sb.rec.ACISocket, sb.rec.AdminToken
	claimed := cloneRecord(sb.rec)
	poolRec := p.recordLocked()
	m.mu.Unlock()
	claim := func(r *store.SandboxRecord) {
		r.Pooled = false
		r.Sandbox.State = controldv1.SandboxState_SANDBOX_STATE_READY
		r.Sandbox.Labels = copyMap(labels)
		r.Sandbox.Network = proto.Clone(nw).(*controldv1.Network)
		if ttl > 0 {
			r.Sandbox.ExpiresAt = timestampNow(t0.Add(ttl))
		}
		r.Request = tag
	}
	claim(claimed)

	// Count the hit before the write so the claim carries it; undone
	// below if the claim fails.
	p.hits.Add(1)
	persisted := make(chan error, 1)
	go func() {
		_, ps := m.tracer.Start(ctx, "pool.claim.persist")
		// The records' own write is queued (once the claim's journal frame
		// is synced) behind every earlier write of this sandbox and ahead
		// of every later one (the store's queue is in order), so it needs
		// sb.persist only until Claim returns.
		sb.persist.Lock()
		applied, err := m.st.Claim(claimed, poolRec, func() (uint64, uint64) { return p.hits.Load(), p.misses.Load() })
		sb.persist.Unlock()
		ps.End()
		persisted <- err
		if err != nil {
			return
		}
		if err := <-applied; err != nil {
			m.log.Error("write claimed sandbox's record (its claim is in the journal)", "sandbox", id, "err", err)
		}
	}()
	err := m.thawAndPing(ctx, p, id, sock, admin)
	if err == nil {
		err = m.connectClaimed(ctx, id, nw)
	}
	if perr := <-persisted; err == nil && perr != nil {
		err = fmt.Errorf("sandbox %s: persist claim: %w", id, perr)
	}
	if err != nil {
		p.hits.Add(^uint64(0))
		return nil, err
	}
	// Durable; now the in-memory view and the watchers.
	m.mu.Lock()
	claim(sb.rec)
	snap := cloneRecord(sb.rec)
	m.refreshStateGaugeLocked()
	m.mu.Unlock()
	m.publish(&controldv1.WatchSandboxesResponse{Type: controldv1.SandboxEventType_SANDBOX_EVENT_TYPE_STATE, Sandbox: snap.Sandbox})
	return proto.Clone(snap.Sandbox).(*controldv1.Sandbox), nil
}

// connectClaimed gives a claimed egress sandbox its policy and lets it out:
// a pooled one reached nothing (its link was held down since it was made).
func (m *pooler) connectClaimed(ctx context.Context, id string, nw *controldv1.Network) error {
	if netpolicy.Mode(nw) != controldv1.NetworkMode_NETWORK_MODE_EGRESS {
		return nil
	}
	n, err := m.networker()
	if err != nil {
		return err
	}
	cctx, cs := m.tracer.Start(ctx, "pool.claim.network")
	defer cs.End()
	if err := n.ConnectNetwork(cctx, id, policyOf(nw.GetPolicy())); err != nil {
		return fmt.Errorf("connect network: %w", err)
	}
	return nil
}

// thawAndPing thaws a frozen pool's sandbox and waits for one round trip
// with its guestd: ResumeApps, which lets the apps its Restored held run
// (see warmOne). An image pool's sandboxes run already: nothing to do.
func (m *pooler) thawAndPing(ctx context.Context, p *pool, id string, sock guestsock.Addr, admin string) error {
	if !p.rec.Pool.Frozen {
		return nil
	}
	tctx, ts := m.tracer.Start(ctx, "pool.claim.thaw")
	err := m.rt.Thaw(tctx, id)
	ts.End()
	if err != nil {
		return fmt.Errorf("thaw: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	pctx, ps := m.tracer.Start(pctx, "pool.claim.ping")
	defer ps.End()
	// Over the session opened before the freeze when there is one: one round
	// trip instead of a connect, WebSocket upgrade and Hello.
	if g := p.held.take(id); g != nil {
		err := g.ResumeApps(pctx)
		closeLater(g)
		if err == nil {
			return nil
		}
		m.log.Debug("resume over the held session failed; dialing", "sandbox", id, "err", err)
	}
	if err := m.resumeGuest(pctx, sock, admin); err != nil {
		return fmt.Errorf("resume apps after thaw: %w", err)
	}
	return nil
}

// resumeGuest lets a thawed replica's apps run over a fresh session.
func (m *pooler) resumeGuest(ctx context.Context, sock guestsock.Addr, token string) error {
	g, err := m.dialGuest(ctx, sock, token)
	if err != nil {
		return err
	}
	defer closeLater(g)
	return g.ResumeApps(ctx)
}

// closeLater closes a claim's admin session once the claimant had time for
// its first requests: the close handshake is not part of the proof, and
// guestd would otherwise serve it while the new owner's session opens.
func closeLater(g Guest) {
	time.AfterFunc(poolQuiet, func() { g.Close() })
}

// persistPool writes p's record with its current counters, unless the pool
// was deleted meanwhile.
func (m *pooler) persistPool(p *pool) error {
	m.mu.Lock()
	rec := p.recordLocked()
	m.mu.Unlock()
	return m.st.Update(func(tx *store.Tx) error {
		if !tx.HasPool(rec.Pool.Id) {
			return nil
		}
		rec.Pool.Hits, rec.Pool.Misses = p.hits.Load(), p.misses.Load()
		return tx.PutPool(rec)
	})
}

// ClaimPool hands out a usable sandbox: a warm one (a hit) or, when none is
// available, a fresh boot or fork (a miss).
func (m *pooler) ClaimPool(ctx context.Context, req *controldv1.ClaimPoolRequest) (*controldv1.Sandbox, *controldv1.Endpoint, bool, time.Duration, error) {
	resp, err := m.requests.Do(ctx, controldv1.PoolService_ClaimPool_FullMethodName, req.GetRequestId(), req,
		func() proto.Message { return &controldv1.ClaimPoolResponse{} }, m.recoverClaim,
		func(ctx context.Context, r rules.Request) (proto.Message, error) {
			s, ep, hit, took, err := m.claimPool(ctx, req, requestTag(r))
			if err != nil {
				return nil, err
			}
			return &controldv1.ClaimPoolResponse{Sandbox: s, Endpoint: ep, Hit: hit, Took: durationpb.New(took)}, nil
		})
	if err != nil {
		return nil, nil, false, 0, err
	}
	r := resp.(*controldv1.ClaimPoolResponse)
	return r.GetSandbox(), r.GetEndpoint(), r.GetHit(), r.GetTook().AsDuration(), nil
}

// recoverClaim answers a repeated ClaimPool with the sandbox its first call
// claimed (it failed to answer, or controld restarted).
func (m *pooler) recoverClaim(ctx context.Context, key string, fp []byte) (proto.Message, bool, error) {
	tagged := m.taggedSandboxes(key)
	if len(tagged) == 0 {
		return nil, false, nil
	}
	sb := tagged[0]
	if err := rules.CheckFingerprint(key, fp, sb.rec.Request.Fingerprint); err != nil {
		return nil, false, err
	}
	s, err := m.waitSettled(ctx, sb)
	if err != nil {
		return nil, false, err
	}
	return &controldv1.ClaimPoolResponse{Sandbox: s, Endpoint: m.endpoint(sb), Hit: sb.rec.Request.Hit, Took: durationpb.New(0)}, true, nil
}

func (m *pooler) claimPool(ctx context.Context, req *controldv1.ClaimPoolRequest, tag *store.RequestTag) (*controldv1.Sandbox, *controldv1.Endpoint, bool, time.Duration, error) {
	t0 := time.Now()
	if err := rules.PoolID("pool_id", req.GetPoolId()); err != nil {
		return nil, nil, false, 0, err
	}
	if err := rules.Labels("labels", req.GetLabels()); err != nil {
		return nil, nil, false, 0, err
	}
	ttl, err := rules.Duration("ttl", req.GetTtl(), rules.MaxTTL)
	if err != nil {
		return nil, nil, false, 0, err
	}
	p, err := m.findPool(req.GetPoolId())
	if err != nil {
		return nil, nil, false, 0, err
	}
	poolNet := p.rec.Pool.GetNetwork()
	policy, err := netpolicy.PolicyFor("network_policy", netpolicy.Mode(poolNet), req.GetNetworkPolicy(), poolNet.GetPolicy())
	if err != nil {
		return nil, nil, false, 0, err
	}
	claimNet := &controldv1.Network{Mode: netpolicy.Mode(poolNet), Policy: policy}
	labels := copyMap(p.rec.Pool.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	for k, v := range req.GetLabels() {
		labels[k] = v
	}
	labels[rules.PoolIDLabel] = p.rec.Pool.Id
	m.claims.enter()
	defer func() {
		m.claims.leave()
		// Refill behind the claim (the replenisher waits for claims to go
		// quiet before it starts).
		m.kickPool(p.rec.Pool.Id)
	}()
	// Try warm sandboxes until one works; a broken one is removed.
	for {
		sb := m.takeWarm(p)
		if sb == nil {
			break
		}
		p.thawing.enter()
		s, err := m.claimWarm(ctx, p, sb, labels, ttl, claimNet, t0, claimTag(tag, true))
		p.thawing.leave()
		if err == nil {
			// claimWarm persisted the hit with the sandbox.
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
	s, ep, err := m.claimMiss(ctx, p, labels, ttl, claimNet, t0, claimTag(tag, false))
	if err != nil {
		m.recordClaim(p, "error", t0)
		return nil, nil, false, 0, err
	}
	m.recordClaim(p, "miss", t0)
	return s, ep, false, time.Since(t0), nil
}

// takeWarm reserves a warm sandbox of p, oldest first (it has waited
// longest, and its KSM pages are most merged).
func (m *pooler) takeWarm(p *pool) *sandbox {
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

// claimMiss serves a claim without a warm sandbox.
// claimTag is tag for a claim served warm (hit) or not (nil without a
// request id).
func claimTag(tag *store.RequestTag, hit bool) *store.RequestTag {
	if tag == nil {
		return nil
	}
	t := *tag
	t.Hit = hit
	return &t
}

func (m *pooler) claimMiss(ctx context.Context, p *pool, labels map[string]string, ttl time.Duration, nw *controldv1.Network, t0 time.Time,
	tag *store.RequestTag) (*controldv1.Sandbox, *controldv1.Endpoint, error) {
	// In a burst larger than the pool, the hits of the same burst are still
	// being handed out and used for the first time: a few ms that a restore
	// or boot started now would stretch, while waiting for them delays this
	// miss (hundreds of ms) by as little.
	p.thawing.wait(ctx, missGrace, missYield)
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
		rep := m.forkMissReplica(ctx, p, t0, ck, forkParams{resources: pb.Resources, labels: labels, ttl: ttl, levels: rules.DefaultLevels(ck.Checkpoint.VerifyLevels),
			poolID: pb.Id, policy: nw.GetPolicy(), request: tag})
		if rep.ErrorCode != 0 {
			return nil, nil, fmt.Errorf("pool %s: fork on miss: %w", pb.Id, errgrpc.FromGRPC(statusError(rep)))
		}
		return rep.Sandbox, rep.Endpoint, nil
	}
	// An image pool forks from its own checkpoint once it has one: fork
	// speed, not boot speed.
	if s, ep, ok := m.forkMiss(ctx, p, pb, labels, ttl, nw, t0, tag); ok {
		return s, ep, nil
	}
	sb, err := m.newSandbox(sandboxParams{image: pb.Image, resources: pb.Resources, screen: pb.Screen, labels: labels, ttl: ttl, poolID: pb.Id, warmSlot: true,
		network: nw, request: tag}, t0)
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

// forkMissReplica forks the replica that serves a miss of p. The misses of
// one burst are one fan-out to the fork slots: each is answered as soon as
// its own replica is verified, but together they tell the checkpoint's
// fork slots how wide the burst was (forkSlotsBegin with the most misses
// forking at once since none did), so the next burst of as many misses
// finds a precreated container each, and refills of slots hold off until
// the burst is done instead of precreating beside its restores. At most
// maxMissForks fork at once.
func (m *pooler) forkMissReplica(ctx context.Context, p *pool, t0 time.Time, ck *store.CheckpointRecord, fp forkParams) *controldv1.ForkReplica {
	select {
	case p.missForks <- struct{}{}:
	case <-ctx.Done():
		return &controldv1.ForkReplica{ErrorCode: int32(status.FromContextError(ctx.Err()).Code()),
			ErrorMessage: "waiting for a miss's fork: " + ctx.Err().Error(), Took: durationpb.New(time.Since(t0))}
	}
	defer func() { <-p.missForks }()
	p.missMu.Lock()
	p.missing++
	if p.missing == 1 {
		p.missPeak = 0
	}
	p.missPeak = max(p.missPeak, p.missing)
	width := p.missPeak
	p.missMu.Unlock()
	defer func() {
		p.missMu.Lock()
		p.missing--
		p.missMu.Unlock()
	}()
	m.forker.forkSlotsBegin(ck.Checkpoint.Id, width, false)
	defer m.forker.forkSlotsEnd()
	return m.forkReplica(ctx, t0, ck, fp)
}

// recordClaim counts a claim in the metrics and, for a miss, in the pool's
// durable record (a hit is persisted by claimWarm, in the claim's own
// transaction).
func (m *pooler) recordClaim(p *pool, result string, t0 time.Time) {
	d := time.Since(t0)
	id := p.rec.Pool.Id
	m.mu.Lock()
	if m.pools[id] == p {
		m.metrics.PoolClaims.WithLabelValues(id, result).Inc()
	}
	m.mu.Unlock()
	m.metrics.ClaimLatency.WithLabelValues(result).Observe(d.Seconds())
	if result != "miss" {
		return
	}
	p.misses.Add(1)
	if err := m.persistPool(p); err != nil {
		m.log.Error("persist pool counters", "pool", id, "err", err)
	}
}

func statusError(rep *controldv1.ForkReplica) error {
	return status.Error(codes.Code(rep.ErrorCode), rep.ErrorMessage)
}
