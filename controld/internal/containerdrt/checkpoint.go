//go:build linux

package containerdrt

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	tasks "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/typeurl/v2"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/atomicfile"
	"github.com/forkfleet/forkfleet/controld/internal/network"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// Files in a checkpoint directory.
const (
	metaFile     = "checkpoint.json"
	specFile     = "spec.json"
	criuImageDir = "criu"
	metaVersion  = 1
)

// checkpointMeta is checkpoint.json: what Restore needs besides the CRIU
// images and the committed layer. A restore builds the fork's OCI spec from
// this host's policy and Image (pinned to ImageDigest); spec.json (the
// source's spec) is kept for export and for people, never read back but for
// the layout of checkpoints that predate RunLayout and NetworkMode.
type checkpointMeta struct {
	Version     int    `json:"version"`
	Source      string `json:"source"`
	Image       string `json:"image"`
	ImageDigest string `json:"image_digest,omitempty"`
	RunLayout   string `json:"run_layout,omitempty"`
	NetworkMode string `json:"network_mode,omitempty"`
	// DevLayout: "" (CRIU's tar) or devLayoutBind, with DevEntries the
	// template entries each replica's /dev gets (devlayout.go).
	DevLayout   string    `json:"dev_layout,omitempty"`
	DevEntries  []string  `json:"dev_entries,omitempty"`
	Snapshotter string    `json:"snapshotter"`
	Snapshot    string    `json:"snapshot"`
	Tier        string    `json:"tier"`
	EnvKeys     []string  `json:"env_keys,omitempty"`
	Screen      string    `json:"screen,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	MemoryBytes int64     `json:"memory_bytes"`
	LayerBytes  int64     `json:"layer_bytes"`
}

func (r *Runtime) validateCheckpointDir(field, dir string) error {
	if dir == "" || !filepath.IsAbs(dir) || filepath.Clean(dir) != dir {
		return errdefs.InvalidField(field, "%q is not a clean absolute path", dir)
	}
	if root := r.cfg.CheckpointRoot; root != "" {
		rel, err := filepath.Rel(root, dir)
		if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
			return errdefs.InvalidField(field, "%q is not under the checkpoint root %s", dir, root)
		}
	}
	return nil
}

// Checkpoint captures a running sandbox. The writable layer is copied while
// the sandbox runs, then the sandbox is frozen (raw cgroup freezer), CRIU
// dumps it (memory tier) through runc checkpoint --leave-running, the layer
// changes made since the first copy are copied, and the sandbox is thawed
// (or killed, with spec.Stop). The frozen window holds only the dump and
// the small second copy.
//
// It runs as named steps over one checkpointOp (see steps.go); whatever a
// step leaves (the hook running, the directory, the target layer, the
// freeze) is undone by finish when a later step fails.
func (r *Runtime) Checkpoint(ctx context.Context, id string, spec runtime.CheckpointSpec) (res runtime.CheckpointResult, retErr error) {
	begin := time.Now()
	if err := validateID(id); err != nil {
		return res, err
	}
	if err := r.validateCheckpointDir("dir", spec.Dir); err != nil {
		return res, err
	}
	if spec.Tier != runtime.TierMemory && spec.Tier != runtime.TierDisk {
		return res, errdefs.InvalidField("tier", "unknown tier %d", spec.Tier)
	}
	ctx = r.ctx(ctx)
	op := &checkpointOp{r: r, id: id, spec: spec, thawed: true}
	defer func() { op.finish(context.WithoutCancel(ctx), retErr != nil) }()
	if err := runSteps(ctx,
		op.startHook,     // the caller's BeforeFreeze, beside the next steps
		op.loadSource,    // a sandbox of ours, its task running, its freezer
		op.makeDir,       // spec.Dir, which must not exist
		op.openLayers,    // the source's writable layer and an empty target
		op.startCRIU,     // the dump's CRIU, loading beside the next steps
		op.copyLayer,     // first copy, while the sandbox runs
		op.awaitHook,     // BeforeFreeze's outcome
		op.freezeAndDump, // freeze, AfterFreeze, CRIU dump (memory tier)
		op.copyChanges,   // what changed since the first copy, still frozen
		op.release,       // thaw, or kill with spec.Stop
		op.shareImages,   // the images readable in any sandbox's user namespace
		op.digestLayer,   // the filesystem proof, from the copy
		op.writeMeta,     // spec.json and checkpoint.json
		op.commitLayer,   // the target layer, committed under its name
	); err != nil {
		return op.res, err
	}
	res = op.res
	res.Ref = runtime.CheckpointRef{Dir: spec.Dir, Snapshot: op.committed, Image: op.info.Image, Tier: spec.Tier, ImageDigest: op.meta.ImageDigest}
	res.MemoryBytes = op.meta.MemoryBytes
	res.LayerBytes = op.meta.LayerBytes
	res.Total = time.Since(begin)
	return res, nil
}

// checkpointOp is one Checkpoint in progress: what its steps share, and
// what finish must undo.
type checkpointOp struct {
	r    *Runtime
	id   string
	spec runtime.CheckpointSpec
	res  runtime.CheckpointResult

	// startHook
	cancelHook context.CancelFunc
	hookDone   chan error // nil once its outcome was read
	// loadSource
	c          client.Container
	info       containers.Container
	pid        uint32
	rawFreezer bool // the raw cgroup freezer, not the task's pause
	wasFrozen  bool // frozen by the caller: left frozen
	// makeDir
	dirMade bool
	// openLayers
	parent    string // the source layer's parent, which the target shares
	prepKey   string // the target layer, until committed
	committed string // its name once committed
	copier    *layerCopier
	// startCRIU: the first dump attempt's CRIU (nil once handed over)
	criu *dumpCRIU
	// freezeAndDump, release
	task         client.Task
	frozenAt     time.Time
	frozenBefore time.Duration // frozen windows of failed dump attempts
	devEntries   []string      // the dump left the template's /dev out (devlayout.go)
	thawed       bool
	// writeMeta, commitLayer
	meta        checkpointMeta
	committedOK bool
}

// finish undoes, in reverse order, what the steps left: the freeze (unless
// the caller had frozen the sandbox), the uncommitted target layer, on
// failure the directory, and the hook, which has returned when finish does.
func (op *checkpointOp) finish(cleanCtx context.Context, failed bool) {
	r := op.r
	if !op.thawed && !op.wasFrozen {
		r.thaw(cleanCtx, op.id, op.task, op.rawFreezer)
	}
	if op.criu != nil { // a step before the dump failed
		op.criu.close()
	}
	if op.prepKey != "" && !op.committedOK {
		r.sn.Remove(cleanCtx, op.prepKey)
	}
	if op.dirMade && failed {
		os.RemoveAll(op.spec.Dir)
	}
	if op.cancelHook != nil {
		op.cancelHook()
		if op.hookDone != nil { // returning before the freeze
			<-op.hookDone
		}
	}
}

// startHook runs the caller's hook (proofs, closing sessions, settling the
// screen) while the target layer is prepared and first copied: neither
// needs the other, and the freeze waits for both.
func (op *checkpointOp) startHook(ctx context.Context) error {
	if op.spec.BeforeFreeze == nil {
		return nil
	}
	hookCtx, cancelHook := context.WithCancel(ctx)
	op.cancelHook = cancelHook
	op.hookDone = make(chan error, 1)
	go func() { op.hookDone <- op.spec.BeforeFreeze(hookCtx) }()
	return nil
}

// loadSource finds the sandbox (one of ours, its task running or frozen)
// and how it is frozen.
func (op *checkpointOp) loadSource(ctx context.Context) error {
	r, id := op.r, op.id
	c, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", id, convertErr(err))
	}
	info, err := c.Info(ctx, client.WithoutRefreshedMetadata)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", id, convertErr(err))
	}
	if info.Labels[labelSandbox] != "true" {
		return fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	st, err := r.client.TaskService().Get(ctx, taskGetRequest(id))
	if err != nil {
		err = errgrpc.ToNative(err)
		if cerrdefs.IsNotFound(err) {
			return fmt.Errorf("sandbox %s has no task: %w", id, errdefs.ErrFailedPrecondition)
		}
		return fmt.Errorf("sandbox %s: %w", id, convertErr(err))
	}
	if s := taskStatus(st.GetProcess().GetStatus()); s != runtime.StatusRunning && s != runtime.StatusFrozen {
		return fmt.Errorf("sandbox %s is not running: %w", id, errdefs.ErrFailedPrecondition)
	}
	fst, ferr := r.freezerState(id)
	if ferr != nil && !errors.Is(ferr, errNoFreezer) {
		return fmt.Errorf("sandbox %s: freezer: %w: %w", id, errdefs.ErrInternal, ferr)
	}
	op.c, op.info, op.pid = c, info, st.GetProcess().GetPid()
	op.rawFreezer = ferr == nil
	op.wasFrozen = op.rawFreezer && fst != freezerThawed
	return nil
}

// makeDir creates the checkpoint directory (see makeCheckpointDir).
func (op *checkpointOp) makeDir(context.Context) error {
	if err := makeCheckpointDir(op.spec.Dir); err != nil {
		return err
	}
	op.dirMade = true
	return nil
}

// openLayers takes the target layer (an empty snapshot on the same parent
// as the source's, usually prepared ahead) and sets up the copier from the
// source's writable directory into it.
func (op *checkpointOp) openLayers(ctx context.Context) error {
	r, id, info := op.r, op.id, op.info
	srcInfo, err := r.sn.Stat(ctx, info.SnapshotKey)
	if err != nil {
		return fmt.Errorf("sandbox %s: snapshot: %w", id, convertErr(err))
	}
	layer, err := r.takeLayer(ctx, srcInfo.Parent)
	if err != nil {
		return err
	}
	op.parent, op.prepKey = srcInfo.Parent, layer.key
	op.committed = checkpointLayerPrefix + randomHex(8)
	srcMounts, err := r.sn.Mounts(ctx, info.SnapshotKey)
	if err != nil {
		return fmt.Errorf("sandbox %s: snapshot mounts: %w", id, convertErr(err))
	}
	srcUpper, err := upperDir(srcMounts)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w: %w", id, errdefs.ErrFailedPrecondition, err)
	}
	// A sandbox with a disk budget writes to its own layer instead.
	if own, err := r.layerOf(id, info.Labels); err != nil {
		return err
	} else if own != "" {
		srcUpper = filepath.Join(own, "upper")
	}
	dstUpper, err := upperDir(layer.mounts)
	if err != nil {
		return fmt.Errorf("checkpoint layer: %w: %w", errdefs.ErrInternal, err)
	}
	op.copier = newLayerCopier(srcUpper, dstUpper)
	if op.copier.owner, err = rangeOfContainer(info); err != nil {
		return err
	}
	return nil
}

// startCRIU starts the memory dump's CRIU before the freeze (see
// dumpCRIU). Without one the dump starts its own, or goes through runc:
// the dump decides and reports.
func (op *checkpointOp) startCRIU(context.Context) error {
	if op.spec.Tier != runtime.TierMemory || op.r.dumpViaRunc {
		return nil
	}
	op.criu, _ = op.r.startDumpCRIU(op.id, op.pid)
	return nil
}

// copyLayer copies the writable layer while the sandbox runs.
func (op *checkpointOp) copyLayer(ctx context.Context) error {
	t := time.Now()
	if err := op.copier.First(ctx); err != nil {
		return fmt.Errorf("copy writable layer: %w", layerCopyErr(err))
	}
	op.res.Layer = time.Since(t)
	return nil
}

// awaitHook waits for the BeforeFreeze hook's outcome.
func (op *checkpointOp) awaitHook(context.Context) error {
	if op.hookDone == nil {
		return nil
	}
	err := <-op.hookDone
	op.hookDone = nil
	if err != nil {
		return fmt.Errorf("before freeze: %w", err)
	}
	return nil
}

// freezeAndDump freezes the sandbox, runs AfterFreeze and (memory tier)
// dumps it. From the first freeze on every path thaws (unless the caller
// had frozen the sandbox). CRIU refuses unix connections whose peer is
// outside the sandbox, which linger for a moment after the caller closes
// its sessions (in BeforeFreeze): wait for them to settle first, and if one
// slips in anyway, thaw, let the sandbox close it and dump again (the hooks
// do not run again).
func (op *checkpointOp) freezeAndDump(ctx context.Context) error {
	r, id, spec := op.r, op.id, op.spec
	for attempt := 1; ; attempt++ {
		if err := op.awaitUnixSettled(ctx); err != nil {
			return err
		}
		if err := op.freeze(ctx); err != nil {
			return err
		}
		if attempt == 1 && spec.AfterFreeze != nil {
			if err := spec.AfterFreeze(ctx); err != nil {
				return fmt.Errorf("after freeze: %w", err)
			}
		}
		if spec.Tier != runtime.TierMemory {
			return nil
		}
		t := time.Now()
		imageDir := filepath.Join(spec.Dir, criuImageDir)
		pre := op.criu
		op.criu = nil // one request per CRIU: a retry starts its own
		// Frozen: what it holds stays until the dump has read it.
		dev, derr := standardDev(op.pid)
		if derr != nil && !errors.Is(derr, errDevNotTemplate) {
			r.log.WarnContext(ctx, "checkpoint: cannot read /dev, CRIU tars it", "sandbox", id, "err", derr)
		} else if derr != nil {
			r.log.DebugContext(ctx, "checkpoint: CRIU tars /dev", "sandbox", id, "reason", derr)
		}
		devBind, err := r.dump(ctx, id, op.pid, imageDir, pre, dev)
		op.res.Dump = time.Since(t)
		op.devEntries = nil
		if devBind {
			op.devEntries = dev
		}
		if err == nil {
			return nil
		}
		if attempt >= r.cfg.DumpAttempts || op.wasFrozen || !retryableDump(err) {
			return err
		}
		if err := r.thaw(ctx, id, op.task, op.rawFreezer); err != nil {
			return err
		}
		op.thawed = true
		op.frozenBefore += time.Since(op.frozenAt)
		if err := os.RemoveAll(imageDir); err != nil {
			return fmt.Errorf("checkpoint images: %w: %w", errdefs.ErrInternal, err)
		}
	}
}

// awaitUnixSettled waits, before a memory dump of a running sandbox, for
// the unix connections from outside to close.
func (op *checkpointOp) awaitUnixSettled(ctx context.Context) error {
	r, id := op.r, op.id
	if op.spec.Tier != runtime.TierMemory || op.wasFrozen {
		return nil
	}
	n, err := waitUnixSettled(ctx, op.pid, r.procsFile(id), r.cfg.SettleTimeout)
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("sandbox %s: %w", id, ctx.Err())
	case err != nil:
		// Only an optimisation: the dump decides.
		r.log.WarnContext(ctx, "checkpoint: cannot inspect unix sockets", "sandbox", id, "err", err)
	case n > 0:
		return fmt.Errorf("sandbox %s: %d unix connection(s) from outside the sandbox still open after %v (CRIU cannot dump them; close sessions before checkpointing): %w",
			id, n, r.cfg.SettleTimeout, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// freeze freezes the sandbox: the raw freezer, or the task's pause where
// there is none. finish thaws from here on.
func (op *checkpointOp) freeze(ctx context.Context) error {
	var err error
	op.frozenAt = time.Now()
	op.thawed = false
	if !op.rawFreezer {
		if op.task, err = op.c.Task(ctx, nil); err == nil {
			err = op.task.Pause(ctx)
		}
	} else if !op.wasFrozen {
		err = op.r.setFreezer(ctx, op.id, freezerFrozen)
	}
	if err != nil {
		return fmt.Errorf("sandbox %s: freeze: %w", op.id, convertErr(err))
	}
	return nil
}

// copyChanges copies the layer changes made since the first copy, while
// the sandbox is frozen: the copy is then consistent with the dump.
func (op *checkpointOp) copyChanges(ctx context.Context) error {
	t := time.Now()
	if err := op.copier.Sync(ctx); err != nil {
		return fmt.Errorf("copy writable layer changes: %w", layerCopyErr(err))
	}
	op.res.Layer += time.Since(t)
	return nil
}

// release thaws the sandbox (unless the caller had frozen it), or with
// spec.Stop kills it while frozen, so nothing runs after the dump (the kill
// takes effect at the thaw), and waits for it to exit.
func (op *checkpointOp) release(ctx context.Context) error {
	r, id := op.r, op.id
	var (
		exited <-chan client.ExitStatus
		err    error
	)
	if op.spec.Stop {
		r.setQuiet(id)
		if op.task == nil {
			if op.task, err = op.c.Task(ctx, nil); err != nil {
				return fmt.Errorf("sandbox %s: %w", id, convertErr(err))
			}
		}
		if exited, err = op.task.Wait(ctx); err != nil {
			return fmt.Errorf("sandbox %s: stop: %w", id, convertErr(err))
		}
		// Still frozen: the kills land at the thaw below.
		if !op.rawFreezer || r.killFrozen(id) != nil {
			if err := op.task.Kill(ctx, syscall.SIGKILL, client.WithKillAll); err != nil && !cerrdefs.IsNotFound(err) {
				return fmt.Errorf("sandbox %s: stop: %w", id, convertErr(err))
			}
		}
	}
	if !op.wasFrozen || op.spec.Stop {
		if err := r.thaw(ctx, id, op.task, op.rawFreezer); err != nil {
			return err
		}
	}
	op.thawed = true
	op.res.Frozen = op.frozenBefore + time.Since(op.frozenAt)
	if exited != nil {
		select {
		case <-exited:
		case <-ctx.Done():
			return fmt.Errorf("sandbox %s: stop: %w", id, ctx.Err())
		}
	}
	return nil
}

// shareImages makes a memory-tier dump's images readable by the root of
// any sandbox's user namespace (userns.go), once the sandbox is thawed:
// nothing reads them before the checkpoint is published, and the chmod of
// each of its 60 or so files is no part of the frozen window.
func (op *checkpointOp) shareImages(context.Context) error {
	if op.spec.Tier != runtime.TierMemory {
		return nil
	}
	if err := shareImages(filepath.Join(op.spec.Dir, criuImageDir)); err != nil {
		return fmt.Errorf("sandbox %s: checkpoint images: %w: %w", op.id, errdefs.ErrInternal, err)
	}
	return nil
}

// digestLayer computes the filesystem proof from the consistent copy (the
// source runs on). Without one the checkpoint still stands: its forks
// cannot prove their filesystem, which the caller sees.
func (op *checkpointOp) digestLayer(ctx context.Context) error {
	r := op.r
	if layers, err := r.deltaLayers(ctx, op.prepKey); err != nil {
		r.log.WarnContext(ctx, "checkpoint: no filesystem digest", "sandbox", op.id, "err", err)
	} else if op.res.FSDigest, err = layerDigest(layers); err != nil {
		r.log.WarnContext(ctx, "checkpoint: no filesystem digest", "sandbox", op.id, "err", err)
	}
	return nil
}

// writeMeta writes what Restore needs besides the images and the layer:
// the source's spec (spec.json) and checkpoint.json.
func (op *checkpointOp) writeMeta(ctx context.Context) error {
	r, id, info, spec := op.r, op.id, op.info, op.spec
	if info.Spec == nil {
		return fmt.Errorf("sandbox %s has no spec: %w", id, errdefs.ErrInternal)
	}
	layout, err := specLayout(info.Spec.GetValue())
	if err != nil {
		return fmt.Errorf("sandbox %s: spec: %w: %w", id, errdefs.ErrInternal, err)
	}
	imageDigest := info.Labels[labelImageDigest]
	if imageDigest == "" {
		// Booted before sandboxes recorded it: the name's digest now.
		if img, err := r.client.GetImage(ctx, info.Image); err == nil {
			imageDigest = img.Target().Digest.String()
		}
	}
	op.meta = checkpointMeta{
		Version:     metaVersion,
		Source:      id,
		Image:       info.Image,
		ImageDigest: imageDigest,
		RunLayout:   layout.RunLayout,
		NetworkMode: layout.NetworkMode,
		DevEntries:  op.devEntries,
		Snapshotter: r.cfg.Snapshotter,
		Snapshot:    op.committed,
		Tier:        tierName(spec.Tier),
		Screen:      info.Labels[labelScreen],
		CreatedAt:   time.Now().UTC(),
		LayerBytes:  op.copier.Bytes(),
	}
	if op.devEntries != nil {
		op.meta.DevLayout = devLayoutBind
	}
	if keys := info.Labels[labelEnvKeys]; keys != "" {
		op.meta.EnvKeys = strings.Split(keys, ",")
	}
	if spec.Tier == runtime.TierMemory {
		if op.meta.MemoryBytes, err = dirSize(filepath.Join(spec.Dir, criuImageDir)); err != nil {
			return fmt.Errorf("checkpoint images: %w: %w", errdefs.ErrInternal, err)
		}
		// A sandbox booted here runs under the seccomp filter this host
		// installs (its processes can only add filters after it): what
		// imported checkpoints are checked against. Forks do not teach:
		// their state came from a checkpoint.
		if info.Labels[labelCheckpoint] == "" {
			if err := r.seccomp.learn(filepath.Join(spec.Dir, criuImageDir)); err != nil {
				r.log.WarnContext(ctx, "checkpoint: learn the host's seccomp filter", "sandbox", id, "err", err)
			}
		}
	}
	if err := atomicfile.Write(filepath.Join(spec.Dir, specFile), info.Spec.GetValue(), 0o600); err != nil {
		return fmt.Errorf("write spec: %w: %w", errdefs.ErrInternal, err)
	}
	mb, err := json.MarshalIndent(op.meta, "", "  ")
	if err != nil {
		return fmt.Errorf("checkpoint metadata: %w: %w", errdefs.ErrInternal, err)
	}
	if err := atomicfile.Write(filepath.Join(spec.Dir, metaFile), mb, 0o600); err != nil {
		return fmt.Errorf("write checkpoint metadata: %w: %w", errdefs.ErrInternal, err)
	}
	return nil
}

// commitLayer commits the target layer under its checkpoint name (a GC
// root until DeleteCheckpoint) and has the next one prepared.
func (op *checkpointOp) commitLayer(ctx context.Context) error {
	r := op.r
	// The source's id, not the directory: the caller may move that.
	labels := checkpointLayerLabels(op.meta.CreatedAt, op.id, op.meta.ImageDigest)
	if err := r.sn.Commit(ctx, op.committed, op.prepKey, snapshots.WithLabels(labels)); err != nil {
		return fmt.Errorf("commit checkpoint layer: %w", convertErr(err))
	}
	op.committedOK = true
	r.refillLayer(op.parent)
	return nil
}

// layerCopyErr classifies a layer copy failure: the sandbox's doing (a
// layer nested too deep) or the host's.
func layerCopyErr(err error) error {
	if errors.Is(err, errdefs.ErrFailedPrecondition) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("%w: %w", errdefs.ErrInternal, err)
}

// thaw undoes the checkpoint's freeze.
func (r *Runtime) thaw(ctx context.Context, id string, task client.Task, rawFreezer bool) error {
	if rawFreezer {
		if err := r.setFreezer(ctx, id, freezerThawed); err != nil && !errors.Is(err, errNoFreezer) {
			return fmt.Errorf("sandbox %s: thaw: %w: %w", id, errdefs.ErrInternal, err)
		}
		return nil
	}
	if task == nil {
		return nil
	}
	if err := task.Resume(ctx); err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("sandbox %s: resume: %w", id, convertErr(err))
	}
	return nil
}

// dump dumps the frozen sandbox's processes into imageDir and leaves them
// frozen: directly through CRIU (see dumpDirect; pre is its CRIU when
// started ahead, which dump ends), or through runc checkpoint
// --leave-running when it cannot (errNoDirectDump).
//
// dev lists the entries of the sandbox's /dev when it is the template's
// (standardDev; nil: it is not): the dump leaves it out as an external
// mount, which devBind says.
func (r *Runtime) dump(ctx context.Context, id string, pid uint32, imageDir string, pre *dumpCRIU, dev []string) (devBind bool, _ error) {
	work := r.workDir(id + "-dump-" + randomHex(4))
	defer os.RemoveAll(work)
	err := errNoDirectDump
	if !r.dumpViaRunc {
		devBind = dev != nil
		err = r.dumpDirect(ctx, id, pid, imageDir, work, pre, devBind)
	} else if pre != nil {
		pre.close()
	}
	if errors.Is(err, errNoDirectDump) {
		r.runcDumpOnce.Do(func() {
			r.log.WarnContext(ctx, "checkpoint: dumping through runc (slower)", "sandbox", id, "reason", err)
		})
		// runc leaves out every bind: a replica's /dev too.
		devBind = false
		if st, serr := r.readRuncState(id); serr == nil && specDevBind(st) {
			if dev == nil {
				return false, errdefs.WithReason(errdefs.ErrFailedPrecondition, "CHECKPOINT_UNDUMPABLE",
					"sandbox %s: its /dev is no longer runc's, which only a direct dump can checkpoint", id)
			}
			devBind = true
		}
		err = r.dumpRunc(ctx, id, imageDir, work)
	}
	if err == nil {
		return devBind, nil
	}
	logPath := filepath.Join(work, "dump.log")
	logErrs := criuLogErrors(logPath, "criu dump.log")
	logText, _ := os.ReadFile(logPath)
	if pid, ok := uninterruptible(string(logText)); ok {
		return false, &uninterruptibleError{sandbox: id, pid: pid, logErrs: logErrs}
	}
	if what := undumpable(string(logText)); what != "" {
		// The sandbox holds something CRIU refuses: the caller can fix
		// that (close it, shrink it), retrying as is cannot.
		return false, errdefs.WithReason(errdefs.ErrFailedPrecondition, "CHECKPOINT_UNDUMPABLE",
			"sandbox %s: criu dump: the sandbox holds %s, which CRIU cannot checkpoint%s", id, what, logErrs)
	}
	if logErrs != "" {
		// CRIU's own answer quotes its first error line, which is often a
		// harmless one (it cannot raise RLIMIT_NOFILE under runc): the
		// filtered log says what failed.
		return false, fmt.Errorf("sandbox %s: criu dump failed: %w%s", id, errdefs.ErrInternal, logErrs)
	}
	return false, fmt.Errorf("sandbox %s: criu dump: %w", id, convertErr(err))
}

// dumpRunc runs runc checkpoint --leave-running through the task service
// directly: client.Task.Checkpoint would pause and resume the task around
// it through the shim, which does not see the raw freezer and would thaw
// the sandbox before the layer is consistent.
func (r *Runtime) dumpRunc(ctx context.Context, id, imageDir, work string) error {
	opts, err := typeurl.MarshalAnyToProto(&options.CheckpointOptions{
		Exit:      false,
		ImagePath: imageDir,
		WorkPath:  work,
	})
	if err != nil {
		return err
	}
	_, err = r.client.TaskService().Checkpoint(ctx, &tasks.CheckpointTaskRequest{
		ContainerID: id,
		Options:     opts,
	})
	return err
}

// CRIU's log lines that name what it refused.
var (
	criuGhostRe     = regexp.MustCompile(`Can't dump ghost file (\S+) of (\d+) size`)
	criuHandleRe    = regexp.MustCompile(`Handle (0x[0-9a-f]+):(0x[0-9a-f]+) cannot be opened`)
	criuTracedRe    = regexp.MustCompile(`zombie (\d+) \(comm .*\) found while seizing`)
	criuUnseizeRe   = regexp.MustCompile(`Unseizable non-zombie (\d+) found, state (\S)(?:, err -?\d+/(\d+))?`)
	criuNoHandleSig = "Can't dump that handle"
)

