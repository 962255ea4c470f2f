//go:build linux

package containerdrt

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/network"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

type precreated = sandbox

var (
	_ runtime.Precreator        = (*Runtime)(nil)
	_ runtime.RestorePrecreator = (*Runtime)(nil)
)

// Precreate does everything Boot(spec) does except starting: the snapshot,
// the container and the task (shim started, runc create done) exist
// afterwards, in state Created. A later Boot with an identical spec only
// starts the task. Boot with a different spec for the same id discards the
// precreated sandbox and boots normally; Delete removes it. Precreated
// sandboxes are remembered in memory only: Close removes them; after a
// crash List shows them as StatusCreated and the caller deletes them.
func (r *Runtime) Precreate(ctx context.Context, spec runtime.BootSpec) error {
	if err := validateBootSpec(spec); err != nil {
		return err
	}
	if spec.Image == "" {
		return errdefs.InvalidField("image", "required")
	}
	ctx = r.ctx(ctx)
	if err := r.reservePrecreate(spec.ID); err != nil {
		return err
	}
	sb, err := r.createBoot(ctx, spec)
	return r.finishPrecreate(spec.ID, bootFingerprint(spec), sb, err)
}

// PrecreateRestore does everything Restore(spec, from) does except the
// final Start, where runc restore runs: the fork's snapshot, container and
// shim exist afterwards. A later Restore with identical arguments only
// starts it.
func (r *Runtime) PrecreateRestore(ctx context.Context, spec runtime.BootSpec, from runtime.CheckpointRef) error {
	if err := r.validateRestore(spec, from); err != nil {
		return err
	}
	ctx = r.ctx(ctx)
	if err := r.reservePrecreate(spec.ID); err != nil {
		return err
	}
	sb, err := r.createRestore(ctx, spec, from)
	return r.finishPrecreate(spec.ID, restoreFingerprint(spec, from), sb, err)
}

func (r *Runtime) reservePrecreate(id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.precreated[id]; ok {
		return fmt.Errorf("sandbox %s: %w (already precreated)", id, errdefs.ErrAlreadyExists)
	}
	r.precreated[id] = nil // reserved while being created
	return nil
}

func (r *Runtime) finishPrecreate(id, fp string, sb *sandbox, err error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		delete(r.precreated, id)
		return err
	}
	sb.fingerprint = fp
	r.precreated[id] = sb
	return nil
}

// takePrecreated returns the precreated sandbox id if it was made for the
// same request; one made for another request is removed.
func (r *Runtime) takePrecreated(ctx context.Context, id, fp string) *sandbox {
	r.mu.Lock()
	sb, ok := r.precreated[id]
	if !ok || sb == nil {
		r.mu.Unlock()
		return nil
	}
	delete(r.precreated, id)
	r.mu.Unlock()
	if sb.fingerprint == fp {
		return sb
	}
	r.cleanup(ctx, id, sb.container, sb.task, true)
	return nil
}

// Discard removes a sandbox precreated and never booted: task, container,
// snapshot, cgroups, log. An id that is not precreated (unknown, or booted
// since) is ErrNotFound, so Discard never touches a running sandbox; one
// still being precreated is ErrFailedPrecondition.
func (r *Runtime) Discard(ctx context.Context, id string) error {
	if err := validateID(id); err != nil {
		return err
	}
	ctx = r.ctx(ctx)
	r.mu.Lock()
	sb, ok := r.precreated[id]
	switch {
	case !ok:
		r.mu.Unlock()
		return fmt.Errorf("sandbox %s: %w (not precreated)", id, errdefs.ErrNotFound)
	case sb == nil:
		r.mu.Unlock()
		return fmt.Errorf("sandbox %s: %w (still being precreated)", id, errdefs.ErrFailedPrecondition)
	}
	delete(r.precreated, id)
	r.mu.Unlock()
	if err := r.cleanup(ctx, id, sb.container, sb.task, true); err != nil {
		return fmt.Errorf("sandbox %s: discard: %w", id, convertErr(err))
	}
	return nil
}

// dropPrecreated forgets a precreated sandbox (Delete removes it).
func (r *Runtime) dropPrecreated(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if sb, ok := r.precreated[id]; ok && sb != nil {
		delete(r.precreated, id)
	}
}

func bootFingerprint(spec runtime.BootSpec) string {
	return fingerprint("boot", spec, runtime.CheckpointRef{})
}

func restoreFingerprint(spec runtime.BootSpec, from runtime.CheckpointRef) string {
	return fingerprint("restore", spec, from)
}

func fingerprint(kind string, spec runtime.BootSpec, from runtime.CheckpointRef) string {
	spec.Network.Policy = network.Policy{} // applied at start, not at create
	b, err := json.Marshal(struct {
		Kind string
		Spec runtime.BootSpec
		From runtime.CheckpointRef
	}{kind, spec, from})
	if err != nil {
		panic(err) // plain data always marshals
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
