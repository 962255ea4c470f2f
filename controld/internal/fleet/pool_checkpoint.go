package fleet

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/forkfleet/forkfleet/api/errdefs/errgrpc"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/rules"
	"github.com/forkfleet/forkfleet/controld/internal/store"
)

// An image pool's misses fork instead of booting. Once the pool is full,
// its replenisher boots one more sandbox as it boots members, checkpoints
// it once it is ready (memory tier) and keeps that checkpoint as the
// pool's own (the sandbox goes: the members stay untouched and claimable); a claim that finds no warm member forks a replica of it, verified at
// every level the checkpoint records, as a checkpoint pool's miss does.
//
// The checkpoint is shown (ListCheckpoints, GetCheckpoint: the forks name
// it as their checkpoint_id) with the label pool_id=<pool>, and only the
// pool deletes it: DeleteCheckpoint refuses it while the pool lives. When
// the image name moves to another digest, or the pool is deleted, it is
// retired: no miss forks it any more, and it is deleted as soon as no
// fork of it is left (DeletePool at once, else the reaper).

// poolCheckpointRetry is the first wait after a failed pool checkpoint;
// it doubles up to poolCheckpointMaxRetry.
const (
	poolCheckpointRetry    = 5 * time.Second
	poolCheckpointMaxRetry = 5 * time.Minute
)

// poolCheckpoint is what an image pool knows about making its checkpoint.
type poolCheckpoint struct {
	// next is when a failed attempt may be tried again; wait is the next
	// backoff.
	next time.Time
	wait time.Duration
}

// poolCheckpointLocked returns p's checkpoint in service (nil: none).
func (m *pooler) poolCheckpointLocked(poolID string) *store.CheckpointRecord {
	for _, c := range m.checkpoints {
		if c.Pool == poolID && !c.Retired {
			return c
		}
	}
	return nil
}

// imageMoved reports whether the image ck was taken on is no longer what its
// name names (false when the runtime cannot tell, or the name is gone:
// a fork still restores the image it pins).
func (m *pooler) imageMoved(ctx context.Context, ck *store.CheckpointRecord) bool {
	if ck.Ref.ImageDigest == "" {
		return false
	}
	dg := m.imageDigestNow(ctx, ck.Ref.Image)
	return dg != "" && dg != ck.Ref.ImageDigest
}

// missCheckpoint returns the checkpoint p's miss forks from, or nil (none
// yet, or of an image the name no longer names: retired here, and the
// replenisher makes the next).
func (m *pooler) missCheckpoint(ctx context.Context, p *pool) *store.CheckpointRecord {
	m.mu.Lock()
	ck := m.poolCheckpointLocked(p.rec.Pool.Id)
	m.mu.Unlock()
	if ck == nil {
		return nil
	}
	if m.imageMoved(ctx, ck) {
		m.retirePoolCheckpoint(ctx, ck.Checkpoint.Id, "image moved")
		m.kickPool(p.rec.Pool.Id)
		return nil
	}
	return ck
}

// forkMiss serves an image pool's miss from its checkpoint. ok is false
// when there is none (or the fork failed): the caller boots.
func (m *pooler) forkMiss(ctx context.Context, p *pool, pb *controldv1.Pool, labels map[string]string, ttl time.Duration, nw *controldv1.Network, t0 time.Time,
	tag *store.RequestTag) (*controldv1.Sandbox, *controldv1.Endpoint, bool) {
	ck := m.missCheckpoint(ctx, p)
	if ck == nil {
		return nil, nil, false
	}
	rep := m.forkMissReplica(ctx, p, t0, ck, forkParams{resources: pb.Resources, labels: labels, ttl: ttl, levels: rules.DefaultLevels(ck.Checkpoint.VerifyLevels),
		poolID: pb.Id, policy: nw.GetPolicy(), request: tag})
	if rep.ErrorCode != 0 {
		// A boot still serves the claim; the checkpoint stays (a fork can
		// fail for the host's reasons, such as memory).
		m.log.Warn("pool miss: fork of the pool's checkpoint failed; booting instead", "pool", pb.Id, "checkpoint", ck.Checkpoint.Id,
			"err", errgrpc.FromGRPC(statusError(rep)))
		return nil, nil, false
	}
	return rep.Sandbox, rep.Endpoint, true
}