// undumpable names what in CRIU's dump log is the sandbox's state rather
// than a fault of the host or of CRIU, as precisely as the log allows ("" when
// nothing is). The names come from the sandbox (paths it chose): they are
// quoted, never used.
func undumpable(log string) string {
	if m := criuGhostRe.FindStringSubmatch(log); m != nil {
		return fmt.Sprintf("the deleted file %q (%s bytes), larger than CRIU's ghost limit (the image label %s raises it)",
			m[1], m[2], LabelCRIUGhostLimit)
	}
	if strings.Contains(log, criuNoHandleSig) {
		what := "a file"
		if m := criuHandleRe.FindAllStringSubmatch(log, -1); m != nil {
			last := m[len(m)-1] // the handle CRIU gave up on
			what = fmt.Sprintf("inode %s of device %s", last[2], last[1])
		}
		return fmt.Sprintf("an inotify watch on %s that CRIU can neither open by handle (overlayfs) nor find in its irmap search (the image label %s names directories to search)",
			what, LabelCRIUIrmapScanPaths)
	}
	if slices.ContainsFunc(unixConnErrors, func(sig string) bool { return strings.Contains(log, sig) }) {
		return "a unix socket connected outside the sandbox"
	}
	if m := criuTracedRe.FindStringSubmatch(log); m != nil {
		// CRIU 4.2 says "zombie" of any process in the frozen cgroup it
		// cannot seize, and retries until its freeze timeout: one that
		// another process traces (a debugger or strace in the sandbox; a
		// process has one tracer), or one stuck exiting.
		return fmt.Sprintf("process %s (host pid), which CRIU could not seize before its freeze timeout: another process traces it (a debugger or strace in the sandbox), or it is stuck exiting", m[1])
	}
	if m := criuUnseizeRe.FindStringSubmatch(log); m != nil && m[2] != "D" {
		if m[3] == strconv.Itoa(int(syscall.ECHILD)) {
			// PTRACE_SEIZE failed, so CRIU's wait found no child: the
			// process already has a tracer (a debugger or strace in the
			// sandbox), and a process has only one.
			return fmt.Sprintf("process %s (host pid, state %s), which CRIU cannot stop: another process traces it (a debugger or strace in the sandbox)", m[1], m[2])
		}
		return fmt.Sprintf("process %s (host pid, state %s), which CRIU cannot stop", m[1], m[2])
	}
	if strings.Contains(log, "Unsupported") || strings.Contains(log, "unsupported") {
		return "an unsupported kind of file or resource"
	}
	return ""
}

