//go:build linux

package containerdrt

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/archive"
	cfs "github.com/containerd/continuity/fs"
	cerrdefs "github.com/containerd/errdefs"
	"github.com/distribution/reference"
	"github.com/klauspost/compress/zstd"
	digest "github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/atomicfile"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// Checkpoint images. An exported checkpoint is an OCI image manifest with
// artifactType ArtifactTypeCheckpoint and the empty config, whose layers
// are, in this order:
//
//   - MediaTypeCheckpointCRIUZstd (memory tier only): the CRIU image
//     directory as a zstd-compressed tar, cut into parts of at most
//     RegistryConfig.PartSize bytes (one blob each, in order: their
//     concatenation is the stream), so that a push cut inside the stream
//     sends only the parts the registry lacks again;
//   - one or more ocispec.MediaTypeImageLayerZstd: the checkpoint's writable
//     layer as standard OCI layer diffs (whiteouts as .wh. entries), bottom
//     first, to be stacked on the base image's layers. A checkpoint of a
//     fork sits on its parent checkpoint's layer, so it carries one diff per
//     layer between the base image and itself;
//   - MediaTypeCheckpointMeta: checkpoint.json, spec.json and the caller's
//     opaque metadata (exportedMeta).
//
// The manifest's annotations name the base image (the standard
// org.opencontainers.image.base.* keys, plus its layer chain id so the
// importer can check it stacks the diffs on the same layers), the tier, the
// CRIU version that dumped the images, the source sandbox and the
// checkpoint's creation time (not the export's: exporting the same
// checkpoint twice yields the same digest).
//
// Blobs are compressed with zstd at its fastest level, the choice recorded
// in their media types: an exported checkpoint travels through registries,
// and its CRIU pages (mostly zero and repeated pages) shrink several times
// at hundreds of MB/s a core, where gzip would make the cores the
// bottleneck. Import also reads the uncompressed media types of images
// exported before (MediaTypeCheckpointCRIU, ocispec.MediaTypeImageLayer).
// The metadata also records where the processes were dumped (hostInfo:
// kernel and CPU), checked by importers before any work (restorable.go).
// The whole image is written
// straight into containerd's content store under a lease, the manifest
// carrying containerd.io/gc.ref.content labels so the image record alone
// keeps every blob once the lease is gone.
const (
	ArtifactTypeCheckpoint      = "application/vnd.forkfleet.checkpoint.v1"
	MediaTypeCheckpointCRIU     = "application/vnd.forkfleet.checkpoint.criu.v1.tar"
	MediaTypeCheckpointCRIUZstd = MediaTypeCheckpointCRIU + "+zstd"
	MediaTypeCheckpointMeta     = "application/vnd.forkfleet.checkpoint.meta.v1+json"

	AnnotationTier        = "vnd.forkfleet.checkpoint.tier"
	AnnotationCRIUVersion = "vnd.forkfleet.checkpoint.criu-version"
	AnnotationSource      = "vnd.forkfleet.checkpoint.source"
	AnnotationBaseChainID = "vnd.forkfleet.checkpoint.base.chain-id"

	exportMetaVersion = 1
	// maxManifestBytes and maxMetaBytes bound what import reads into memory.
	maxManifestBytes = 4 << 20
	maxMetaBytes     = 64 << 20
	// maxLayerChain bounds the checkpoint layers between a checkpoint and its
	// base image (forks of forks of ...); beyond it the chain is corrupt.
	maxLayerChain = 256
	// blobBufferBytes sizes the writes into the content store (one gRPC
	// message each).
	blobBufferBytes = 1 << 20

	gcRefContentPrefix = "containerd.io/gc.ref.content."
)

// exportedMeta is the MediaTypeCheckpointMeta blob.
type exportedMeta struct {
	Version    int             `json:"version"`
	Checkpoint json.RawMessage `json:"checkpoint"` // checkpoint.json as written by Checkpoint
	Spec       json.RawMessage `json:"spec"`       // spec.json: the source's OCI runtime spec
	Metadata   []byte          `json:"metadata,omitempty"`
	// Host is where a memory-tier checkpoint's processes were dumped.
	Host *hostInfo `json:"host,omitempty"`
}

var _ runtime.CheckpointExporter = (*Runtime)(nil)

func validateReference(field, ref string) error {
	if ref == "" {
		return errdefs.InvalidField(field, "required")
	}
	// Canonical names only (what containerd stores and a push resolves):
	// "ck:1" would silently mean docker.io/library/ck:1 elsewhere.
	if _, err := reference.ParseNamed(ref); err != nil {
		return errdefs.InvalidField(field, "%q is not a fully qualified image reference (host/path[:tag]): %v", ref, err)
	}
	return nil
}

// ExportCheckpoint writes the checkpoint held by ref as the OCI image
// reference in the runtime's namespace (see ArtifactTypeCheckpoint),
// replacing what the name pointed to before. Exporting the same checkpoint
// again writes nothing new and yields the same digest. It runs as named
// steps over one exportOp (see steps.go); the blobs are written under a
// lease, which the image record replaces as their holder.
func (r *Runtime) ExportCheckpoint(ctx context.Context, ref runtime.CheckpointRef, metadata []byte, name string) (res runtime.ExportResult, err error) {
	if err := r.validateCheckpointDir("ref.dir", ref.Dir); err != nil {
		return res, err
	}
	if err := validateReference("reference", name); err != nil {
		return res, err
	}
	ctx = r.ctx(ctx)
	op := &exportOp{r: r, ref: ref, name: name, metadata: metadata}
	if err := runSteps(ctx,
		op.readCheckpoint, // checkpoint.json, spec.json, the CRIU images' host
		op.resolveBase,    // the base image and the layers up to the checkpoint's
	); err != nil {
		return res, err
	}
	cleanCtx := context.WithoutCancel(ctx)
	ctx, done, err := r.client.WithLease(ctx)
	if err != nil {
		return res, fmt.Errorf("lease: %w", convertErr(err))
	}
	defer done(cleanCtx)
	if err := runSteps(ctx,
		op.writeLayers,   // the CRIU tar and the layer diffs, side by side
		op.writeMeta,     // the metadata blob and the empty config
		op.writeManifest, // the manifest, its gc references holding the blobs
		op.nameImage,     // the image record, under name
	); err != nil {
		return res, err
	}
	return op.result(), nil
}

