//go:build linux

package containerdrt

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/oci"
	cerrdefs "github.com/containerd/errdefs"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/network"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// pinnedImage returns the image a checkpoint's source booted from: by name
// when the name still denotes the digest the checkpoint recorded, else any
// image of that digest in the namespace. A fork must not start from
// another image's config (entrypoint, environment, CRIU options) under the
// old name.
func (r *Runtime) pinnedImage(ctx context.Context, meta checkpointMeta) (client.Image, error) {
	img, err := r.image(ctx, meta.Image)
	if err == nil && (meta.ImageDigest == "" || img.Target().Digest.String() == meta.ImageDigest) {
		return img, nil // no digest: a checkpoint from before they were recorded
	}
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return nil, err
	}
	if meta.ImageDigest != "" {
		list, lerr := r.client.ImageService().List(ctx, "target.digest=="+meta.ImageDigest)
		if lerr != nil {
			return nil, fmt.Errorf("images of digest %s: %w", meta.ImageDigest, convertErr(lerr))
		}
		if len(list) > 0 {
			return r.image(ctx, list[0].Name)
		}
	}
	return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "BASE_IMAGE_MISMATCH",
		"checkpoint was taken on image %s (%s), which is not in namespace %s any more", meta.Image, meta.ImageDigest, r.cfg.Namespace)
}

// restoreBase is what every fork of one checkpoint is made from: its
// metadata, its pinned image with that image's CRIU options and process,
// and (memory tier) its CRIU images' layout. A checkpoint's directory does
// not change once committed, so this is read and checked once per
// checkpoint (and per controld run), not per replica: at a fan-out of N
// every replica read checkpoint.json and five CRIU images, and asked
// containerd for the image and its config, again. DeleteCheckpoint drops
// it.
type restoreBase struct {
	meta     checkpointMeta
	img      client.Image
	criuOpts []string
	proc     imageProcess
	// usernsImages are the userns images of a memory-tier checkpoint
	// (checkImagesLayout: dumped as this host runs sandboxes).
	usernsImages []string
}

// restoreBase returns from's restoreBase; a failure is not kept, so a
// checkpoint whose image comes back later forks then.
func (r *Runtime) restoreBase(ctx context.Context, from runtime.CheckpointRef) (*restoreBase, error) {
	if b, ok := r.restoreBases.Load(from.Dir); ok {
		return b.(*restoreBase), nil
	}
	meta, err := readMeta(from.Dir)
	if err != nil {
		return nil, err
	}
	img, err := r.pinnedImage(ctx, meta)
	if err != nil {
		return nil, err
	}
	b := &restoreBase{meta: meta, img: img}
	if b.criuOpts, err = r.imageCRIUOptions(ctx, img); err != nil {
		return nil, err
	}
	if b.proc, err = r.imageProcess(ctx, img); err != nil {
		return nil, err
	}
	if meta.Tier == tierName(runtime.TierMemory) {
		if b.usernsImages, err = checkImagesLayout(filepath.Join(from.Dir, criuImageDir), r.cfg.UserNamespaces != nil); err != nil {
			return nil, fmt.Errorf("checkpoint %s: %w", from.Dir, err)
		}
	}
	r.restoreBases.Store(from.Dir, b)
	return b, nil
}

// restorePaths are the CRIU directories of a memory-tier fork.
type restorePaths struct {
	image string // the checkpoint's images (shared, read-only)
	work  string // this fork's own work dir: parallel restores must not share restore.log
}

func (r *Runtime) validateRestore(spec runtime.BootSpec, from runtime.CheckpointRef) error {
	if err := validateBootSpec(spec); err != nil {
		return err
	}
	if err := r.validateCheckpointDir("from.dir", from.Dir); err != nil {
		return err
	}
	if from.Tier != runtime.TierMemory && from.Tier != runtime.TierDisk {
		return errdefs.InvalidField("from.tier", "unknown tier %d", from.Tier)
	}
	return nil
}