// retryableDump tells dump failures that go away once the sandbox runs a
// moment (unix connections in flight, a process in uninterruptible sleep)
// from the others.
func retryableDump(err error) bool {
	var busy *uninterruptibleError
	return errors.As(err, &busy) ||
		slices.ContainsFunc(unixConnErrors, func(sig string) bool { return strings.Contains(err.Error(), sig) })
}

// uninterruptibleError is a dump that failed on a process in uninterruptible
// sleep: UNAVAILABLE, since the same call is likely to work a moment later.
type uninterruptibleError struct{ sandbox, pid, logErrs string }

func (e *uninterruptibleError) Error() string {
	return fmt.Sprintf("sandbox %s: criu dump: process %s (host pid) was in uninterruptible sleep (state D) and could not be stopped; try again: %v%s",
		e.sandbox, e.pid, errdefs.ErrUnavailable, e.logErrs)
}

func (e *uninterruptibleError) Unwrap() error { return errdefs.ErrUnavailable }

// uninterruptible names the process CRIU could not seize because it was in
// uninterruptible sleep (state D: waiting in the kernel, on I/O or memory
// under pressure): a moment's state, not something the sandbox holds.
func uninterruptible(log string) (pid string, ok bool) {
	for _, m := range criuUnseizeRe.FindAllStringSubmatch(log, -1) {
		if m[2] == "D" {
			return m[1], true
		}
	}
	return "", false
}

