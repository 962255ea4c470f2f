//go:build linux

package containerdrt

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	cerrdefs "github.com/containerd/errdefs"
)

// layerSlots keeps, per parent snapshot (an image's top layer, or the
// checkpoint layer a checkpointed fork runs on), one empty checkpoint layer
// prepared ahead. Preparing a snapshot costs two metadata commits
// (containerd's and the snapshotter's, each an fsync: 5 to 15 ms here) that
// would otherwise sit between a checkpoint request and its freeze. A
// checkpoint takes the slot, and once it has committed a new one is
// prepared behind it.
//
// A slot pins its parent (it is GC-rooted), so slots do not outlive their
// use: one unused for layerSlotMaxAge goes at the next refill, a deleted
// checkpoint layer's goes with it (and gets no new one), and Close removes
// the rest. Slots a crash leaves behind carry the transient prefix, so
// RecoverCheckpoints removes them at the next start.
type layerSlots struct {
	mu      sync.Mutex
	ready   map[string]preparedLayer // parent -> slot
	filling map[string]bool
	dropped map[string]bool // deleted checkpoint layers: no slot on them again
	closed  bool
	wg      sync.WaitGroup // refills; waited for only once closed (no Add after)
}

// layerSlotMaxAge is how long a slot may wait for its checkpoint.
const layerSlotMaxAge = 10 * time.Minute

type preparedLayer struct {
	key    string
	mounts []mount.Mount
	at     time.Time
}

// prepareLayer makes an empty checkpoint layer on parent. A GC root label
// rather than a lease keeps containerd's collector off it until its commit
// (a lease is two more metadata commits).
func (r *Runtime) prepareLayer(ctx context.Context, parent string) (preparedLayer, error) {
	key := checkpointPreparePrefix + randomHex(8)
	ms, err := r.sn.Prepare(ctx, key, parent, snapshots.WithLabels(map[string]string{
		snapshotLabelGCRoot: time.Now().UTC().Format(time.RFC3339),
	}))
	if err != nil {
		return preparedLayer{}, fmt.Errorf("prepare checkpoint layer: %w", convertErr(err))
	}
	return preparedLayer{key: key, mounts: ms, at: time.Now()}, nil
}

// takeLayer returns an empty checkpoint layer on parent: the prepared slot
// when there is one.
func (r *Runtime) takeLayer(ctx context.Context, parent string) (preparedLayer, error) {
	s := &r.layers
	s.mu.Lock()
	l, ok := s.ready[parent]
	delete(s.ready, parent)
	s.mu.Unlock()
	if ok {
		return l, nil
	}
	return r.prepareLayer(ctx, parent)
}

// refillLayer prepares the next slot for parent in the background, after a
// checkpoint committed (a failed one leaves nothing behind, not even this),
// and removes slots that waited too long.
func (r *Runtime) refillLayer(parent string) {
	s := &r.layers
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	var stale []preparedLayer
	for p, l := range s.ready {
		if time.Since(l.at) > layerSlotMaxAge {
			stale = append(stale, l)
			delete(s.ready, p)
		}
	}
	_, ready := s.ready[parent]
	refill := !ready && !s.filling[parent] && !s.dropped[parent]
	if refill {
		if s.ready == nil {
			s.ready, s.filling = map[string]preparedLayer{}, map[string]bool{}
		}
		s.filling[parent] = true
	}
	if !refill && len(stale) == 0 {
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		ctx, cancel := context.WithTimeout(r.ctx(context.Background()), cleanupTimeout)
		defer cancel()
		for _, l := range stale {
			r.sn.Remove(ctx, l.key)
		}
		if !refill {
			return
		}
		l, err := r.prepareLayer(ctx, parent)
		s.mu.Lock()
		delete(s.filling, parent)
		keep := err == nil && !s.closed && !s.dropped[parent]
		if keep {
			s.ready[parent] = l
		}
		s.mu.Unlock()
		switch {
		case err != nil:
			r.log.Warn("prepare a checkpoint layer ahead", "parent", parent, "err", err)
		case !keep:
			r.sn.Remove(ctx, l.key)
		}
	}()
}

// dropLayerSlot removes the slot prepared on parent, a checkpoint layer
// being deleted, and keeps it from getting another (a checkpoint of one of
// its forks would prepare the next layer on it): the layer must not keep a
// child. A refill in flight for it removes what it makes.
func (r *Runtime) dropLayerSlot(ctx context.Context, parent string) error {
	s := &r.layers
	s.mu.Lock()
	if s.dropped == nil {
		s.dropped = map[string]bool{}
	}
	s.dropped[parent] = true
	l, ok := s.ready[parent]
	delete(s.ready, parent)
	s.mu.Unlock()
	if !ok {
		return nil
	}
	if err := r.sn.Remove(ctx, l.key); err != nil && !cerrdefs.IsNotFound(err) {
		s.mu.Lock()
		if !s.closed {
			s.ready[parent] = l // Close removes it
		}
		s.mu.Unlock()
		return fmt.Errorf("checkpoint layer slot %s: %w", l.key, convertErr(err))
	}
	return nil
}

// closeLayerSlots waits for refills and removes the prepared slots.
func (r *Runtime) closeLayerSlots(ctx context.Context) error {
	s := &r.layers
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.wg.Wait()
	s.mu.Lock()
	ready := s.ready
	s.ready = nil
	s.mu.Unlock()
	var errs []error
	for _, l := range ready {
		if err := r.sn.Remove(ctx, l.key); err != nil {
			errs = append(errs, fmt.Errorf("checkpoint layer slot %s: %w", l.key, convertErr(err)))
		}
	}
	return errors.Join(errs...)
}