// exportOp is one ExportCheckpoint in progress.
type exportOp struct {
	r        *Runtime
	ref      runtime.CheckpointRef
	name     string
	metadata []byte

	// readCheckpoint
	meta             checkpointMeta
	rawMeta, rawSpec []byte
	memory           bool
	criuDir          string
	host             *hostInfo
	// resolveBase
	base    images.Image
	chainID string
	chain   []string
	// writeLayers, writeMeta, writeManifest
	criuDescs []ocispec.Descriptor
	diffs     []ocispec.Descriptor
	metaDesc  ocispec.Descriptor
	layers    []ocispec.Descriptor
	manDesc   ocispec.Descriptor
}

// readCheckpoint reads the checkpoint's files and checks it is the one ref
// names, in this runtime's snapshotter.
func (op *exportOp) readCheckpoint(ctx context.Context) error {
	r, ref := op.r, op.ref
	meta, err := readMeta(ref.Dir)
	if err != nil {
		return err
	}
	if ref.Snapshot != "" && ref.Snapshot != meta.Snapshot {
		return fmt.Errorf("checkpoint %s holds layer %s, not %s: %w", ref.Dir, meta.Snapshot, ref.Snapshot, errdefs.ErrFailedPrecondition)
	}
	if ref.Tier != 0 && tierName(ref.Tier) != meta.Tier {
		return fmt.Errorf("checkpoint %s is a %s checkpoint: %w", ref.Dir, meta.Tier, errdefs.ErrFailedPrecondition)
	}
	if meta.Snapshotter != r.cfg.Snapshotter {
		return fmt.Errorf("checkpoint %s lives in snapshotter %s: %w", ref.Dir, meta.Snapshotter, errdefs.ErrFailedPrecondition)
	}
	op.meta = meta
	if op.rawMeta, err = os.ReadFile(filepath.Join(ref.Dir, metaFile)); err != nil {
		return fmt.Errorf("checkpoint %s: %w: %w", ref.Dir, errdefs.ErrInternal, err)
	}
	if op.rawSpec, err = os.ReadFile(filepath.Join(ref.Dir, specFile)); err != nil {
		return fmt.Errorf("checkpoint %s: spec: %w: %w", ref.Dir, errdefs.ErrInternal, err)
	}
	op.memory = meta.Tier == tierName(runtime.TierMemory)
	op.criuDir = filepath.Join(ref.Dir, criuImageDir)
	if op.memory {
		if fi, err := os.Stat(op.criuDir); err != nil || !fi.IsDir() {
			return fmt.Errorf("checkpoint %s has no CRIU images: %w", ref.Dir, errdefs.ErrFailedPrecondition)
		}
		if op.host, err = checkpointHostInfo(ctx, ref.Dir); err != nil {
			return err
		}
	}
	return nil
}

// resolveBase finds the base image the checkpoint was taken on and the
// checkpoint layers between it and the checkpoint's.
func (op *exportOp) resolveBase(ctx context.Context) error {
	r, meta := op.r, op.meta
	// The image the checkpoint pins, also when its name moved since.
	var base images.Image
	var chainID string
	img, err := r.pinnedImage(ctx, meta)
	if err == nil {
		base, chainID, err = imageChain(ctx, img)
	}
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return errdefs.WithReason(errdefs.ErrFailedPrecondition, "BASE_IMAGE_MISSING",
				"base image %q of checkpoint %s is gone from namespace %s: %v", meta.Image, op.ref.Dir, r.cfg.Namespace, err)
		}
		return err
	}
	chain, err := r.layerChain(ctx, meta.Snapshot, chainID)
	if err != nil {
		return fmt.Errorf("checkpoint %s: %w", op.ref.Dir, err)
	}
	op.base, op.chainID, op.chain = base, chainID, chain
	return nil
}

// writeLayers writes the CRIU tar and the layer diffs: independent
// streams, produced side by side.
func (op *exportOp) writeLayers(ctx context.Context) error {
	r := op.r
	cs := r.client.ContentStore()
	op.diffs = make([]ocispec.Descriptor, len(op.chain))
	g, gctx := errgroup.WithContext(ctx)
	if op.memory {
		g.Go(func() error {
			ds, err := writeStreamBlobs(gctx, cs, r.client.LeasesService(), MediaTypeCheckpointCRIUZstd, r.cfg.Registry.partSize(), func(w io.Writer) error {
				return zstdCompress(w, func(w io.Writer) error { return writeTreeTar(gctx, w, op.criuDir) })
			})
			if err != nil {
				return fmt.Errorf("export CRIU images: %w", err)
			}
			op.criuDescs = ds
			return nil
		})
	}
	g.Go(func() error {
		for i, layer := range op.chain {
			d, err := r.exportLayer(gctx, cs, layer)
			if err != nil {
				return fmt.Errorf("export layer %s: %w", layer, err)
			}
			op.diffs[i] = d
		}
		return nil
	})
	return g.Wait()
}

// writeMeta writes the metadata blob (checkpoint.json, spec.json, the
// caller's metadata, the dump's host) and the empty config.
func (op *exportOp) writeMeta(ctx context.Context) error {
	cs := op.r.client.ContentStore()
	mb, err := json.Marshal(exportedMeta{Version: exportMetaVersion, Checkpoint: op.rawMeta, Spec: op.rawSpec, Metadata: op.metadata, Host: op.host})
	if err != nil {
		return fmt.Errorf("export metadata: %w: %w", errdefs.ErrInternal, err)
	}
	if op.metaDesc, err = writeBytesBlob(ctx, cs, MediaTypeCheckpointMeta, mb, nil); err != nil {
		return fmt.Errorf("export metadata: %w", err)
	}
	empty := ocispec.DescriptorEmptyJSON
	if _, err := writeBytesBlob(ctx, cs, empty.MediaType, empty.Data, nil); err != nil {
		return fmt.Errorf("export config: %w", err)
	}
	return nil
}

