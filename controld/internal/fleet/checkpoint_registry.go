package fleet

import (
	"context"
	"fmt"
	"time"

	"github.com/distribution/reference"
	digest "github.com/opencontainers/go-digest"
	"google.golang.org/grpc/codes"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/errdefs/errgrpc"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/store"
)

var errNoRegistry = errdefs.WithReason(errdefs.ErrFailedPrecondition, "REGISTRY_UNSUPPORTED", "runtime cannot reach OCI registries")

func registryOf(rt runtime.Runtime) (runtime.CheckpointRegistry, error) {
	if r, ok := runtime.As[runtime.CheckpointRegistry](rt); ok {
		return r, nil
	}
	return nil, errNoRegistry
}

// remote returns the local checkpoint forked for the registry
// reference ref: the import of its manifest digest, pulled and imported
// now unless an earlier one is still here. Concurrent calls for one digest
// share the pull.
func (t *transfer) remote(ctx context.Context, ref string) (*store.CheckpointRecord, error) {
	m := t.m
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
	if c := t.imported(dg); c != nil {
		m.metrics.RemoteForks.WithLabelValues("cached").Inc()
		return c, nil
	}
	// The pull runs for every waiter: one caller's cancellation does not
	// fail the others' forks.
	v, err, shared := t.pulls.Do(dg, func() (any, error) {
		if c := t.imported(dg); c != nil {
			return c, nil
		}
		pctx := context.WithoutCancel(ctx)
		local, err := pinnedName(ref, dg)
		if err != nil {
			return nil, err
		}
		if _, err := t.pull(pctx, reg, local); err != nil {
			return nil, fmt.Errorf("pull %s: %w", ref, err)
		}
		ck, err := t.importImage(pctx, local, dg)
		// The pulled image was only the way here: the import holds the
		// checkpoint, and an image left behind would outlive it unowned.
		if rerr := reg.RemoveCheckpointImage(pctx, local); rerr != nil {
			m.log.Warn("remove pulled checkpoint image", "image", local, "err", rerr)
		}
		if err != nil {
			return nil, err
		}
		return m.findCheckpoint(ck.GetId())
	})
	if err != nil {
		return nil, err
	}
	if shared {
		m.metrics.RemoteForks.WithLabelValues("shared").Inc()
	} else {
		m.metrics.RemoteForks.WithLabelValues("pulled").Inc()
	}
	return v.(*store.CheckpointRecord), nil
}

// push and pull move a checkpoint image and count it (registry_* metrics).
func (t *transfer) push(ctx context.Context, reg runtime.CheckpointRegistry, ref string) (int64, error) {
	m := t.m
	t0 := time.Now()
	n, err := reg.PushCheckpoint(ctx, ref)
	m.metrics.RegistryBytes.WithLabelValues("push").Add(float64(n))
	m.metrics.RegistryTransfer.WithLabelValues("push", transferCode(err)).Observe(time.Since(t0).Seconds())
	return n, err
}

func (t *transfer) pull(ctx context.Context, reg runtime.CheckpointRegistry, ref string) (int64, error) {
	m := t.m
	ctx, span := m.tracer.Start(ctx, "checkpoint.pull")
	defer span.End()
	t0 := time.Now()
	n, err := reg.PullCheckpoint(ctx, ref, ref)
	m.metrics.RegistryBytes.WithLabelValues("pull").Add(float64(n))
	m.metrics.RegistryTransfer.WithLabelValues("pull", transferCode(err)).Observe(time.Since(t0).Seconds())
	return n, err
}

// imported returns the ready checkpoint imported from the image
// with manifest digest dg, if one is here.
func (t *transfer) imported(dg string) *store.CheckpointRecord {
	m := t.m
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

// transferCode is a transfer's outcome as a gRPC code name.
func transferCode(err error) string {
	code := errgrpc.Code(err)
	if err != nil && code == codes.Unknown {
		code = codes.Internal
	}
	return code.String()
}