// unixConnErrors are CRIU's errors about a unix connection to outside the
// sandbox.
var unixConnErrors = []string{
	"closed in-flight socket",
	"unix: Unix socket",
	"External socket is used",
	"Can't dump half of stream unix connection",
}

// upperDir finds the writable directory of a snapshot's mounts.
func upperDir(ms []mount.Mount) (string, error) {
	if len(ms) != 1 {
		return "", fmt.Errorf("snapshot has %d mounts, want 1", len(ms))
	}
	m := ms[0]
	switch m.Type {
	case "overlay":
		for _, o := range m.Options {
			if v, ok := strings.CutPrefix(o, "upperdir="); ok {
				return v, nil
			}
		}
		return "", fmt.Errorf("overlay mount without upperdir (read-only snapshot)")
	case "bind":
		return m.Source, nil // a snapshot without parent is a plain directory
	}
	return "", fmt.Errorf("snapshotter mount type %q is not overlay", m.Type)
}

func readMeta(dir string) (checkpointMeta, error) {
	var meta checkpointMeta
	b, err := os.ReadFile(filepath.Join(dir, metaFile))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return meta, fmt.Errorf("checkpoint %s: %w", dir, errdefs.ErrNotFound)
		}
		return meta, fmt.Errorf("checkpoint %s: %w: %w", dir, errdefs.ErrInternal, err)
	}
	if err := json.Unmarshal(b, &meta); err != nil {
		return meta, fmt.Errorf("checkpoint %s: metadata: %w: %w", dir, errdefs.ErrInternal, err)
	}
	if meta.Version != metaVersion {
		return meta, fmt.Errorf("checkpoint %s: metadata version %d: %w", dir, meta.Version, errdefs.ErrFailedPrecondition)
	}
	if meta.RunLayout == "" || meta.NetworkMode == "" {
		// A checkpoint from before checkpoint.json held its layout: its
		// spec.json's annotations say (nothing else of it is used).
		b, err := os.ReadFile(filepath.Join(dir, specFile))
		if err != nil {
			return meta, fmt.Errorf("checkpoint %s: spec: %w: %w", dir, errdefs.ErrInternal, err)
		}
		l, err := specLayout(b)
		if err != nil {
			return meta, fmt.Errorf("checkpoint %s: spec: %w: %w", dir, errdefs.ErrInternal, err)
		}
		meta.RunLayout, meta.NetworkMode = l.RunLayout, l.NetworkMode
	}
	if err := meta.checkLayout(); err != nil {
		return meta, fmt.Errorf("checkpoint %s: %w", dir, err)
	}
	return meta, nil
}

