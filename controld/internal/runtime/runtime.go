// Package runtime is the contract between controld's fleet and the
// mechanism that runs sandboxes: the Runtime interface, what it boots and
// restores from (BootSpec, CheckpointRef), and its optional capabilities as
// interfaces the fleet finds with As. containerdrt implements it; fleet and
// store use it; neither this package nor containerdrt imports fleet.
package runtime

import (
	"context"
	"net"
	"time"

	"github.com/forkfleet/forkfleet/api/guestsock"
	"github.com/forkfleet/forkfleet/controld/internal/network"
)

// Runtime runs sandboxes. The real one is containerdrt.Runtime (containerd +
// runc + CRIU); tests use fakes. Every method is safe for concurrent use and
// honours ctx. Errors wrap the api/errdefs classes (ErrNotFound for an
// unknown id, ErrAlreadyExists for a taken id, ErrFailedPrecondition for a
// wrong state, ErrUnavailable when containerd is down).
type Runtime interface {
	// Boot creates and starts a sandbox from an image and returns once its
	// task is running. On error nothing is left behind.
	Boot(ctx context.Context, spec BootSpec) (Instance, error)

	// Restore starts a new sandbox from a checkpoint (a fork): its own id,
	// container, snapshot, cgroup and network namespace, with the
	// checkpointed processes restored (memory tier) or booted fresh from the
	// checkpointed writable layer (disk tier). On error nothing is left
	// behind.
	Restore(ctx context.Context, spec BootSpec, from CheckpointRef) (Instance, error)

	// Delete kills the sandbox's processes and removes its task, container,
	// snapshot and cgroup. Deleting an unknown id returns ErrNotFound.
	Delete(ctx context.Context, id string) error

	// List returns every sandbox the runtime knows, for reconciliation after a
	// controld restart.
	List(ctx context.Context) ([]Instance, error)

	// Freeze and Thaw stop and continue every process of a sandbox (cgroup
	// freezer). Both are idempotent.
	Freeze(ctx context.Context, id string) error
	Thaw(ctx context.Context, id string) error

	// Checkpoint captures a running sandbox into spec.Dir (which must not
	// exist; the runtime creates it and removes it on failure). The source
	// keeps running unless spec.Stop is set; it is never left frozen.
	// BeforeFreeze runs while the runtime prepares the checkpoint, and the
	// freeze waits for it (record the frame hash there); AfterFreeze runs
	// while the processes are frozen.
	Checkpoint(ctx context.Context, id string, spec CheckpointSpec) (CheckpointResult, error)

	// DeleteCheckpoint releases what a checkpoint holds (its committed
	// snapshot, its directory). Unknown refs return ErrNotFound.
	DeleteCheckpoint(ctx context.Context, ref CheckpointRef) error

	// Exits delivers the ids of sandboxes whose task exited on its own (not
	// through Delete), until ctx ends.
	Exits(ctx context.Context) (<-chan Exit, error)
}

// BootSpec describes a sandbox to start.
type BootSpec struct {
	ID    string // the sandbox id; also the container id
	Image string
	// Limits (controldv1.Resources, resolved: the manager fills every one
	// from the host's defaults). The runtime enforces each it is given; 0
	// means none of that kind (a runtime may refuse a spec without a limit
	// it always enforces).
	CPUMillis   int64 // hard CPU quota, thousandths of a core
	CPUWeight   uint32
	MemoryBytes int64 // swap included
	PidsMax     int64
	DiskBytes   int64 // the writable layer
	LogBytes    int64 // stdout and stderr kept on the host
	Width       uint32
	Height      uint32
	Depth       uint32
	Env         map[string]string
	// RunAsRoot: guestd runs the agent's processes as root instead of the
	// image's unprivileged user.
	RunAsRoot bool
	// ACIToken authenticates agents to guestd; AdminToken authenticates
	// controld. Both reach guestd through its environment.
	ACIToken   string
	AdminToken string
	// Labels are stored with the container (containerd labels) so List can
	// return them; keys are the runtime's own business, values opaque.
	Labels map[string]string
	// Network is the sandbox's network mode and policy. A fork's mode is its
	// checkpoint's. The policy is applied when the sandbox starts and is not
	// part of what makes a precreated sandbox match a request.
	Network NetworkSpec
	// StartupCPUWeight, when not 0, is the CPU weight the sandbox starts
	// with instead of CPUWeight (a fork's restore, which runs in the
	// sandbox's cgroup, and its verification): the manager sets CPUWeight
	// with CPUWeighter.SetCPUWeight once the sandbox is usable.
	StartupCPUWeight uint32
	// LazyRestore: a memory-tier fork's pages are served at first touch
	// (LazyRestorer); the manager sets it only when the runtime is one.
	LazyRestore bool `json:",omitempty"`
}