// writeManifest writes the manifest: the layers in their order (see
// ArtifactTypeCheckpoint), the annotations, and gc references that keep its
// blobs once the lease is gone.
func (op *exportOp) writeManifest(ctx context.Context) error {
	meta := op.meta
	if op.memory {
		for i, d := range op.criuDescs {
			title := "criu.tar"
			if len(op.criuDescs) > 1 {
				title = fmt.Sprintf("criu.tar.%03d", i)
			}
			d.Annotations = map[string]string{ocispec.AnnotationTitle: title}
			op.layers = append(op.layers, d)
		}
	}
	for i, d := range op.diffs {
		d.Annotations = map[string]string{ocispec.AnnotationTitle: "rootfs-" + strconv.Itoa(i) + ".tar"}
		op.layers = append(op.layers, d)
	}
	op.metaDesc.Annotations = map[string]string{ocispec.AnnotationTitle: "checkpoint.json"}
	op.layers = append(op.layers, op.metaDesc)

	ann := map[string]string{
		ocispec.AnnotationCreated:         meta.CreatedAt.UTC().Format(time.RFC3339Nano),
		ocispec.AnnotationBaseImageName:   meta.Image,
		ocispec.AnnotationBaseImageDigest: op.base.Target.Digest.String(),
		AnnotationBaseChainID:             op.chainID,
		AnnotationTier:                    meta.Tier,
		AnnotationSource:                  meta.Source,
	}
	if op.memory {
		if v := criuVersion(); v != "" {
			ann[AnnotationCRIUVersion] = v
		}
	}
	empty := ocispec.DescriptorEmptyJSON
	manifest := ocispec.Manifest{
		Versioned:    specs.Versioned{SchemaVersion: 2},
		MediaType:    ocispec.MediaTypeImageManifest,
		ArtifactType: ArtifactTypeCheckpoint,
		Config:       empty,
		Layers:       op.layers,
		Annotations:  ann,
	}
	manb, err := json.Marshal(manifest)
	if err != nil {
		return fmt.Errorf("export manifest: %w: %w", errdefs.ErrInternal, err)
	}
	gcLabels := map[string]string{gcRefContentPrefix + "config": empty.Digest.String()}
	for i, l := range op.layers {
		gcLabels[gcRefContentPrefix+"l."+strconv.Itoa(i)] = l.Digest.String()
	}
	if op.manDesc, err = writeBytesBlob(ctx, op.r.client.ContentStore(), ocispec.MediaTypeImageManifest, manb, gcLabels); err != nil {
		return fmt.Errorf("export manifest: %w", err)
	}
	return nil
}

// nameImage points the image name at the manifest.
func (op *exportOp) nameImage(ctx context.Context) error {
	is := op.r.client.ImageService()
	img := images.Image{Name: op.name, Target: op.manDesc}
	if _, err := is.Create(ctx, img); err != nil {
		if !cerrdefs.IsAlreadyExists(err) {
			return fmt.Errorf("image %s: %w", op.name, convertErr(err))
		}
		// The name now denotes this image: its old labels (an expiry
		// among them) go with the old target.
		if _, err := is.Update(ctx, img, "target", "labels"); err != nil {
			return fmt.Errorf("image %s: %w", op.name, convertErr(err))
		}
	}
	return nil
}

func (op *exportOp) result() runtime.ExportResult {
	size := op.manDesc.Size + ocispec.DescriptorEmptyJSON.Size
	for _, l := range op.layers {
		size += l.Size
	}
	return runtime.ExportResult{Reference: op.name, Digest: op.manDesc.Digest.String(), SizeBytes: size}
}

// ImportCheckpoint materialises the checkpoint image reference (written by
// ExportCheckpoint, here or on another host and moved through a registry)
// as a checkpoint directory dir plus a committed snapshot stacked on the
// base image's layers. The base image must be present in the namespace
// under the name the checkpoint was taken from. It runs as named steps
// over one importOp (see steps.go); finish undoes what a failed one left.
func (r *Runtime) ImportCheckpoint(ctx context.Context, name, dir string) (ref runtime.CheckpointRef, metadata []byte, retErr error) {
	if err := validateReference("reference", name); err != nil {
		return ref, nil, err
	}
	if err := r.validateCheckpointDir("dir", dir); err != nil {
		return ref, nil, err
	}
	ctx = r.ctx(ctx)
	op := &importOp{r: r, name: name, dir: dir}
	cleanCtx := context.WithoutCancel(ctx)
	defer func() { op.finish(cleanCtx, retErr != nil) }()
	if err := runSteps(ctx,
		op.readImage,  // the manifest and metadata, restorable here
		op.checkBase,  // the base image, pinned by digest and layers
		op.loadPolicy, // what this host lets restored processes hold
		op.makeDir,    // dir, which must not exist
	); err != nil {
		return ref, nil, err
	}
	lctx, done, err := r.client.WithLease(ctx)
	if err != nil {
		return ref, nil, fmt.Errorf("lease: %w", convertErr(err))
	}
	op.doneLease = done
	if err := runSteps(lctx,
		op.prepareLayer, // an empty layer on the base image's
		op.unpack,       // the diffs into it, the CRIU images into dir
		op.checkImages,  // the CRIU images against the policy
		op.writeMeta,    // checkpoint.json, spec.json, the dump's host
		op.commitLayer,  // the layer, committed under its name
	); err != nil {
		return ref, nil, err
	}
	return runtime.CheckpointRef{Dir: dir, Snapshot: op.committed, Image: op.meta.Image, Tier: op.ck.tier, ImageDigest: op.meta.ImageDigest}, op.ck.exported.Metadata, nil
}

// importOp is one ImportCheckpoint in progress.
type importOp struct {
	r    *Runtime
	name string
	dir  string

	// readImage
	ck   *checkpointImage
	meta checkpointMeta
	// checkBase
	baseName, baseDigest, chainID string
	// loadPolicy
	pol processPolicy
	// makeDir
	dirMade bool
	// the lease, held from prepareLayer to the end
	doneLease func(context.Context) error
	// prepareLayer
	prepKey, committed string
	mounts             []mount.Mount
	committedOK        bool
}

