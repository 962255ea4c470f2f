package fleet

import (
	"context"
	"errors"
	"fmt"
	"os"

	"google.golang.org/protobuf/proto"

	"github.com/forkfleet/forkfleet/api/errdefs"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/api/rules"
	"github.com/forkfleet/forkfleet/controld/internal/store"
)

// findCheckpoint resolves an id or a name.
func (m *registry) findCheckpoint(idOrName string) (*store.CheckpointRecord, error) {
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
func (m *checkpointer) checkpointView(id string) (*controldv1.Checkpoint, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.checkpoints[id]
	if !ok {
		return nil, checkpointNotFound(id)
	}
	return m.checkpointViewLocked(c), nil
}

func (m *checkpointer) checkpointViewLocked(c *store.CheckpointRecord) *controldv1.Checkpoint {
	v := proto.Clone(c.Checkpoint).(*controldv1.Checkpoint)
	v.LiveForks = uint32(m.liveForksLocked(c.Checkpoint.Id))
	// This host holds it, whichever host took it (an import's record says
	// its source's).
	v.Host = m.opts.Host
	return v
}

func (m *checkpointer) liveForksLocked(ckID string) int {
	n := 0
	for _, sb := range m.sandboxes {
		if sb.rec.Sandbox.CheckpointId == ckID && !sb.deleting {
			n++
		}
	}
	return n
}

// GetCheckpoint returns a checkpoint by id or name.
func (m *checkpointer) GetCheckpoint(_ context.Context, idOrName string) (*controldv1.Checkpoint, error) {
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
func (m *checkpointer) ListCheckpoints(_ context.Context, req *controldv1.ListCheckpointsRequest) ([]*controldv1.Checkpoint, string, error) {
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
func (m *checkpointer) subtreeLocked(root string) map[string]bool {
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
func (m *checkpointer) DeleteCheckpoint(ctx context.Context, idOrName string, cascade bool) ([]string, error) {
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
		if pl := m.poolOwnsLocked(m.checkpoints[x]); pl != "" {
			m.mu.Unlock()
			return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "CHECKPOINT_IN_USE",
				"checkpoint %s is pool %s's own (its misses fork from it); it goes with the pool", x, pl)
		}
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

func (m *checkpointer) deleteOneCheckpoint(ctx context.Context, id string) error {
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