// keepPoolCheckpoint makes sure a full image pool has its checkpoint of
// the image its name names now: it retires one of an older image and
// checkpoints a member when there is none. again reports that it waited
// for claims to go quiet (the caller looks at the pool again first); ok
// is false when ctx ended.
func (m *pooler) keepPoolCheckpoint(ctx context.Context, p *pool) (again, ok bool) {
	id := p.rec.Pool.Id
	m.mu.Lock()
	ck := m.poolCheckpointLocked(id)
	m.mu.Unlock()
	if ck != nil {
		if !m.imageMoved(ctx, ck) {
			return false, true
		}
		m.retirePoolCheckpoint(ctx, ck.Checkpoint.Id, "image moved")
	}
	if time.Now().Before(p.ck.next) {
		return false, true
	}
	// A checkpoint freezes a member for its dump and takes the CPU a claim
	// burst needs, like a refill.
	waited, ok := m.waitClaimsQuiet(ctx, time.Now())
	if !ok || waited {
		return waited, ok
	}
	made, err := m.makePoolCheckpoint(ctx, p)
	m.kickPool(id) // refresh the available gauge
	if err != nil {
		if ctx.Err() != nil {
			return false, false
		}
		p.ck.wait = min(max(2*p.ck.wait, poolCheckpointRetry), poolCheckpointMaxRetry)
		p.ck.next = time.Now().Add(p.ck.wait)
		m.log.Warn("pool checkpoint failed; misses boot", "pool", id, "err", err, "retry_in", p.ck.wait)
		return false, true
	}
	p.ck.wait, p.ck.next = 0, time.Time{}
	m.log.Info("pool checkpoint made; misses fork from it", "pool", id, "checkpoint", made.GetId())
	return false, true
}

// makePoolCheckpoint boots a sandbox exactly as p's members are booted,
// checkpoints it (memory tier, stopping it) as p's own and deletes it. It
// is reserved from the start: no claim takes it and the replenisher does
// not count it, so the pool's members stay untouched and claimable.
func (m *pooler) makePoolCheckpoint(ctx context.Context, p *pool) (*controldv1.Checkpoint, error) {
	m.mu.Lock()
	pb := proto.Clone(p.rec.Pool).(*controldv1.Pool)
	m.mu.Unlock()
	t0 := time.Now()
	sb, err := m.newSandbox(sandboxParams{
		image: pb.Image, resources: pb.Resources, screen: pb.Screen, labels: pb.Labels, poolID: pb.Id, pooled: true,
		network: pb.GetNetwork(),
	}, t0)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	sb.claimed = true
	m.mu.Unlock()
	srcID := sb.rec.Sandbox.GetId()
	defer func() {
		if derr := m.deleteSandbox(m.ctx, sb, "pool checkpoint source"); derr != nil {
			m.log.Error("remove the pool checkpoint's source", "sandbox", srcID, "err", derr)
		}
	}()
	m.startBoot(sb, t0, "pool")
	if _, err := m.waitSettled(ctx, sb); err != nil {
		return nil, fmt.Errorf("boot its source %s: %w", srcID, err)
	}
	if err := m.waitScreenStill(ctx, sb); err != nil {
		return nil, fmt.Errorf("source %s: screen still: %w", srcID, err)
	}
	ck, err := m.createCheckpoint(ctx, &controldv1.CreateCheckpointRequest{SandboxId: srcID, Tier: controldv1.CheckpointTier_CHECKPOINT_TIER_MEMORY, Stop: true},
		nil, pb.Id)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w", srcID, err)
	}
	return ck, nil
}

// poolCheckpointSettle is how long the source's screen must have been
// still before the pool checkpoints it (guestd bounds the wait).
const poolCheckpointSettle = 500 * time.Millisecond