// Restore starts a fork of a checkpoint: its own snapshot on top of the
// committed layer (an O(1) overlay prepare), its own cgroup and network
// namespace; memory tier: runc restore of the CRIU images; disk tier: a
// fresh boot of the source's spec with the fork's identity.
func (r *Runtime) Restore(ctx context.Context, spec runtime.BootSpec, from runtime.CheckpointRef) (runtime.Instance, error) {
	if err := r.validateRestore(spec, from); err != nil {
		return runtime.Instance{}, err
	}
	ctx = r.ctx(ctx)
	sb := r.takePrecreated(ctx, spec.ID, restoreFingerprint(spec, from))
	if sb == nil {
		var err error
		if sb, err = r.createRestore(ctx, spec, from); err != nil {
			return runtime.Instance{}, err
		}
	}
	work := r.restoreWorkDir(spec.ID)
	inst, err := r.start(ctx, sb, spec.Network.Policy)
	if err != nil && from.Tier == runtime.TierMemory {
		err = fmt.Errorf("%w%s", err, criuLogErrors(filepath.Join(work, "restore.log"), "criu restore.log"))
	}
	os.RemoveAll(work)
	os.RemoveAll(forkImagesDir(from.Dir, spec.ID)) // restored: CRIU read them
	if err == nil && from.Tier == runtime.TierMemory {
		// Connections to the outside were restored with the rest (CRIU
		// tcp-established, so those within the sandbox survive): their
		// peers know only the source. Closed at once, while the replica's
		// link is still held down, before anyone is told it exists.
		n, cerr := r.net.FinishRestore(spec.ID, !spec.Network.Hold)
		if cerr != nil {
			r.cleanup(ctx, spec.ID, sb.container, sb.task, true)
			return runtime.Instance{}, fmt.Errorf("sandbox %s: %w", spec.ID, cerr)
		}
		if n > 0 {
			r.log.DebugContext(ctx, "closed the replica's connections to the outside", "sandbox", spec.ID, "count", n)
		}
	}
	return inst, err
}

func (r *Runtime) restoreWorkDir(id string) string { return r.workDir(id + "-restore") }