// finish undoes what the steps left: the uncommitted layer, the lease, on
// failure the directory.
func (op *importOp) finish(cleanCtx context.Context, failed bool) {
	if op.prepKey != "" && !op.committedOK {
		op.r.sn.Remove(cleanCtx, op.prepKey)
	}
	if op.doneLease != nil {
		op.doneLease(cleanCtx)
	}
	if op.dirMade && failed {
		os.RemoveAll(op.dir)
	}
}

// readImage reads and checks the checkpoint image, and whether its
// processes can be restored on this host.
func (op *importOp) readImage(ctx context.Context) error {
	r := op.r
	img, err := r.client.ImageService().Get(ctx, op.name)
	if err != nil {
		return fmt.Errorf("image %s: %w", op.name, convertErr(err))
	}
	ck, err := readCheckpointImage(ctx, r.client.ContentStore(), op.name, img.Target)
	if err != nil {
		return err
	}
	op.ck, op.meta = ck, ck.ckMeta
	return checkRestorable(ctx, op.name, ck)
}

// checkBase finds the base image, which must be the one the checkpoint was
// taken on: same digest, same layers.
func (op *importOp) checkBase(ctx context.Context) error {
	r, name, ann := op.r, op.name, op.ck.manifest.Annotations
	op.baseName = ann[ocispec.AnnotationBaseImageName]
	op.baseDigest = ann[ocispec.AnnotationBaseImageDigest]
	wantChain := ann[AnnotationBaseChainID]
	base, chainID, err := r.baseImage(ctx, op.baseName)
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return errdefs.WithReason(errdefs.ErrFailedPrecondition, "BASE_IMAGE_MISSING",
				"checkpoint image %s needs base image %s (%s) in namespace %s; import or pull it first",
				name, op.baseName, op.baseDigest, r.cfg.Namespace)
		}
		return err
	}
	if chainID != wantChain || base.Target.Digest.String() != op.baseDigest {
		// Pinned by digest: the same layers under another config
		// (entrypoint, environment, CRIU options) are another image.
		return errdefs.WithReason(errdefs.ErrFailedPrecondition, "BASE_IMAGE_MISMATCH",
			"checkpoint image %s was taken on base image %s (%s, layers %s); here %s is %s with layers %s",
			name, op.baseName, op.baseDigest, wantChain, op.baseName, base.Target.Digest, chainID)
	}
	op.chainID = chainID
	return nil
}

// loadPolicy: restored processes keep the credentials and seccomp filters
// of the CRIU images, so only what this host's policy gives may come in
// (criupolicy.go), checked once the images are unpacked.
func (op *importOp) loadPolicy(ctx context.Context) error {
	if len(op.ck.criu) == 0 {
		return nil
	}
	var err error
	op.pol, err = op.r.processPolicy(ctx, op.baseName)
	return err
}

// makeDir creates the checkpoint directory (see makeCheckpointDir).
func (op *importOp) makeDir(context.Context) error {
	if err := makeCheckpointDir(op.dir); err != nil {
		return err
	}
	op.dirMade = true
	return nil
}

// prepareLayer prepares the checkpoint's layer on the base image's.
func (op *importOp) prepareLayer(ctx context.Context) error {
	suffix := randomHex(8)
	prepKey := checkpointPreparePrefix + suffix
	mounts, err := op.r.sn.Prepare(ctx, prepKey, op.chainID)
	if err != nil {
		return fmt.Errorf("prepare checkpoint layer: %w", convertErr(err))
	}
	op.prepKey, op.committed, op.mounts = prepKey, checkpointLayerPrefix+suffix, mounts
	return nil
}

// unpack applies the layer diffs through containerd's applier (straight
// into the overlay upperdir) while the CRIU images unpack here.
func (op *importOp) unpack(ctx context.Context) error {
	r, name, ck := op.r, op.name, op.ck
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		ds := r.client.DiffService()
		for _, d := range ck.diffs {
			if _, err := ds.Apply(gctx, d, op.mounts); err != nil {
				return blobErr(name, "layer "+d.Digest.String(), err)
			}
		}
		return nil
	})
	if len(ck.criu) > 0 {
		g.Go(func() error {
			return unpackBlobs(gctx, r.client.ContentStore(), name, ck.criu, filepath.Join(op.dir, criuImageDir))
		})
	}
	return g.Wait()
}

// checkImages checks the unpacked CRIU images against the policy and
// makes them readable to the restores.
func (op *importOp) checkImages(context.Context) error {
	if len(op.ck.criu) == 0 {
		return nil
	}
	imageDir := filepath.Join(op.dir, criuImageDir)
	if err := checkProcessState(imageDir, op.pol); err != nil {
		return fmt.Errorf("import %s: %w", op.name, err)
	}
	if err := shareImages(imageDir); err != nil {
		return fmt.Errorf("import %s: %w: %w", op.name, errdefs.ErrInternal, err)
	}
	return nil
}

// writeMeta writes checkpoint.json as this host holds the checkpoint (its
// layer, snapshotter and base digest), spec.json and the dump's host.
func (op *importOp) writeMeta(context.Context) error {
	name, dir, ck := op.name, op.dir, op.ck
	meta := &op.meta
	meta.Snapshot = op.committed
	meta.Snapshotter = op.r.cfg.Snapshotter
	meta.ImageDigest = op.baseDigest
	if meta.RunLayout == "" || meta.NetworkMode == "" {
		l, err := specLayout(ck.exported.Spec)
		if err != nil {
			return notCheckpointImage(name, "spec.json: %v", err)
		}
		meta.RunLayout, meta.NetworkMode = l.RunLayout, l.NetworkMode
	}
	if err := meta.checkLayout(); err != nil {
		return notCheckpointImage(name, "%v", err)
	}
	mb, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return fmt.Errorf("checkpoint metadata: %w: %w", errdefs.ErrInternal, err)
	}
	if h := ck.exported.Host; h != nil {
		hb, err := json.Marshal(h)
		if err != nil {
			return fmt.Errorf("host info: %w: %w", errdefs.ErrInternal, err)
		}
		if err := atomicfile.Write(filepath.Join(dir, hostInfoFile), hb, 0o600); err != nil {
			return fmt.Errorf("write host info: %w: %w", errdefs.ErrInternal, err)
		}
	}
	if err := atomicfile.Write(filepath.Join(dir, specFile), ck.exported.Spec, 0o600); err != nil {
		return fmt.Errorf("write spec: %w: %w", errdefs.ErrInternal, err)
	}
	if err := atomicfile.Write(filepath.Join(dir, metaFile), mb, 0o600); err != nil {
		return fmt.Errorf("write checkpoint metadata: %w: %w", errdefs.ErrInternal, err)
	}
	return nil
}