// checkLayout refuses layouts this host does not have.
func (m checkpointMeta) checkLayout() error {
	if m.RunLayout != runLayoutRootfs && m.RunLayout != runLayoutTmpfs {
		return fmt.Errorf("run layout %q: %w", m.RunLayout, errdefs.ErrFailedPrecondition)
	}
	if m.NetworkMode != network.ModeNone.String() && m.NetworkMode != network.ModeEgress.String() {
		return fmt.Errorf("network mode %q: %w", m.NetworkMode, errdefs.ErrFailedPrecondition)
	}
	return checkDevEntries(m.DevLayout, m.DevEntries)
}

// sandboxLayout is what a checkpoint keeps of its source's spec: where
// /run lives (rootfs, or a tmpfs in sandboxes from before) and the network
// mode. Both select among this host's own layouts.
type sandboxLayout struct {
	RunLayout   string
	NetworkMode string
}

// specLayout reads the layout from an OCI spec's annotations.
func specLayout(specJSON []byte) (sandboxLayout, error) {
	var s struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(specJSON, &s); err != nil {
		return sandboxLayout{}, err
	}
	l := sandboxLayout{RunLayout: runLayoutTmpfs, NetworkMode: network.ModeNone.String()}
	if s.Annotations[runLayoutAnnotation] == runLayoutRootfs {
		l.RunLayout = runLayoutRootfs
	}
	if s.Annotations[networkAnnotation] == network.ModeEgress.String() {
		l.NetworkMode = network.ModeEgress.String()
	}
	return l, nil
}