// createRestore creates the fork's container and task (the shim holds the
// restore options; runc restore runs at Start).
func (r *Runtime) createRestore(ctx context.Context, spec runtime.BootSpec, from runtime.CheckpointRef) (*sandbox, error) {
	base, err := r.restoreBase(ctx, from)
	if err != nil {
		return nil, err
	}
	meta := base.meta
	if from.Snapshot != "" && from.Snapshot != meta.Snapshot {
		return nil, fmt.Errorf("checkpoint %s holds layer %s, not %s: %w", from.Dir, meta.Snapshot, from.Snapshot, errdefs.ErrFailedPrecondition)
	}
	if tierName(from.Tier) != meta.Tier {
		return nil, fmt.Errorf("checkpoint %s is a %s checkpoint: %w", from.Dir, meta.Tier, errdefs.ErrFailedPrecondition)
	}
	if meta.Snapshotter != r.cfg.Snapshotter {
		return nil, fmt.Errorf("checkpoint %s lives in snapshotter %s: %w", from.Dir, meta.Snapshotter, errdefs.ErrFailedPrecondition)
	}
	// A fork keeps its source's in-sandbox network (address, routes,
	// resolver): restored sockets and configuration depend on it.
	if got := checkpointNetworkMode(meta); got != spec.Network.Mode {
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "NETWORK_MODE_MISMATCH",
			"checkpoint %s was taken in network mode %s; its forks cannot run in mode %s", from.Dir, got, spec.Network.Mode)
	}
	img, criuOpts, proc := base.img, base.criuOpts, base.proc
	rng, err := r.takeRange(ctx, spec.ID)
	if err != nil {
		return nil, err
	}
	// A memory-tier fork restores from its own view of the images (its
	// range's user namespace), made before anything else of it.
	var restore *restorePaths
	if from.Tier == runtime.TierMemory {
		images, err := linkForkImages(from.Dir, spec.ID, rng, base.usernsImages)
		if err != nil {
			r.releaseRange(spec.ID, rng)
			return nil, err
		}
		restore = &restorePaths{image: images, work: r.restoreWorkDir(spec.ID)}
	}
	// What is made before the container goes with it on error.
	undo := func() {
		r.releaseRange(spec.ID, rng)
		os.RemoveAll(forkImagesDir(from.Dir, spec.ID))
	}
	nsb, err := r.setupNetwork(ctx, spec, from.Tier == runtime.TierMemory)
	if err != nil {
		undo()
		return nil, err
	}
	// The whole spec from this host's policy and the checkpoint's (pinned)
	// image, with the fork's own cgroup, limits, network namespace, user
	// namespace and identity, as for a boot: nothing of the checkpoint's
	// spec.json (whose capabilities, seccomp profile, mounts and devices are
	// its writer's). Only process state (CRIU images, the user namespace's
	// mappings rewritten to the fork's range) and the layer come from a
	// checkpoint.
	s, err := oci.GenerateSpec(ctx, r.client, &containers.Container{ID: spec.ID},
		r.sandboxSpecOpts(withImageProcess(proc), spec, criuOpts, nsb, rng, meta.RunLayout)...)
	if err != nil {
		undo()
		r.cleanup(ctx, spec.ID, nil, nil, true)
		return nil, fmt.Errorf("fork spec: %w: %w", errdefs.ErrInternal, err)
	}
	labels := withImageDigest(r.labelsOf(spec), img.Target().Digest.String())
	labels[labelImage] = meta.Image // what the fork really runs
	labels[labelCheckpoint] = from.Dir
	labels[labelTier] = meta.Tier

	if restore != nil {
		if err := os.RemoveAll(restore.work); err != nil {
			undo()
			r.cleanup(ctx, spec.ID, nil, nil, true)
			return nil, fmt.Errorf("restore work dir: %w: %w", errdefs.ErrInternal, err)
		}
	}
	opts := []client.NewContainerOpts{
		withForkSnapshot(r.cfg.Snapshotter, spec.ID, meta.Snapshot, snapshotOpts(rng)...),
		client.WithRuntime(r.cfg.Runtime, r.runcOptions()),
		client.WithSpec(s),
		client.WithContainerLabels(labels),
	}
	if meta.Image != "" {
		opts = append(opts, client.WithImageName(meta.Image))
	}
	c, err := r.client.NewContainer(ctx, spec.ID, opts...)
	if err != nil {
		undo()
		if !cerrdefs.IsAlreadyExists(err) {
			r.cleanup(ctx, spec.ID, nil, nil, true)
		} else {
			r.net.Release(ctx, spec.ID) // ours: Setup succeeded for this id
		}
		return nil, fmt.Errorf("sandbox %s: create container: %w", spec.ID, convertErr(err))
	}
	return r.createTask(ctx, spec, c, restore)
}

// withForkSnapshot prepares the fork's writable snapshot on top of the
// committed checkpoint layer inside NewContainer, so NewContainer's lease
// covers it until the container record references it.
func withForkSnapshot(snapshotter, key, parent string, opts ...snapshots.Opt) client.NewContainerOpts {
	return func(ctx context.Context, c *client.Client, ctr *containers.Container) error {
		if _, err := c.SnapshotService(snapshotter).Prepare(ctx, key, parent, opts...); err != nil {
			return err
		}
		ctr.Snapshotter = snapshotter
		ctr.SnapshotKey = key
		return nil
	}
}

// checkpointNetworkMode is the network mode a checkpoint's source ran in.
func checkpointNetworkMode(meta checkpointMeta) network.Mode {
	if meta.NetworkMode == network.ModeEgress.String() {
		return network.ModeEgress
	}
	return network.ModeNone
}