// commitLayer commits the layer under its checkpoint name, a GC root until
// DeleteCheckpoint.
func (op *importOp) commitLayer(ctx context.Context) error {
	labels := checkpointLayerLabels(time.Now(), op.meta.Source, op.meta.ImageDigest)
	if err := op.r.sn.Commit(ctx, op.committed, op.prepKey, snapshots.WithLabels(labels)); err != nil {
		return fmt.Errorf("commit checkpoint layer: %w", convertErr(err))
	}
	op.committedOK = true
	return nil
}

// checkpointImage is a parsed checkpoint image.
type checkpointImage struct {
	manifest ocispec.Manifest
	criu     []ocispec.Descriptor // memory tier only: the CRIU stream's parts
	diffs    []ocispec.Descriptor
	exported exportedMeta
	ckMeta   checkpointMeta
	tier     runtime.CheckpointTier
}

func notCheckpointImage(name, format string, args ...any) error {
	return errdefs.WithReason(errdefs.ErrFailedPrecondition, "NOT_A_CHECKPOINT_IMAGE",
		"%s is not a forkfleet checkpoint image: %s", name, fmt.Sprintf(format, args...))
}

// readCheckpointImage reads and checks the manifest and metadata blob of a
// checkpoint image.
func readCheckpointImage(ctx context.Context, cs content.Provider, name string, target ocispec.Descriptor) (*checkpointImage, error) {
	if target.MediaType != ocispec.MediaTypeImageManifest {
		return nil, notCheckpointImage(name, "media type %s", target.MediaType)
	}
	if target.Size > maxManifestBytes {
		return nil, notCheckpointImage(name, "manifest of %d bytes", target.Size)
	}
	b, err := content.ReadBlob(ctx, cs, target)
	if err != nil {
		return nil, blobErr(name, "manifest", err)
	}
	ck, err := parseCheckpointManifest(name, b)
	if err != nil {
		return nil, err
	}
	md := ck.manifest.Layers[len(ck.manifest.Layers)-1]
	if md.Size > maxMetaBytes {
		return nil, notCheckpointImage(name, "metadata of %d bytes", md.Size)
	}
	mb, err := content.ReadBlob(ctx, cs, md)
	if err != nil {
		return nil, blobErr(name, "metadata", err)
	}
	if err := ck.parseMeta(name, mb); err != nil {
		return nil, err
	}
	return ck, nil
}

// parseCheckpointManifest checks a manifest's shape: artifact type, layer
// media types and order, annotations.
func parseCheckpointManifest(name string, b []byte) (*checkpointImage, error) {
	ck := &checkpointImage{}
	if err := json.Unmarshal(b, &ck.manifest); err != nil {
		return nil, notCheckpointImage(name, "manifest: %v", err)
	}
	m := &ck.manifest
	if m.ArtifactType != ArtifactTypeCheckpoint {
		return nil, notCheckpointImage(name, "artifact type %q, want %q", m.ArtifactType, ArtifactTypeCheckpoint)
	}
	switch m.Annotations[AnnotationTier] {
	case tierName(runtime.TierMemory):
		ck.tier = runtime.TierMemory
	case tierName(runtime.TierDisk):
		ck.tier = runtime.TierDisk
	default:
		return nil, notCheckpointImage(name, "tier %q", m.Annotations[AnnotationTier])
	}
	for _, k := range []string{ocispec.AnnotationBaseImageName, ocispec.AnnotationBaseImageDigest, AnnotationBaseChainID} {
		if m.Annotations[k] == "" {
			return nil, notCheckpointImage(name, "annotation %s missing", k)
		}
	}
	ls := m.Layers
	if len(ls) == 0 || ls[len(ls)-1].MediaType != MediaTypeCheckpointMeta {
		return nil, notCheckpointImage(name, "last layer is not %s", MediaTypeCheckpointMeta)
	}
	ls = ls[:len(ls)-1]
	if ck.tier == runtime.TierMemory {
		if len(ls) == 0 || (ls[0].MediaType != MediaTypeCheckpointCRIUZstd && ls[0].MediaType != MediaTypeCheckpointCRIU) {
			return nil, notCheckpointImage(name, "memory tier without %s layer", MediaTypeCheckpointCRIUZstd)
		}
		// The CRIU stream's parts: every leading layer of its media type.
		n := 1
		for n < len(ls) && ls[n].MediaType == ls[0].MediaType {
			n++
		}
		ck.criu, ls = ls[:n], ls[n:]
	}
	if len(ls) == 0 {
		return nil, notCheckpointImage(name, "no writable layer")
	}
	for _, l := range ls {
		if l.MediaType != ocispec.MediaTypeImageLayerZstd && l.MediaType != ocispec.MediaTypeImageLayer {
			return nil, notCheckpointImage(name, "layer %s has media type %s, want %s", l.Digest, l.MediaType, ocispec.MediaTypeImageLayerZstd)
		}
	}
	ck.diffs = ls
	return ck, nil
}