// NetworkSpec is a sandbox's network: its mode, and in mode egress what it
// may reach.
type NetworkSpec struct {
	Mode   network.Mode
	Policy network.Policy
	// Hold keeps the sandbox from reaching anything outside until
	// Networker.ConnectNetwork (pooled sandboxes, connected at their claim).
	Hold bool
}

// Networker is an optional Runtime extension for sandbox networks (the
// manager finds it with a type assertion).
type Networker interface {
	// SetNetworkPolicy replaces a running sandbox's policy.
	SetNetworkPolicy(ctx context.Context, id string, p network.Policy) error
	// ConnectNetwork applies p and lets a sandbox booted or restored with
	// NetworkSpec.Hold reach the outside (idempotent).
	ConnectNetwork(ctx context.Context, id string, p network.Policy) error
	// DialPort connects to a TCP port inside a sandbox, as a process of the
	// sandbox would (its loopback first): the gateway's exposed ports.
	DialPort(ctx context.Context, id string, port uint16) (net.Conn, error)
	// PruneNetworks releases the networks of sandboxes the runtime no longer
	// has (reconciliation after a restart).
	PruneNetworks(ctx context.Context) error
	// EgressUnavailable says why mode egress cannot be set up on this host
	// (nil: it can).
	EgressUnavailable() error
}

// Instance is a running (or stopped) sandbox as the runtime sees it.
type Instance struct {
	ID     string
	PID    uint32 // the sandbox init (guestd), in the host pid namespace
	Status InstanceStatus
	// ACISocket is guestd's ACI unix socket inside the sandbox, as the host
	// reaches it through the init's root (dial it with guestsock only).
	ACISocket guestsock.Addr
	Labels    map[string]string
	// ImageDigest is the manifest digest of the image build it runs (a
	// boot's, or its checkpoint's for a fork; "" when the runtime does not
	// know).
	ImageDigest string
	// Phase times as the runtime saw them.
	CreatedAt     time.Time // container created
	TaskStartedAt time.Time // task started (or restored)
	// LazyPending: a lazy replica whose pages were never all in and whose
	// page server is gone (another controld's): its missing memory would
	// read as zeros.
	LazyPending bool
}

// InstanceStatus is the runtime's view of a sandbox.
type InstanceStatus int

const (
	StatusUnknown InstanceStatus = iota
	StatusCreated
	StatusRunning
	StatusFrozen
	StatusStopped
)

// CheckpointTier mirrors the API's tiers.
type CheckpointTier int

const (
	TierMemory CheckpointTier = iota + 1
	TierDisk
)

// CheckpointSpec says how to capture a sandbox.
type CheckpointSpec struct {
	Dir          string // where the checkpoint's files go; created by the runtime
	Tier         CheckpointTier
	Stop         bool // exit the source afterwards instead of resuming it
	BeforeFreeze func(ctx context.Context) error
	AfterFreeze  func(ctx context.Context) error
}

// CheckpointResult reports what a checkpoint captured.
type CheckpointResult struct {
	Ref         CheckpointRef
	MemoryBytes int64
	LayerBytes  int64
	Frozen      time.Duration
	Dump        time.Duration
	Layer       time.Duration
	Total       time.Duration
	// FSDigest is the filesystem proof (see LayerDigester); nil when the
	// runtime has none for this checkpoint.
	FSDigest []byte
}

// LayerDigester is an optional Runtime extension for the filesystem
// verifier: a digest of a sandbox's files outside volatile paths, over
// everything its writable layers changed against its image. A checkpoint
// records its source's (CheckpointResult.FSDigest); a replica's must equal
// it.
type LayerDigester interface {
	LayerDigest(ctx context.Context, id string) ([]byte, error)
}

// CheckpointRef names what a checkpoint holds in the runtime; controld
// stores it and hands it back to Restore and DeleteCheckpoint.
type CheckpointRef struct {
	Dir      string // process images (memory tier) and metadata
	Snapshot string // committed snapshot key of the writable layer
	Image    string // the image the source booted from
	Tier     CheckpointTier
	// ImageDigest is the manifest digest Image named when the source
	// booted ("" when the runtime does not know it): a fork runs that
	// image even after the name moved (see ImageResolver).
	ImageDigest string `json:",omitempty"`
}