// waitScreenStill waits until the pool checkpoint's source has stopped
// drawing. The checkpoint hashes its frame under an X server grab without
// waiting for the screen to settle (a user's checkpoint is of the moment it
// was asked for). A source checkpointed right at "usable" (windows mapped
// and focused) may still be painting: its shell's prompt, the focus
// decorations. Its replicas are born with that frame (their first-frame
// proof holds), but once the grab is released they finish the paint, so a
// later VerifySandbox of a miss's fork compared a settled screen the
// checkpoint never showed. The pool picks its own moment: a still one.
func (m *pooler) waitScreenStill(ctx context.Context, sb *sandbox) error {
	m.mu.Lock()
	sock, admin := sb.rec.ACISocket, sb.rec.AdminToken
	m.mu.Unlock()
	g, err := m.dialGuest(ctx, sock, admin)
	if err != nil {
		return err
	}
	defer g.Close()
	_, err = g.FrameHash(ctx, poolCheckpointSettle)
	return err
}

// retirePoolCheckpoint takes a pool's checkpoint out of service and deletes
// it if no fork of it is left.
func (m *pooler) retirePoolCheckpoint(ctx context.Context, id, why string) {
	m.ckMu.Lock()
	m.mu.Lock()
	c, ok := m.checkpoints[id]
	if !ok || c.Retired {
		m.mu.Unlock()
		m.ckMu.Unlock()
		return
	}
	rc := cloneCheckpoint(c)
	rc.Retired = true
	m.mu.Unlock()
	err := m.st.Update(func(tx *store.Tx) error { return tx.PutCheckpoint(rc) })
	if err == nil {
		m.mu.Lock()
		m.checkpoints[id] = rc
		m.mu.Unlock()
	}
	m.ckMu.Unlock()
	if err != nil {
		m.log.Error("retire pool checkpoint", "checkpoint", id, "err", err)
		return
	}
	m.log.Info("pool checkpoint retired", "checkpoint", id, "pool", rc.Pool, "why", why)
	m.sweepPoolCheckpoints(ctx)
}

// sweepPoolCheckpoints deletes the retired pool checkpoints (and those of
// pools that are gone: a crash in DeletePool) that no fork uses any more.
func (m *pooler) sweepPoolCheckpoints(ctx context.Context) {
	m.ckMu.Lock()
	defer m.ckMu.Unlock()
	m.sweepPoolCheckpointsLocked(ctx)
}

// sweepPoolCheckpointsIdle is sweepPoolCheckpoints unless a checkpoint
// operation holds the lock (the reaper's: it does not wait behind a long
// delete; the next round sweeps).
func (m *pooler) sweepPoolCheckpointsIdle(ctx context.Context) {
	if !m.ckMu.TryLock() {
		return
	}
	defer m.ckMu.Unlock()
	m.sweepPoolCheckpointsLocked(ctx)
}

func (m *pooler) sweepPoolCheckpointsLocked(ctx context.Context) {
	m.mu.Lock()
	var gone []string
	for id, c := range m.checkpoints {
		if c.Pool == "" {
			continue
		}
		if _, live := m.pools[c.Pool]; live && !c.Retired {
			continue
		}
		if m.liveForksLocked(id) == 0 && len(c.Checkpoint.ChildIds) == 0 {
			gone = append(gone, id)
		}
	}
	m.mu.Unlock()
	for _, id := range gone {
		if err := m.deleteOneCheckpoint(ctx, id); err != nil && !errors.Is(err, context.Canceled) {
			m.log.Warn("delete retired pool checkpoint", "checkpoint", id, "err", err)
		}
	}
}

// poolOwnsLocked returns the pool that keeps checkpoint c as its own and
// lives, or "".
func (m *pooler) poolOwnsLocked(c *store.CheckpointRecord) string {
	if c == nil || c.Pool == "" || c.Retired {
		return ""
	}
	if _, ok := m.pools[c.Pool]; !ok {
		return ""
	}
	return c.Pool
}

// retirePoolCheckpoints retires every checkpoint of pool id (DeletePool).
func (m *pooler) retirePoolCheckpoints(ctx context.Context, id string) {
	m.mu.Lock()
	var ids []string
	for ckID, c := range m.checkpoints {
		if c.Pool == id && !c.Retired {
			ids = append(ids, ckID)
		}
	}
	m.mu.Unlock()
	for _, ckID := range ids {
		m.retirePoolCheckpoint(ctx, ckID, "pool deleted")
	}
	m.sweepPoolCheckpoints(ctx)
}