func (ck *checkpointImage) parseMeta(name string, b []byte) error {
	if err := json.Unmarshal(b, &ck.exported); err != nil {
		return notCheckpointImage(name, "metadata: %v", err)
	}
	if ck.exported.Version != exportMetaVersion {
		return errdefs.WithReason(errdefs.ErrFailedPrecondition, "CHECKPOINT_IMAGE_VERSION",
			"%s: checkpoint image metadata version %d, this runtime reads %d", name, ck.exported.Version, exportMetaVersion)
	}
	if err := json.Unmarshal(ck.exported.Checkpoint, &ck.ckMeta); err != nil {
		return notCheckpointImage(name, "checkpoint.json: %v", err)
	}
	if ck.ckMeta.Version != metaVersion {
		return errdefs.WithReason(errdefs.ErrFailedPrecondition, "CHECKPOINT_IMAGE_VERSION",
			"%s: checkpoint.json version %d, this runtime reads %d", name, ck.ckMeta.Version, metaVersion)
	}
	var spec map[string]json.RawMessage
	if err := json.Unmarshal(ck.exported.Spec, &spec); err != nil || spec == nil {
		return notCheckpointImage(name, "no valid spec.json")
	}
	if ck.ckMeta.Tier != tierName(ck.tier) {
		return notCheckpointImage(name, "checkpoint.json says tier %q, the manifest %q", ck.ckMeta.Tier, tierName(ck.tier))
	}
	if ck.ckMeta.Image != ck.manifest.Annotations[ocispec.AnnotationBaseImageName] {
		return notCheckpointImage(name, "checkpoint.json names image %q, the manifest %q",
			ck.ckMeta.Image, ck.manifest.Annotations[ocispec.AnnotationBaseImageName])
	}
	return nil
}

// baseImage returns an image unpacked into the snapshotter and the chain id
// of its top layer (the name of its top committed snapshot).
func (r *Runtime) baseImage(ctx context.Context, name string) (images.Image, string, error) {
	if name == "" {
		return images.Image{}, "", fmt.Errorf("no base image recorded: %w", errdefs.ErrNotFound)
	}
	img, err := r.image(ctx, name)
	if err != nil {
		return images.Image{}, "", err
	}
	return imageChain(ctx, img)
}

// imageChain returns img's record and the chain id of its layers.
func imageChain(ctx context.Context, img client.Image) (images.Image, string, error) {
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		return images.Image{}, "", fmt.Errorf("image %q: layers: %w", img.Name(), convertErr(err))
	}
	if len(diffIDs) == 0 {
		return images.Image{}, "", fmt.Errorf("image %q has no layers: %w", img.Name(), errdefs.ErrFailedPrecondition)
	}
	return img.Metadata(), identity.ChainID(diffIDs).String(), nil
}

// layerChain returns the committed snapshots from just above base up to top,
// bottom first.
func (r *Runtime) layerChain(ctx context.Context, top, base string) ([]string, error) {
	var chain []string
	for name := top; name != base; {
		if name == "" {
			return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "BASE_IMAGE_MISMATCH",
				"layer %s does not sit on the base image's layers %s (was the image replaced?)", top, base)
		}
		if len(chain) >= maxLayerChain {
			return nil, fmt.Errorf("layer %s: more than %d layers above the base image: %w", top, maxLayerChain, errdefs.ErrFailedPrecondition)
		}
		info, err := r.sn.Stat(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("layer %s: %w", name, convertErr(err))
		}
		if info.Kind != snapshots.KindCommitted {
			return nil, fmt.Errorf("layer %s is not committed: %w", name, errdefs.ErrFailedPrecondition)
		}
		chain = append(chain, name)
		name = info.Parent
	}
	slices.Reverse(chain)
	return chain, nil
}

// exportLayer writes the OCI layer diff of one committed layer against its
// parent. With overlayfs the layer's own directory is the diff: it is read
// through a view (whose topmost lower directory it is), no lower mount or
// tree comparison needed.
func (r *Runtime) exportLayer(ctx context.Context, cs content.Store, layer string) (ocispec.Descriptor, error) {
	key := "forkfleet-export-view-" + randomHex(8)
	ms, err := r.sn.View(ctx, key, layer)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("view: %w", convertErr(err))
	}
	defer r.sn.Remove(context.WithoutCancel(ctx), key)
	dir, err := topLowerDir(ms)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("%w: %w", errdefs.ErrFailedPrecondition, err)
	}
	return writeStreamBlob(ctx, cs, r.client.LeasesService(), ocispec.MediaTypeImageLayerZstd, func(w io.Writer) error {
		return zstdCompress(w, func(w io.Writer) error { return writeOverlayDiff(ctx, w, dir) })
	})
}

// topLowerDir finds the directory of the layer a read-only view shows on
// top: its only directory (bind) or its first lowerdir (overlay).
func topLowerDir(ms []mount.Mount) (string, error) {
	if len(ms) != 1 {
		return "", fmt.Errorf("view has %d mounts, want 1", len(ms))
	}
	m := ms[0]
	switch m.Type {
	case "bind", "rbind":
		return m.Source, nil
	case "overlay":
		for _, o := range m.Options {
			if v, ok := strings.CutPrefix(o, "lowerdir="); ok {
				top, _, _ := strings.Cut(v, ":")
				if top == "" {
					break
				}
				return top, nil
			}
		}
		return "", fmt.Errorf("overlay view without lowerdir")
	}
	return "", fmt.Errorf("snapshotter mount type %q is not overlay", m.Type)
}

