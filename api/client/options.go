package client

import (
	"maps"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// Options are typed per operation (CreateOption, CheckpointOption,
// ForkOption, ...). Options that make sense for several operations, such as
// WithLabels or WithTTL, implement each of those types.

// CreateOption configures CreateSandbox.
type CreateOption interface {
	applyCreate(*controldv1.CreateSandboxRequest)
}

// CheckpointOption configures Sandbox.Checkpoint.
type CheckpointOption interface {
	applyCheckpoint(*controldv1.CreateCheckpointRequest)
}

// ForkOption configures Checkpoint.Fork.
type ForkOption interface {
	applyFork(*controldv1.ForkCheckpointRequest)
}

// PoolOption configures CreatePool.
type PoolOption interface {
	applyPool(*controldv1.CreatePoolRequest)
}

// ClaimOption configures ClaimPool.
type ClaimOption interface {
	applyClaim(*controldv1.ClaimPoolRequest)
}

// ListOption filters ListSandboxes.
type ListOption interface {
	applyList(*controldv1.ListSandboxesRequest)
}

// ListCheckpointsOption filters ListCheckpoints.
type ListCheckpointsOption interface {
	applyListCheckpoints(*controldv1.ListCheckpointsRequest)
}

// ListPoolsOption configures ListPools.
type ListPoolsOption interface {
	applyListPools(*controldv1.ListPoolsRequest)
}

// WatchOption filters Watch.
type WatchOption interface {
	applyWatch(*controldv1.WatchSandboxesRequest)
}

// WaitOption configures Sandbox.WaitReady.
type WaitOption interface {
	applyWait(*controldv1.WaitSandboxReadyRequest)
}

// DeleteCheckpointOption configures Checkpoint.Delete.
type DeleteCheckpointOption interface {
	applyDeleteCheckpoint(*controldv1.DeleteCheckpointRequest)
}

// Options shared by several operations.
type (
	// LabelsOption works with every operation that takes labels.
	LabelsOption interface {
		CreateOption
		CheckpointOption
		ForkOption
		PoolOption
		ClaimOption
		ListOption
		ListCheckpointsOption
		WatchOption
	}
	// TTLOption works with CreateSandbox, Fork and ClaimPool.
	TTLOption interface {
		CreateOption
		ForkOption
		ClaimOption
	}
	// SandboxSpecOption (image, screen) works with CreateSandbox and
	// CreatePool.
	SandboxSpecOption interface {
		CreateOption
		PoolOption
	}
	// ResourcesOption works with CreateSandbox, CreatePool and Fork.
	ResourcesOption interface {
		CreateOption
		PoolOption
		ForkOption
	}
)

// ---- labels: create, checkpoint, fork, pool, claim, list filters, watch filters

type labelsOpt map[string]string

// WithLabels sets labels (on create, checkpoint, fork, pool and claim) or
// filters by them (on list and watch: every label must match).
func WithLabels(labels map[string]string) LabelsOption { return labelsOpt(maps.Clone(labels)) }

func mergeLabels(dst *map[string]string, src labelsOpt) {
	if *dst == nil {
		*dst = make(map[string]string, len(src))
	}
	maps.Copy(*dst, src)
}

func (l labelsOpt) applyCreate(r *controldv1.CreateSandboxRequest)        { mergeLabels(&r.Labels, l) }
func (l labelsOpt) applyCheckpoint(r *controldv1.CreateCheckpointRequest) { mergeLabels(&r.Labels, l) }
func (l labelsOpt) applyFork(r *controldv1.ForkCheckpointRequest)         { mergeLabels(&r.Labels, l) }
func (l labelsOpt) applyPool(r *controldv1.CreatePoolRequest)             { mergeLabels(&r.Labels, l) }
func (l labelsOpt) applyClaim(r *controldv1.ClaimPoolRequest)             { mergeLabels(&r.Labels, l) }
func (l labelsOpt) applyList(r *controldv1.ListSandboxesRequest)          { mergeLabels(&r.Labels, l) }
func (l labelsOpt) applyListCheckpoints(r *controldv1.ListCheckpointsRequest) {
	mergeLabels(&r.Labels, l)
}
func (l labelsOpt) applyWatch(r *controldv1.WatchSandboxesRequest) { mergeLabels(&r.Labels, l) }

// ---- ttl: create, fork, claim

type ttlOpt time.Duration

// WithTTL deletes the sandbox (each replica, the claimed sandbox) this long
// after creation.
func WithTTL(d time.Duration) TTLOption { return ttlOpt(d) }

func (t ttlOpt) applyCreate(r *controldv1.CreateSandboxRequest) {
	r.Ttl = durationpb.New(time.Duration(t))
}
func (t ttlOpt) applyFork(r *controldv1.ForkCheckpointRequest) {
	r.Ttl = durationpb.New(time.Duration(t))
}
func (t ttlOpt) applyClaim(r *controldv1.ClaimPoolRequest) { r.Ttl = durationpb.New(time.Duration(t)) }

// ---- image, resources, screen: create and pool

type imageOpt string

// WithImage boots from image (an image in controld's containerd namespace;
// the default desktop when unset).
func WithImage(ref string) SandboxSpecOption { return imageOpt(ref) }

func (i imageOpt) applyCreate(r *controldv1.CreateSandboxRequest) { r.Image = string(i) }
func (i imageOpt) applyPool(r *controldv1.CreatePoolRequest) {
	r.Source = &controldv1.CreatePoolRequest_Image{Image: string(i)}
}

type resourcesOpt struct{ r *controldv1.Resources }

// WithResources sets the sandbox's limits (CreateSandbox, CreatePool, and
// each replica of a Fork). Fields left 0 take the host's defaults (a fork
// or checkpoint pool: the checkpoint's); a value above the host's maximum
// is InvalidArgument naming the field.
func WithResources(r *controldv1.Resources) ResourcesOption { return resourcesOpt{r} }

func (o resourcesOpt) applyCreate(r *controldv1.CreateSandboxRequest) {
	r.Resources = proto.CloneOf(o.r)
}
func (o resourcesOpt) applyPool(r *controldv1.CreatePoolRequest) { r.Resources = proto.CloneOf(o.r) }
func (o resourcesOpt) applyFork(r *controldv1.ForkCheckpointRequest) {
	r.Resources = proto.CloneOf(o.r)
}

type screenOpt struct{ w, h, depth uint32 }

// WithScreen sets the virtual screen (depth 24 when 0).
func WithScreen(width, height, depth int) SandboxSpecOption {
	return screenOpt{uint32(max(width, 0)), uint32(max(height, 0)), uint32(max(depth, 0))}
}

func (o screenOpt) proto() *controldv1.Screen {
	return &controldv1.Screen{Width: o.w, Height: o.h, Depth: o.depth}
}
func (o screenOpt) applyCreate(r *controldv1.CreateSandboxRequest) { r.Screen = o.proto() }
func (o screenOpt) applyPool(r *controldv1.CreatePoolRequest)      { r.Screen = o.proto() }

// ---- create only

type createFunc func(*controldv1.CreateSandboxRequest)

func (f createFunc) applyCreate(r *controldv1.CreateSandboxRequest) { f(r) }

// WithEnv sets environment variables of the sandbox's session.
func WithEnv(env map[string]string) CreateOption {
	env = maps.Clone(env)
	return createFunc(func(r *controldv1.CreateSandboxRequest) {
		if r.Env == nil {
			r.Env = make(map[string]string, len(env))
		}
		maps.Copy(r.Env, env)
	})
}

// WithRunAsRoot makes the sandbox run the agent's processes (exec, launch,
// the window manager and the session apps) as root instead of the image's
// unprivileged user.
func WithRunAsRoot() CreateOption {
	return createFunc(func(r *controldv1.CreateSandboxRequest) { r.RunAsRoot = true })
}

// WithWaitReady makes CreateSandbox return only once the sandbox is usable.
func WithWaitReady() CreateOption {
	return createFunc(func(r *controldv1.CreateSandboxRequest) { r.WaitReady = true })
}

// ---- checkpoint only

type checkpointFunc func(*controldv1.CreateCheckpointRequest)

func (f checkpointFunc) applyCheckpoint(r *controldv1.CreateCheckpointRequest) { f(r) }

// WithTier selects the checkpoint tier (memory by default).
func WithTier(t controldv1.CheckpointTier) CheckpointOption {
	return checkpointFunc(func(r *controldv1.CreateCheckpointRequest) { r.Tier = t })
}

// WithName names the checkpoint (unique among checkpoints).
func WithName(name string) CheckpointOption {
	return checkpointFunc(func(r *controldv1.CreateCheckpointRequest) { r.Name = name })
}

// WithStop stops the source sandbox after the checkpoint.
func WithStop() CheckpointOption {
	return checkpointFunc(func(r *controldv1.CreateCheckpointRequest) { r.Stop = true })
}

// ---- fork only

type forkFunc func(*controldv1.ForkCheckpointRequest)

func (f forkFunc) applyFork(r *controldv1.ForkCheckpointRequest) { f(r) }

// WithVerify verifies every replica at these levels before returning it
// (VERIFY_LEVEL_NONE skips verification; all supported levels by default).
func WithVerify(levels ...controldv1.VerifyLevel) ForkOption {
	return forkFunc(func(r *controldv1.ForkCheckpointRequest) { r.Verify = append(r.Verify, levels...) })
}

// WithRecord records every replica from its first keyframe (each
// recording names the checkpoint and the source's recording). Replicas of
// a recording source are recorded without it. ForkReplica.recording_id
// names each one's recording.
func WithRecord() ForkOption {
	return forkFunc(func(r *controldv1.ForkCheckpointRequest) { r.Record = true })
}

// WithRestoreMode says how memory-tier replicas' pages are restored:
// RESTORE_MODE_LAZY serves each page at its first touch (controld's page
// server; FAILED_PRECONDITION when the host cannot), EAGER reads all before
// the replica runs, AUTO (the default) lets controld choose by the
// checkpoint's size. ForkReplica.restore_mode says what each replica got.
func WithRestoreMode(m controldv1.RestoreMode) ForkOption {
	return forkFunc(func(r *controldv1.ForkCheckpointRequest) { r.RestoreMode = m })
}

// ---- list and watch filters

type statesOpt []controldv1.SandboxState

// WithStates filters sandboxes by state (any of them).
func WithStates(states ...controldv1.SandboxState) ListOption { return statesOpt(states) }

func (s statesOpt) applyList(r *controldv1.ListSandboxesRequest) { r.States = append(r.States, s...) }

type idsOpt []string

// WithIDs restricts a watch to these sandboxes.
func WithIDs(ids ...string) WatchOption { return idsOpt(ids) }

func (i idsOpt) applyWatch(r *controldv1.WatchSandboxesRequest) { r.Ids = append(r.Ids, i...) }

type rootOpt string

// WithRoot lists only the checkpoints descending from id (itself included).
func WithRoot(id string) ListCheckpointsOption { return rootOpt(id) }

func (o rootOpt) applyListCheckpoints(r *controldv1.ListCheckpointsRequest) { r.RootId = string(o) }

// ---- request ids: create, checkpoint, fork, claim

// RequestIDOption works with the four creating calls.
type RequestIDOption interface {
	CreateOption
	CheckpointOption
	ForkOption
	ClaimOption
}

type requestIDOpt string

// WithRequestID sets the call's request id (1..128 characters of
// [A-Za-z0-9._:-]): a repeat with the same id, even from another process or
// after a controld restart, returns the first call's result instead of
// creating again. Without it the client makes a fresh id per call, which
// makes its own retries safe.
func WithRequestID(id string) RequestIDOption { return requestIDOpt(id) }

func (o requestIDOpt) applyCreate(r *controldv1.CreateSandboxRequest)        { r.RequestId = string(o) }
func (o requestIDOpt) applyCheckpoint(r *controldv1.CreateCheckpointRequest) { r.RequestId = string(o) }
func (o requestIDOpt) applyFork(r *controldv1.ForkCheckpointRequest)         { r.RequestId = string(o) }
func (o requestIDOpt) applyClaim(r *controldv1.ClaimPoolRequest)             { r.RequestId = string(o) }

// ---- page size: the List calls

// PageOption works with the List calls.
type PageOption interface {
	ListOption
	ListCheckpointsOption
	ListPoolsOption
}

type pageSizeOpt int32

// WithPageSize sets how many items each List request asks for (1..1000;
// the server's 1000 by default). ListSandboxes and its kin still return
// every item, a page per request; the Page variants return one.
func WithPageSize(n int) PageOption { return pageSizeOpt(min(max(n, 0), 1<<30)) }

func (o pageSizeOpt) applyList(r *controldv1.ListSandboxesRequest) { r.PageSize = int32(o) }
func (o pageSizeOpt) applyListCheckpoints(r *controldv1.ListCheckpointsRequest) {
	r.PageSize = int32(o)
}
func (o pageSizeOpt) applyListPools(r *controldv1.ListPoolsRequest) { r.PageSize = int32(o) }

// ---- wait

type waitTimeout time.Duration

// WithTimeout bounds Sandbox.WaitReady server-side (60 s when unset).
func WithTimeout(d time.Duration) WaitOption { return waitTimeout(d) }

func (w waitTimeout) applyWait(r *controldv1.WaitSandboxReadyRequest) {
	r.Timeout = durationpb.New(time.Duration(w))
}

// ---- export and import

// ExportOption configures Checkpoint.Export.
type ExportOption interface {
	applyExport(*controldv1.ExportCheckpointRequest)
}

// ImportOption configures Client.ImportCheckpoint.
type ImportOption interface {
	applyImport(*controldv1.ImportCheckpointRequest)
}

type pushOpt struct{}

// WithPush also pushes the exported image to the registry its reference
// names.
func WithPush() ExportOption { return pushOpt{} }

func (pushOpt) applyExport(r *controldv1.ExportCheckpointRequest) { r.Push = true }

type pullOpt struct{}

// WithPull pulls the image from the registry its reference names before
// importing it.
func WithPull() ImportOption { return pullOpt{} }

func (pullOpt) applyImport(r *controldv1.ImportCheckpointRequest) { r.Pull = true }

// ---- delete checkpoint

type cascadeOpt struct{}

// WithCascade also deletes descendant checkpoints.
func WithCascade() DeleteCheckpointOption { return cascadeOpt{} }

func (cascadeOpt) applyDeleteCheckpoint(r *controldv1.DeleteCheckpointRequest) { r.Cascade = true }

// ---- pool

type poolFunc func(*controldv1.CreatePoolRequest)

func (f poolFunc) applyPool(r *controldv1.CreatePoolRequest) { f(r) }

// FromCheckpoint fills a pool with frozen replicas forked from checkpoint id.
func FromCheckpoint(id string) PoolOption {
	return poolFunc(func(r *controldv1.CreatePoolRequest) {
		r.Source = &controldv1.CreatePoolRequest_CheckpointId{CheckpointId: id}
	})
}