// DeleteCheckpoint releases a checkpoint: its directory goes, and its
// committed layer loses its GC root. The layer itself is removed now when
// no fork still uses it, otherwise by containerd's GC after the last fork.
func (r *Runtime) DeleteCheckpoint(ctx context.Context, ref runtime.CheckpointRef) error {
	if err := r.validateCheckpointDir("ref.dir", ref.Dir); err != nil {
		return err
	}
	if err := r.waitLazyReplicas(ctx, ref.Dir); err != nil {
		return err
	}
	if err := r.removeHotSet(ref.Dir); err != nil {
		return err
	}
	r.lazy.bytes.Delete(ref.Dir)
	r.restoreBases.Delete(ref.Dir)
	ctx = r.ctx(ctx)
	_, statErr := os.Stat(filepath.Join(ref.Dir, metaFile))
	dirExists := statErr == nil
	if statErr != nil && !errors.Is(statErr, fs.ErrNotExist) {
		return fmt.Errorf("checkpoint %s: %w: %w", ref.Dir, errdefs.ErrInternal, statErr)
	}
	snapExists := false
	if ref.Snapshot != "" {
		info, err := r.sn.Stat(ctx, ref.Snapshot)
		switch {
		case err == nil:
			// A layer without the label is not a checkpoint's, or belongs
			// to an already deleted one that forks still use.
			snapExists = info.Labels[snapshotLabelCheckpoint] != ""
		case !cerrdefs.IsNotFound(err):
			return fmt.Errorf("checkpoint layer %s: %w", ref.Snapshot, convertErr(err))
		}
	}
	if !dirExists && !snapExists {
		return fmt.Errorf("checkpoint %s: %w", ref.Dir, errdefs.ErrNotFound)
	}
	if dirExists && ref.Snapshot != "" {
		// Never release a layer another checkpoint's directory names.
		if meta, err := readMeta(ref.Dir); err == nil && meta.Snapshot != ref.Snapshot {
			return fmt.Errorf("checkpoint %s holds layer %s, not %s: %w", ref.Dir, meta.Snapshot, ref.Snapshot, errdefs.ErrFailedPrecondition)
		}
	}
	if snapExists {
		if _, err := r.sn.Update(ctx, snapshots.Info{Name: ref.Snapshot, Labels: map[string]string{}},
			"labels."+snapshotLabelGCRoot, "labels."+snapshotLabelCheckpoint); err != nil && !cerrdefs.IsNotFound(err) {
			return fmt.Errorf("checkpoint layer %s: %w", ref.Snapshot, convertErr(err))
		}
		if err := r.dropLayerSlot(ctx, ref.Snapshot); err != nil {
			return err
		}
		// Forks are children of the layer; with forks alive removal fails
		// and the (now unrooted) layer goes with the last of them.
		if err := r.sn.Remove(ctx, ref.Snapshot); err != nil && !cerrdefs.IsNotFound(err) &&
			!cerrdefs.IsFailedPrecondition(err) && !cerrdefs.IsConflict(err) {
			return fmt.Errorf("checkpoint layer %s: %w", ref.Snapshot, convertErr(err))
		}
	}
	if dirExists {
		if err := os.RemoveAll(ref.Dir); err != nil {
			return fmt.Errorf("checkpoint %s: %w: %w", ref.Dir, errdefs.ErrInternal, err)
		}
	}
	return nil
}

func dirSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			n += fi.Size()
		}
		return nil
	})
	return n, err
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b)
}