// writeOverlayDiff writes an overlay layer directory as an OCI layer tar:
// whiteouts (0/0 character devices) become .wh.<name> entries and opaque
// directories (overlay.opaque=y) get .wh..wh..opq. Only
// security.capability survives of the xattrs (as in containerd's own
// diffs). Redirected directories and metacopy files have no OCI form: the
// export fails on them rather than write a wrong layer.
func writeOverlayDiff(ctx context.Context, w io.Writer, dir string) error {
	return writeChanges(ctx, w, dir, func(cw *archive.ChangeWriter, path, p string, fi os.FileInfo) error {
		if isWhiteout(fi) {
			return cw.HandleChange(cfs.ChangeKindDelete, p, nil, nil)
		}
		switch {
		case fi.IsDir():
			if _, ok, err := overlayXattr(path, "redirect"); err != nil {
				return err
			} else if ok {
				return fmt.Errorf("%s: redirected overlay directory (redirect_dir) cannot be exported", p)
			}
			if err := cw.HandleChange(cfs.ChangeKindAdd, p, fi, nil); err != nil {
				return err
			}
			v, ok, err := overlayXattr(path, "opaque")
			if err != nil {
				return err
			}
			if ok && v == "y" {
				return cw.HandleChange(cfs.ChangeKindDelete, p+"/.wh..opq", nil, nil)
			}
			return nil
		case fi.Mode().IsRegular():
			if _, ok, err := overlayXattr(path, "metacopy"); err != nil {
				return err
			} else if ok {
				return fmt.Errorf("%s: metacopy overlay file cannot be exported", p)
			}
		}
		return cw.HandleChange(cfs.ChangeKindAdd, p, fi, nil)
	})
}

// writeChanges writes dir's tree as a tar through a change writer: each
// entry (path on disk, p its name in the tar) goes to each, in walk order.
// It resolves paths, which is safe only because no sandbox can change the
// trees it walks: a committed checkpoint layer (read-only lower layer of
// its forks, never a sandbox's upperdir) and CRIU's image directory (the
// host's). A running sandbox's layer is copied by layerCopier, never here.
func writeChanges(ctx context.Context, w io.Writer, dir string, each func(cw *archive.ChangeWriter, path, p string, fi os.FileInfo) error) error {
	cw := archive.NewChangeWriter(w, dir)
	err := filepath.Walk(dir, func(path string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil || rel == "." {
			return err
		}
		return each(cw, path, "/"+filepath.ToSlash(rel), fi)
	})
	if err != nil {
		return err
	}
	return cw.Close()
}

func isWhiteout(fi os.FileInfo) bool {
	if fi.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Rdev == 0
}

// overlayXattr reads overlay's marker xattr name (trusted.overlay.* as
// containerd mounts it, user.overlay.* for userxattr mounts).
func overlayXattr(path, name string) (string, bool, error) {
	for _, prefix := range []string{"trusted.overlay.", "user.overlay."} {
		v, err := getXattr(pathXattrs(path), prefix+name)
		switch {
		case err == nil:
			return string(v), true, nil
		case errors.Is(err, unix.ENODATA), errors.Is(err, unix.ENOTSUP):
		default:
			return "", false, fmt.Errorf("xattr %s%s of %s: %w", prefix, name, path, err)
		}
	}
	return "", false, nil
}

// zstdCompress runs produce through a zstd encoder at its fastest level
// into w.
func zstdCompress(w io.Writer, produce func(io.Writer) error) error {
	zw, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(2))
	if err != nil {
		return fmt.Errorf("zstd: %w: %w", errdefs.ErrInternal, err)
	}
	if err := produce(zw); err != nil {
		zw.Close()
		return err
	}
	return zw.Close()
}

// writeTreeTar writes a directory tree (the CRIU images) as a tar.
func writeTreeTar(ctx context.Context, w io.Writer, dir string) error {
	return writeChanges(ctx, w, dir, func(cw *archive.ChangeWriter, _, p string, fi os.FileInfo) error {
		return cw.HandleChange(cfs.ChangeKindAdd, p, fi, nil)
	})
}

// unpackBlobs extracts the tar whose parts are the blobs descs of image
// name (in order; zstd-compressed when their media type says so) into dir
// (created), refusing entries that escape it.
func unpackBlobs(ctx context.Context, cs content.Provider, name string, descs []ocispec.Descriptor, dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("unpack %s: %w: %w", descs[0].Digest, errdefs.ErrInternal, err)
	}
	parts := make([]io.Reader, len(descs))
	for i, desc := range descs {
		ra, err := cs.ReaderAt(ctx, desc)
		if err != nil {
			return blobErr(name, "layer "+desc.Digest.String(), err)
		}
		defer ra.Close()
		parts[i] = content.NewReader(ra)
	}
	var rd io.Reader = bufio.NewReaderSize(io.MultiReader(parts...), blobBufferBytes)
	if descs[0].MediaType == MediaTypeCheckpointCRIUZstd {
		zr, err := zstd.NewReader(rd, zstd.WithDecoderConcurrency(0))
		if err != nil {
			return fmt.Errorf("unpack %s: %w: %w", descs[0].Digest, errdefs.ErrInternal, err)
		}
		defer zr.Close()
		rd = zr
	}
	if _, err := archive.Apply(ctx, dir, rd); err != nil {
		return fmt.Errorf("unpack %s: %w", descs[0].Digest, convertWriteErr(err))
	}
	return nil
}

// blobErr classifies a failure to read a blob of image name: a blob missing
// from the content store means an image fetched incompletely, not an
// unknown reference.
func blobErr(name, what string, err error) error {
	err = convertErr(err)
	if errors.Is(err, errdefs.ErrNotFound) {
		return errdefs.WithReason(errdefs.ErrFailedPrecondition, "CHECKPOINT_IMAGE_INCOMPLETE",
			"image %s: %s is not in the content store (fetch every blob of the image): %v", name, what, err)
	}
	return fmt.Errorf("image %s: %s: %w", name, what, err)
}

// writeStreamBlob writes what produce writes as one blob of mediaType
// (writeStreamBlobs without parts).
func writeStreamBlob(ctx context.Context, cs content.Store, ls leases.Manager, mediaType string, produce func(io.Writer) error) (ocispec.Descriptor, error) {
	ds, err := writeStreamBlobs(ctx, cs, ls, mediaType, 0, produce)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	return ds[0], nil
}

