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

// layerSlots keeps, per parent snapshot (an image's top layer), one empty
// checkpoint layer prepared ahead. Preparing a snapshot costs two metadata
// commits (containerd's and the snapshotter's, each an fsync: 5 to 15 ms
// here) that would otherwise sit between a checkpoint request and its
// freeze. A checkpoint takes the slot, and once it has committed a new one
// is prepared behind it.
// Slots a crash leaves behind carry the transient prefix, so
// RecoverCheckpoints removes them at the next start.
type layerSlots struct {
	mu      sync.Mutex
	ready   map[string]preparedLayer // parent -> slot
	filling map[string]bool
	closed  bool
	wg      sync.WaitGroup
}

type preparedLayer struct {
	key    string
	mounts []mount.Mount
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
	return preparedLayer{key: key, mounts: ms}, nil
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
// checkpoint committed (a failed one leaves nothing behind, not even this).
func (r *Runtime) refillLayer(parent string) {
	s := &r.layers
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.filling[parent] {
		return
	}
	if _, ok := s.ready[parent]; ok {
		return
	}
	if s.ready == nil {
		s.ready, s.filling = map[string]preparedLayer{}, map[string]bool{}
	}
	s.filling[parent] = true
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		ctx, cancel := context.WithTimeout(r.ctx(context.Background()), cleanupTimeout)
		defer cancel()
		l, err := r.prepareLayer(ctx, parent)
		s.mu.Lock()
		delete(s.filling, parent)
		keep := err == nil && !s.closed
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

// dropLayerSlot removes the slot prepared on parent, if any: a checkpoint
// layer being deleted must not keep a child (a checkpoint of one of its
// forks prepares the next layer on it).
func (r *Runtime) dropLayerSlot(ctx context.Context, parent string) error {
	s := &r.layers
	s.wg.Wait() // a refill in flight may be for parent
	s.mu.Lock()
	l, ok := s.ready[parent]
	delete(s.ready, parent)
	s.mu.Unlock()
	if !ok {
		return nil
	}
	if err := r.sn.Remove(ctx, l.key); err != nil && !cerrdefs.IsNotFound(err) {
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
