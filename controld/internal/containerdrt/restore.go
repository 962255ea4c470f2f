//go:build linux

package containerdrt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/oci"
	cerrdefs "github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/network"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/userns"
)

// pinnedImage returns the image a checkpoint's source booted from: by name
// when the name still denotes the digest the checkpoint recorded, else any
// image of that digest in the namespace, else (the name was re-imported and
// no image names the old digest) that digest's content, which the pins keep
// (labelImagePin). A fork must not start from another image's config
// (entrypoint, environment, CRIU options) under the old name.
func (r *Runtime) pinnedImage(ctx context.Context, meta checkpointMeta) (client.Image, error) {
	if meta.Image == "" {
		return nil, fmt.Errorf("no base image recorded: %w", errdefs.ErrNotFound)
	}
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
		if img, err := r.pinnedContent(ctx, meta.Image, meta.ImageDigest); err == nil {
			return r.unpackImage(ctx, img)
		} else if !errors.Is(err, errdefs.ErrNotFound) {
			return nil, err
		}
	}
	return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "BASE_IMAGE_MISMATCH",
		"checkpoint was taken on image %s (%s), which is not in namespace %s any more", meta.Image, meta.ImageDigest, r.cfg.Namespace)
}

// pinnedContent is the image of manifest dg (a digest controld recorded) as
// name, from the content store alone: no image record names it any more.
func (r *Runtime) pinnedContent(ctx context.Context, name, dg string) (client.Image, error) {
	d, err := digest.Parse(dg)
	if err != nil {
		return nil, fmt.Errorf("image digest %q: %w: %w", dg, errdefs.ErrInvalidArgument, err)
	}
	cs := r.client.ContentStore()
	info, err := cs.Info(ctx, d)
	if err != nil {
		return nil, fmt.Errorf("image %s content %s: %w", name, d, convertErr(err))
	}
	if info.Size > maxManifestBytes {
		return nil, fmt.Errorf("image %s: manifest %s of %d bytes: %w", name, d, info.Size, errdefs.ErrFailedPrecondition)
	}
	desc := ocispec.Descriptor{Digest: d, Size: info.Size}
	b, err := content.ReadBlob(ctx, cs, desc)
	if err != nil {
		return nil, fmt.Errorf("image %s manifest %s: %w", name, d, convertErr(err))
	}
	var m struct {
		MediaType string          `json:"mediaType"`
		Manifests json.RawMessage `json:"manifests"`
		Config    json.RawMessage `json:"config"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("image %s manifest %s: %w: %w", name, d, errdefs.ErrFailedPrecondition, err)
	}
	switch {
	case m.MediaType != "":
		desc.MediaType = m.MediaType
	case m.Manifests != nil:
		desc.MediaType = ocispec.MediaTypeImageIndex
	case m.Config != nil:
		desc.MediaType = ocispec.MediaTypeImageManifest
	}
	if !images.IsManifestType(desc.MediaType) && !images.IsIndexType(desc.MediaType) {
		return nil, fmt.Errorf("image %s: content %s is no manifest (%q): %w", name, d, desc.MediaType, errdefs.ErrFailedPrecondition)
	}
	return client.NewImage(r.client, images.Image{Name: name, Target: desc}), nil
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
	var lazy *lazyRestore
	if spec.LazyRestore && from.Tier == runtime.TierMemory {
		var err error
		if lazy, err = r.startLazy(ctx, spec.ID, from.Dir, work); err != nil {
			r.cleanup(ctx, spec.ID, sb.container, sb.task, true)
			return runtime.Instance{}, err
		}
	}
	inst, err := r.start(ctx, sb, spec.Network.Policy)
	if err != nil && from.Tier == runtime.TierMemory {
		err = fmt.Errorf("%w%s", err, criuLogErrors(filepath.Join(work, "restore.log"), "criu restore.log"))
	}
	switch {
	case lazy == nil:
	case err != nil:
		lazy.abort() // runc removed what the failed restore made
	default:
		lazy.restored(ctx)
	}
	os.RemoveAll(work)
	os.RemoveAll(forkImagesDir(from.Dir, spec.ID))  // restored: CRIU read them
	if derr := r.releaseDev(spec.ID); derr != nil { // restored: the replica's bind holds it
		r.log.WarnContext(ctx, "restore: release the replica's /dev on the host", "sandbox", spec.ID, "err", derr)
	}
	if err == nil && from.Tier == runtime.TierMemory {
		// Connections to the outside were restored with the rest (CRIU
		// tcp-established, so those within the sandbox survive): their
		// peers know only the source. Closed at once, while the replica's
		// link is still held down, before anyone is told it exists.
		n, cerr := r.net.FinishRestore(spec.ID, !spec.Network.Hold)
		if cerr != nil {
			r.cleanup(ctx, spec.ID, sb.container, sb.task, true)
			r.endLazy(spec.ID)
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
// restore options; runc restore runs at Start). It runs as named steps over
// one restoreOp (see steps.go); finish undoes what a failed one left.
func (r *Runtime) createRestore(ctx context.Context, spec runtime.BootSpec, from runtime.CheckpointRef) (_ *sandbox, retErr error) {
	op := &restoreOp{r: r, spec: spec, from: from}
	defer func() { op.finish(ctx, retErr != nil) }()
	if err := runSteps(ctx,
		op.loadBase,     // metadata, pinned image, CRIU options (once per checkpoint)
		op.checkBase,    // the checkpoint is the one from names, restorable here
		op.takeRange,    // the fork's user namespace range
		op.linkImages,   // memory tier: its own view of the CRIU images
		op.setupNetwork, // its network namespace, held down
		op.generateSpec, // its whole spec, from this host's policy and the image
		op.prepareDev,   // memory tier, dev layout bind: its own /dev
		op.clearWorkDir, // memory tier: CRIU's work dir, empty
		op.newContainer, // the container, on its own snapshot of the layer
	); err != nil {
		return nil, err
	}
	// The container exists: createTask removes it (and with it everything
	// above) when it fails.
	return r.createTask(ctx, spec, op.c, op.restore)
}

// restoreOp is one createRestore in progress: what its steps share, and
// what finish must undo.
type restoreOp struct {
	r    *Runtime
	spec runtime.BootSpec
	from runtime.CheckpointRef

	// loadBase
	base *restoreBase
	// takeRange
	rng *userns.Range
	// linkImages: from here on a failure removes the fork's images dir
	restore      *restorePaths
	imagesLinked bool
	// setupNetwork
	nsb        network.Sandbox
	networkSet bool
	// generateSpec
	s *specs.Spec
	// prepareDev
	devMade bool
	// newContainer: the container owns all of the above once made
	c client.Container
	// netOnly: the id's container exists (not ours), so only the network
	// Setup made for this id is released, not the id's snapshot or cgroups
	netOnly bool
}

// lazy says the fork restores lazily.
func (op *restoreOp) lazy() bool { return op.spec.LazyRestore && op.from.Tier == runtime.TierMemory }

// finish undoes, when a step failed, what the earlier ones left, in this
// order: the range, the fork's images dir, and the network with what a
// failed container creation left under the id (cleanup). A made container
// owns them all.
func (op *restoreOp) finish(ctx context.Context, failed bool) {
	if !failed || op.c != nil {
		return
	}
	r, id := op.r, op.spec.ID
	r.releaseRange(id, op.rng) // none taken: nil
	if op.devMade {
		r.releaseDev(id)
	}
	if op.imagesLinked {
		os.RemoveAll(forkImagesDir(op.from.Dir, id))
	}
	switch {
	case !op.networkSet:
	case op.netOnly:
		r.net.Release(ctx, id) // ours: Setup succeeded for this id
	default:
		r.cleanup(ctx, id, nil, nil, true)
	}
}

// loadBase reads the checkpoint's restore base.
func (op *restoreOp) loadBase(ctx context.Context) (err error) {
	op.base, err = op.r.restoreBase(ctx, op.from)
	return err
}

// checkBase refuses a checkpoint that is not the one from names (layer,
// tier), lives in another snapshotter, or ran in another network mode.
func (op *restoreOp) checkBase(context.Context) error {
	meta, from, spec := op.base.meta, op.from, op.spec
	if from.Snapshot != "" && from.Snapshot != meta.Snapshot {
		return fmt.Errorf("checkpoint %s holds layer %s, not %s: %w", from.Dir, meta.Snapshot, from.Snapshot, errdefs.ErrFailedPrecondition)
	}
	if tierName(from.Tier) != meta.Tier {
		return fmt.Errorf("checkpoint %s is a %s checkpoint: %w", from.Dir, meta.Tier, errdefs.ErrFailedPrecondition)
	}
	if meta.Snapshotter != op.r.cfg.Snapshotter {
		return fmt.Errorf("checkpoint %s lives in snapshotter %s: %w", from.Dir, meta.Snapshotter, errdefs.ErrFailedPrecondition)
	}
	// A fork keeps its source's in-sandbox network (address, routes,
	// resolver): restored sockets and configuration depend on it.
	if got := checkpointNetworkMode(meta); got != spec.Network.Mode {
		return errdefs.WithReason(errdefs.ErrFailedPrecondition, "NETWORK_MODE_MISMATCH",
			"checkpoint %s was taken in network mode %s; its forks cannot run in mode %s", from.Dir, got, spec.Network.Mode)
	}
	return nil
}

// takeRange reserves the fork's user namespace range.
func (op *restoreOp) takeRange(ctx context.Context) (err error) {
	op.rng, err = op.r.takeRange(ctx, op.spec.ID)
	return err
}

// linkImages makes a memory-tier fork's own view of the images (its
// range's user namespace), before anything else of it.
func (op *restoreOp) linkImages(context.Context) error {
	if op.from.Tier == runtime.TierMemory {
		images, err := linkForkImages(op.from.Dir, op.spec.ID, op.rng, op.base.usernsImages)
		if err != nil {
			return err // linkForkImages removes what it made
		}
		op.restore = &restorePaths{image: images, work: op.r.restoreWorkDir(op.spec.ID)}
	}
	op.imagesLinked = true
	return nil
}

// setupNetwork makes the fork's network namespace, held down until the
// restore finishes.
func (op *restoreOp) setupNetwork(ctx context.Context) (err error) {
	op.nsb, err = op.r.setupNetwork(ctx, op.spec, op.from.Tier == runtime.TierMemory)
	if err == nil {
		op.networkSet = true
	}
	return err
}

// generateSpec builds the whole spec from this host's policy and the
// checkpoint's (pinned) image, with the fork's own cgroup, limits, network
// namespace, user namespace and identity, as for a boot: nothing of the
// checkpoint's spec.json (whose capabilities, seccomp profile, mounts and
// devices are its writer's). Only process state (CRIU images, the user
// namespace's mappings rewritten to the fork's range) and the layer come
// from a checkpoint.
func (op *restoreOp) generateSpec(ctx context.Context) error {
	r, b := op.r, op.base
	s, err := oci.GenerateSpec(ctx, r.client, &containers.Container{ID: op.spec.ID},
		r.sandboxSpecOpts(withImageProcess(b.proc), op.spec, b.criuOpts, op.nsb, op.rng, b.meta.RunLayout)...)
	if err != nil {
		return fmt.Errorf("fork spec: %w: %w", errdefs.ErrInternal, err)
	}
	if op.devBind() {
		if err := withDevBind(r.devDir(op.spec.ID))(ctx, nil, nil, s); err != nil {
			return fmt.Errorf("fork spec: %w", err)
		}
	}
	if op.lazy() {
		// runc's restore hands CRIU this file: its lazy twin.
		if s.Annotations[criuConfigAnnotation], err = r.lazyCRIUConfig(s.Annotations[criuConfigAnnotation]); err != nil {
			return err
		}
	}
	op.s = s
	return nil
}

// devBind says the fork's /dev is its own tmpfs, bound by its restore
// (the checkpoint's dev layout, devlayout.go).
func (op *restoreOp) devBind() bool {
	return op.from.Tier == runtime.TierMemory && op.base.meta.DevLayout == devLayoutBind
}

// prepareDev makes the fork's /dev, owned by its own root.
func (op *restoreOp) prepareDev(context.Context) error {
	if !op.devBind() {
		return nil
	}
	var uid, gid uint32
	if op.rng != nil {
		uid, gid = op.rng.HostUID(0), op.rng.HostGID(0)
	}
	if err := op.r.prepareDev(op.spec.ID, op.base.meta.DevEntries, uid, gid); err != nil {
		return fmt.Errorf("sandbox %s: %w", op.spec.ID, err)
	}
	op.devMade = true
	return nil
}

// clearWorkDir removes a memory-tier fork's CRIU work dir left by an
// earlier sandbox of the id.
func (op *restoreOp) clearWorkDir(context.Context) error {
	if op.from.Tier != runtime.TierMemory {
		return nil
	}
	if err := os.RemoveAll(op.restore.work); err != nil {
		return fmt.Errorf("restore work dir: %w: %w", errdefs.ErrInternal, err)
	}
	return nil
}

// newContainer creates the fork's container on its own snapshot of the
// checkpoint's layer, labelled with what it really runs.
func (op *restoreOp) newContainer(ctx context.Context) error {
	r, id, meta := op.r, op.spec.ID, op.base.meta
	labels := withImageDigest(r.labelsOf(op.spec), op.base.img.Target().Digest.String())
	labels[labelImage] = meta.Image // what the fork really runs
	labels[labelCheckpoint] = op.from.Dir
	labels[labelTier] = meta.Tier
	if op.lazy() {
		labels[labelLazyRestore] = "pending"
	}
	opts := []client.NewContainerOpts{
		withForkSnapshot(r.cfg.Snapshotter, id, meta.Snapshot, snapshotOpts(op.rng)...),
		client.WithRuntime(r.cfg.Runtime, r.runcOptions()),
		client.WithSpec(op.s),
		client.WithContainerLabels(labels),
	}
	if meta.Image != "" {
		opts = append(opts, client.WithImageName(meta.Image))
	}
	// The fork's shim group: from here until its task is created, the
	// group's daemon is kept from exiting (shimgroup.go).
	withShimGroup(op.s, r.forkShims.join(id))
	c, err := r.client.NewContainer(ctx, id, opts...)
	if err != nil {
		r.forkShims.leave(ctx, id)
		op.netOnly = cerrdefs.IsAlreadyExists(err)
		return fmt.Errorf("sandbox %s: create container: %w", id, convertErr(err))
	}
	op.c = c
	return nil
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