// writeStreamBlobs writes what produce writes into the content store as
// blobs of mediaType of partSize bytes each (the last one shorter; 0: one
// blob), under the context's lease, and returns them in order.
func writeStreamBlobs(ctx context.Context, cs content.Store, ls leases.Manager, mediaType string, partSize int64, produce func(io.Writer) error) ([]ocispec.Descriptor, error) {
	// A blob that was already there is left out of the writer's lease by
	// containerd (2.4): if its last owner was just deleted (an export of
	// the same checkpoint again, a deleted image of it), a collection can
	// remove it before the manifest that will hold it is written. Lease it
	// by hand; should one be gone by then, the second pass writes them
	// anew, which leases them.
	for pass := 0; ; pass++ {
		pw := &partWriter{ctx: ctx, cs: cs, mediaType: mediaType, partSize: partSize}
		descs, err := pw.run(produce)
		if err != nil {
			return nil, err
		}
		gone := false
		for i, desc := range descs {
			if !pw.existed[i] {
				continue
			}
			lid, ok := leases.FromContext(ctx)
			if !ok {
				return nil, fmt.Errorf("blob %s: %w: written without a lease", desc.Digest, errdefs.ErrInternal)
			}
			if err := ls.AddResource(ctx, leases.Lease{ID: lid}, leases.Resource{ID: desc.Digest.String(), Type: "content"}); err != nil {
				return nil, fmt.Errorf("lease blob %s: %w", desc.Digest, convertErr(err))
			}
			if _, err := cs.Info(ctx, desc.Digest); err != nil {
				if !cerrdefs.IsNotFound(err) || pass > 0 {
					return nil, fmt.Errorf("blob %s: %w", desc.Digest, convertErr(err))
				}
				gone = true
			}
		}
		if !gone {
			return descs, nil
		}
	}
}

// partWriter cuts a stream into blobs of partSize bytes, each committed
// when full (existed: content that was in the store already).
type partWriter struct {
	ctx       context.Context
	cs        content.Store
	mediaType string
	partSize  int64

	w       content.Writer // the part being written; nil between parts
	ref     string
	dg      digest.Digester
	n       int64
	descs   []ocispec.Descriptor
	existed []bool
}

// run writes what produce writes and commits the last part.
func (p *partWriter) run(produce func(io.Writer) error) ([]ocispec.Descriptor, error) {
	defer p.abort()
	bw := bufio.NewWriterSize(p, blobBufferBytes)
	if err := produce(bw); err != nil {
		return nil, convertWriteErr(err)
	}
	if err := bw.Flush(); err != nil {
		return nil, convertWriteErr(err)
	}
	if p.w == nil && len(p.descs) == 0 {
		if err := p.open(); err != nil { // an empty stream is one empty blob
			return nil, err
		}
	}
	if p.w != nil {
		if err := p.commit(); err != nil {
			return nil, err
		}
	}
	return p.descs, nil
}

func (p *partWriter) Write(b []byte) (int, error) {
	written := 0
	for len(b) > 0 {
		if p.w == nil {
			if err := p.open(); err != nil {
				return written, err
			}
		}
		k := len(b)
		if p.partSize > 0 && int64(k) > p.partSize-p.n {
			k = int(p.partSize - p.n)
		}
		if _, err := p.w.Write(b[:k]); err != nil {
			return written, err
		}
		p.dg.Hash().Write(b[:k])
		p.n += int64(k)
		written += k
		b = b[k:]
		if p.partSize > 0 && p.n == p.partSize {
			if err := p.commit(); err != nil {
				return written, err
			}
		}
	}
	return written, nil
}

func (p *partWriter) open() error {
	p.ref = "forkfleet-export-" + randomHex(8)
	w, err := content.OpenWriter(p.ctx, p.cs, content.WithRef(p.ref))
	if err != nil {
		return fmt.Errorf("content writer: %w", convertErr(err))
	}
	p.w, p.dg, p.n = w, digest.Canonical.Digester(), 0
	return nil
}

func (p *partWriter) commit() error {
	desc := ocispec.Descriptor{MediaType: p.mediaType, Digest: p.dg.Digest(), Size: p.n}
	existed := false
	if err := p.w.Commit(p.ctx, desc.Size, desc.Digest); err != nil {
		if !cerrdefs.IsAlreadyExists(err) {
			return fmt.Errorf("commit blob: %w", convertErr(err))
		}
		existed = true
	}
	p.w.Close()
	p.w = nil
	p.descs, p.existed = append(p.descs, desc), append(p.existed, existed)
	return nil
}

// abort drops a part left open by a failure.
func (p *partWriter) abort() {
	if p.w != nil {
		p.w.Close()
		p.cs.Abort(context.WithoutCancel(p.ctx), p.ref)
		p.w = nil
	}
}

// convertWriteErr classifies a produce error: containerd's through
// convertErr, the rest (local files) as internal.
func convertWriteErr(err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	for _, class := range []error{errdefs.ErrFailedPrecondition, errdefs.ErrNotFound, errdefs.ErrInternal, errdefs.ErrUnavailable} {
		if errors.Is(err, class) {
			return err
		}
	}
	if c := convertErr(err); !errors.Is(c, errdefs.ErrInternal) {
		return c
	}
	return fmt.Errorf("%w: %w", errdefs.ErrInternal, err)
}

// writeBytesBlob writes a small blob; labels (gc references) are set on it
// whether it was new or not.
func writeBytesBlob(ctx context.Context, cs content.Store, mediaType string, b []byte, labels map[string]string) (ocispec.Descriptor, error) {
	desc := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(b), Size: int64(len(b))}
	var opts []content.Opt
	if len(labels) > 0 {
		opts = append(opts, content.WithLabels(labels))
	}
	if err := content.WriteBlob(ctx, cs, "forkfleet-export-"+desc.Digest.Encoded(), bytes.NewReader(b), desc, opts...); err != nil {
		return desc, fmt.Errorf("write blob: %w", convertErr(err))
	}
	if len(labels) > 0 {
		info := content.Info{Digest: desc.Digest, Labels: labels}
		paths := make([]string, 0, len(labels))
		for k := range labels {
			paths = append(paths, "labels."+k)
		}
		if _, err := cs.Update(ctx, info, paths...); err != nil {
			return desc, fmt.Errorf("label blob: %w", convertErr(err))
		}
	}
	return desc, nil
}

// criuVersion is the version of the criu binary runc runs ("" when unknown),
// recorded for whoever restores the images elsewhere.
var criuVersion = sync.OnceValue(func() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "criu", "--version").Output()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Version:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
})