// LazyRestorer is an optional Runtime extension: memory-tier forks whose
// pages are served at their first touch (BootSpec.LazyRestore).
type LazyRestorer interface {
	// LazyBytes is the memory a lazy restore of ref leaves to the page
	// server, or why this host cannot restore ref lazily
	// (FAILED_PRECONDITION, reason LAZY_RESTORE_UNAVAILABLE).
	LazyBytes(ctx context.Context, ref CheckpointRef) (int64, error)
	// LazySafe says a fork in mode AUTO may restore lazily on this host: a
	// lazy restore maps each process's private memory writable before its
	// pages come, which strict overcommit accounting refuses for
	// reservations larger than the host (Chromium's).
	LazySafe() bool
	// CompleteRestore starts copying a verified lazy replica's remaining
	// pages in the background (nothing for another sandbox).
	CompleteRestore(id string)
	// LazyStats is what a lazy replica's page server did so far (false
	// when id is no lazy replica still fetching pages).
	LazyStats(id string) (LazyStats, bool)
}

// LazyStats is a lazy replica's page server's work: the pages left to it,
// the faults it served and the pages they brought in, and the pages it
// copied in the background once the replica was verified.
type LazyStats struct {
	LazyPages, Faults, FaultPages, BackgroundPages int64
	// HotPages came in ahead of faults, from the checkpoint's working set.
	HotPages int64
	// From the page session's start (the restore's): its first fault, the
	// working set all in, CRIU's "restore finished".
	FirstFault, HotDone, RestoreFinished time.Duration
}

// ImageResolver is an optional Runtime extension: what an image reference
// names now. An image pool compares it with its checkpoint's ImageDigest so
// that its misses never fork a desktop of an image the name no longer
// names.
type ImageResolver interface {
	// ImageDigest returns the manifest digest ref names now (ErrNotFound
	// when there is no such image).
	ImageDigest(ctx context.Context, ref string) (string, error)
}

// Exit is a sandbox task that ended.
type Exit struct {
	ID       string
	Status   uint32
	ExitedAt time.Time
}

// LimitProbe is an optional Runtime extension: a runtime that can tell how
// often the kernel enforced a sandbox's limits. The manager finds it with a
// type assertion and polls it to report Sandbox.limits_reached.
type LimitProbe interface {
	// LimitHits returns the kernel's counts for sandbox id since its task
	// started (ErrNotFound once it is gone).
	LimitHits(ctx context.Context, id string) (LimitHits, error)
}

// LimitHits is what the kernel counted against one sandbox's limits.
type LimitHits struct {
	OOMKills    uint64 // processes killed at the memory limit
	PidsRefused uint64 // forks and clones refused at the pids limit
	// DiskUsed and DiskLimit are the writable layer's bytes in use and its
	// quota (0: no quota).
	DiskUsed, DiskLimit int64
}

// CPUWeighter is an optional Runtime extension: a runtime that honours
// BootSpec.StartupCPUWeight lowers a started sandbox to its own weight.
type CPUWeighter interface {
	// SetCPUWeight sets sandbox id's CPU weight (1..10000, 100 an ordinary
	// process; 0 is 100) while it runs.
	SetCPUWeight(ctx context.Context, id string, weight uint32) error
}

// UsageProbe is an optional Runtime extension: what a sandbox uses now,
// read when Prometheus scrapes controld (per-sandbox metrics).
type UsageProbe interface {
	// Usage returns sandbox id's use (ErrNotFound once it is gone).
	Usage(ctx context.Context, id string) (Usage, error)
}

// Usage is one sandbox's resource use.
type Usage struct {
	CPUSeconds  float64 // CPU time of all its processes since its task started
	MemoryBytes int64   // memory charged to it now, page cache included
}

// DiskFull reports whether the writable layer is at its quota: less than
// 1 MiB left, where writes already fail (the quota counts metadata and
// whole blocks).
func (h LimitHits) DiskFull() bool {
	return h.DiskLimit > 0 && h.DiskLimit-h.DiskUsed < 1<<20
}

// As finds the optional capability T of rt (Networker, LayerDigester,
// Precreator, CheckpointExporter, ...), looking through one wrapper that
// has Unwrap() Runtime (the fleet's instrumented runtime).
func As[T any](rt Runtime) (T, bool) {
	if u, ok := rt.(interface{ Unwrap() Runtime }); ok {
		rt = u.Unwrap()
	}
	c, ok := rt.(T)
	return c, ok
}
