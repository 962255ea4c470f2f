package fleet

import (
	"context"
	"fmt"

	"github.com/distribution/reference"
	digest "github.com/opencontainers/go-digest"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/store"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

var errNoRegistry = errdefs.WithReason(errdefs.ErrFailedPrecondition, "REGISTRY_UNSUPPORTED", "runtime cannot reach OCI registries")

func registryOf(rt runtime.Runtime) (runtime.CheckpointRegistry, error) {
	if r, ok := runtime.As[runtime.CheckpointRegistry](rt); ok {
		return r, nil
	}
	return nil, errNoRegistry
}

// remoteCheckpoint returns the local checkpoint forked for the registry
// reference ref: the import of its manifest digest, pulled and imported
// now unless an earlier one is still here. Concurrent calls for one digest
// share the pull.
func (m *Manager) remoteCheckpoint(ctx context.Context, ref string) (*store.CheckpointRecord, error) {
	reg, err := registryOf(m.rt)
	if err != nil {
		return nil, err
	}
	ctx, span := m.tracer.Start(ctx, "checkpoint.remote")
	defer span.End()
	dg, err := reg.ResolveCheckpoint(ctx, ref)
	if err != nil {
		return nil, fmt.Errorf("checkpoint_reference %s: %w", ref, err)
	}
	if c := m.importedCheckpoint(dg); c != nil {
		return c, nil
	}
	// The pull runs for every waiter: one caller's cancellation does not
	// fail the others' forks.
	v, err, _ := m.pulls.Do(dg, func() (any, error) {
		if c := m.importedCheckpoint(dg); c != nil {
			return c, nil
		}
		pctx := context.WithoutCancel(ctx)
		local, err := pinnedName(ref, dg)
		if err != nil {
			return nil, err
		}
		if _, err := reg.PullCheckpoint(pctx, local, local); err != nil {
			return nil, fmt.Errorf("pull %s: %w", ref, err)
		}
		ck, err := m.importCheckpoint(pctx, local, dg)
		if err != nil {
			return nil, err
		}
		return m.findCheckpoint(ck.GetId())
	})
	if err != nil {
		return nil, err
	}
	return v.(*store.CheckpointRecord), nil
}

// importedCheckpoint returns the ready checkpoint imported from the image
// with manifest digest dg, if one is here.
func (m *Manager) importedCheckpoint(dg string) *store.CheckpointRecord {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range m.checkpoints {
		if c.ImportedDigest == dg && c.Checkpoint.GetState() == controldv1.CheckpointState_CHECKPOINT_STATE_READY {
			return c
		}
	}
	return nil
}

// pinnedName is reference's repository pinned to the manifest digest dg:
// what a fork pulls, so that a tag moved meanwhile cannot change it.
func pinnedName(ref, dg string) (string, error) {
	named, err := reference.ParseNamed(ref)
	if err != nil {
		return "", errdefs.InvalidField("checkpoint_reference", "%q is not a fully qualified image reference (host/path[:tag]): %v", ref, err)
	}
	d, err := digest.Parse(dg)
	if err != nil {
		return "", fmt.Errorf("registry answered digest %q: %w: %w", dg, errdefs.ErrUnavailable, err)
	}
	pinned, err := reference.WithDigest(reference.TrimNamed(named), d)
	if err != nil {
		return "", fmt.Errorf("pin %s: %w: %w", ref, errdefs.ErrInternal, err)
	}
	return pinned.String(), nil
}
