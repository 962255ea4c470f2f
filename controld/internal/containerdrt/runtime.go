//go:build linux

package containerdrt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/identifiers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	cerrdefs "github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/atomicfile"
	"github.com/forkfleet/forkfleet/controld/internal/network"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/userns"
)

// Defaults for Config fields left empty.
const (
	DefaultNamespace     = "forkfleet"
	DefaultSnapshotter   = "overlayfs"
	DefaultRuntime       = "io.containerd.runc.v2"
	DefaultRuncBinary    = "runc"
	DefaultCgroupParent  = "/forkfleet"
	DefaultCgroupRoot    = "/sys/fs/cgroup"
	DefaultStateDir      = "/var/lib/forkfleet/runtime"
	DefaultRunTmpfsBytes = 16 << 20
	DefaultDevShmBytes   = 64 << 20
	DefaultDevDir        = "/run/forkfleet/dev"
	DefaultHostname      = "sandbox"
)

// DefaultCRIUOptions are the CRIU configuration lines every dump and restore
// uses (runc hands the file to CRIU through the org.criu.config annotation;
// its options override the RPC's): established TCP connections are dumped
// and restored (tcp-established), so connections within the sandbox (a
// client and a server both inside, over loopback) survive into every fork;
// a restore then closes the connections whose peer is outside the sandbox
// (network.Manager.CloseOutside), since that peer cannot follow N copies.
// File locks are carried, and the network is not locked: a sandbox's
// namespace reaches the outside only through its router, and nothing
// inside runs while it is frozen; locking (nftables; iptables-restore is
// absent on the hosts) would only add a table to create and delete, 15 ms
// of every dump's frozen window measured here.
var DefaultCRIUOptions = []string{
	"tcp-established",
	"file-locks",
	"network-lock skip",
}

// Config configures a Runtime. Only Address is required.
type Config struct {
	// Registry says how checkpoints reach OCI registries.
	Registry RegistryConfig
	// Address is containerd's socket, e.g. /run/forkfleet/containerd/containerd.sock.
	Address string
	// Namespace is the containerd namespace (default "forkfleet").
	Namespace string
	// CheckpointRoot, when set, is the only directory checkpoints may be
	// written under; DeleteCheckpoint refuses to remove anything else.
	CheckpointRoot string
	// StateDir holds per-sandbox logs, CRIU work directories and the CRIU
	// config (default /var/lib/forkfleet/runtime).
	StateDir string
	// Snapshotter must be overlayfs-like (the checkpoint copies upperdirs).
	Snapshotter string
	// Runtime is the containerd runtime (shim) name.
	Runtime string
	// RuncBinary and RuncRoot are handed to the shim in every task's options
	// (task options replace runtime options, so they are repeated there).
	RuncBinary string
	RuncRoot   string
	// CgroupParent is the cgroup (v1, cgroupfs driver) under which every
	// sandbox gets <CgroupParent>/<id>; CgroupRoot is where the v1
	// hierarchies are mounted.
	CgroupParent string
	CgroupRoot   string
	// CRIUOptions replaces DefaultCRIUOptions when non-nil.
	CRIUOptions []string
	// RunTmpfsBytes sizes the tmpfs on /run (when /run is not on the
	// rootfs); DevShmBytes the one on /dev, which holds /dev/shm.
	RunTmpfsBytes int64
	DevShmBytes   int64
	// DevDir holds the /dev each replica of a checkpoint with the dev
	// layout "bind" binds at its restore (devlayout.go; default
	// /run/forkfleet/dev). Its parents must be searchable by any host uid:
	// the restore's CRIU reaches it as the replica's root.
	DevDir string
	// Hostname inside every sandbox (the same for forks: CRIU restores the
	// UTS namespace of the source).
	Hostname string
	// DialTimeout bounds the connection to containerd in New.
	DialTimeout time.Duration
	// DumpAttempts bounds the CRIU dumps Checkpoint tries when a dump fails
	// on a unix connection still being closed (default 3).
	DumpAttempts int
	// SettleTimeout bounds the wait, before freezing for a memory-tier
	// checkpoint, for unix connections from outside the sandbox to be
	// closed by the sandbox (default 250 ms).
	SettleTimeout time.Duration
	// LayersDir holds the writable layers of sandboxes with a disk budget
	// (BootSpec.DiskBytes): a btrfs filesystem with quotas enabled, which
	// deploy/host-setup.sh mounts at /var/lib/forkfleet/layers. Empty: a
	// disk budget is refused (FailedPrecondition).
	LayersDir string
	// LogWriter is the logging binary (forkfleet-log) the shim starts for
	// every task with a log budget (BootSpec.LogBytes); see LogWriterPath.
	LogWriter string
	// NetHook is the hook (forkfleet-nethook) runc runs once it has made a
	// sandbox's namespaces, at a boot and at a restore, to finish its
	// network (network.Attach); see NetHookPath. Required.
	NetHook string
	// Network sets up every sandbox's network namespace (see package
	// network); nil: a manager of mode none only, under StateDir/net.
	Network *network.Manager
	// UserNamespaces, when set, runs every sandbox in a user namespace of
	// its own, mapped to a range of host ids reserved for it (userns.go);
	// nil: sandboxes run in the host's user namespace.
	UserNamespaces *userns.Pool
	// Logger receives debug and warning messages (default slog.Default()).
	Logger *slog.Logger
	// PageServer serves the pages of lazy restores (BootSpec.LazyRestore;
	// lazy.go); nil: controld's own (controld/internal/lazypages), which
	// persists checkpoints' hot sets under StateDir/hotsets.
	PageServer PageServer
}

// The helper binaries installed beside controld: the log writer the shim
// runs for every sandbox's stdio, and the hook runc runs for every
// sandbox's network.
const (
	LogWriterName = "forkfleet-log"
	NetHookName   = "forkfleet-nethook"
)

// LogWriterPath finds the log writer for a binary at exe (helperPath).
func LogWriterPath(exe string) (string, error) { return helperPath(exe, LogWriterName) }

// NetHookPath finds the network hook for a binary at exe (helperPath).
func NetHookPath(exe string) (string, error) { return helperPath(exe, NetHookName) }

// helperPath finds helper name for a binary at exe: beside it (as make
// build and deploy/controld-up.sh put it), else on PATH.
func helperPath(exe, name string) (string, error) {
	p := filepath.Join(filepath.Dir(exe), name)
	if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0 {
		return p, nil
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s is neither beside %s nor on PATH (make build; deploy/controld-up.sh installs it beside controld): %w", name, exe, err)
	}
	return filepath.Abs(p)
}

func (c *Config) setDefaults() {
	if c.Namespace == "" {
		c.Namespace = DefaultNamespace
	}
	if c.Snapshotter == "" {
		c.Snapshotter = DefaultSnapshotter
	}
	if c.Runtime == "" {
		c.Runtime = DefaultRuntime
	}
	if c.RuncBinary == "" {
		c.RuncBinary = DefaultRuncBinary
	}
	if c.CgroupParent == "" {
		c.CgroupParent = DefaultCgroupParent
	}
	if c.CgroupRoot == "" {
		c.CgroupRoot = DefaultCgroupRoot
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if c.CRIUOptions == nil {
		c.CRIUOptions = DefaultCRIUOptions
	}
	if c.RunTmpfsBytes == 0 {
		c.RunTmpfsBytes = DefaultRunTmpfsBytes
	}
	if c.DevShmBytes == 0 {
		c.DevShmBytes = DefaultDevShmBytes
	}
	if c.DevDir == "" {
		c.DevDir = DefaultDevDir
	}
	if c.Hostname == "" {
		c.Hostname = DefaultHostname
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = 10 * time.Second
	}
	if c.DumpAttempts <= 0 {
		c.DumpAttempts = 3
	}
	if c.SettleTimeout <= 0 {
		c.SettleTimeout = 250 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// runtimeCRIUOptions are the lines of the runtime's CRIU config file: the
// configured options, the cgroup yard on cgroup v1, and the log level of
// restores (criuRestoreLogLine), which follows controld's as dumps' does.
func runtimeCRIUOptions(cfg Config) []string {
	opts := slices.Clone(cfg.CRIUOptions)
	if yard, ok := cgroupV1Yard(cfg.CgroupRoot); ok && !slices.ContainsFunc(opts, func(o string) bool { return strings.HasPrefix(o, "cgroup-yard") }) {
		opts = append(opts, "cgroup-yard "+yard)
	}
	return append(opts, criuRestoreLogLine(criuLogLevel(context.Background(), cfg.Logger)))
}

func (c *Config) validate() error {
	if c.Address == "" {
		return errdefs.InvalidField("address", "containerd address is required")
	}
	if err := identifiers.Validate(c.Namespace); err != nil {
		return errdefs.InvalidField("namespace", "%v", err)
	}
	for name, p := range map[string]string{"state_dir": c.StateDir, "dev_dir": c.DevDir, "cgroup_root": c.CgroupRoot, "cgroup_parent": c.CgroupParent} {
		if !filepath.IsAbs(p) {
			return errdefs.InvalidField(name, "%q is not an absolute path", p)
		}
	}
	if c.CheckpointRoot != "" && !filepath.IsAbs(c.CheckpointRoot) {
		return errdefs.InvalidField("checkpoint_root", "%q is not an absolute path", c.CheckpointRoot)
	}
	for _, o := range c.CRIUOptions {
		if strings.ContainsAny(o, "\n\r") {
			return errdefs.InvalidField("criu_options", "option %q spans lines", o)
		}
	}
	if c.LayersDir != "" {
		if !filepath.IsAbs(c.LayersDir) {
			return errdefs.InvalidField("layers_dir", "%q is not an absolute path", c.LayersDir)
		}
		if err := checkLayersDir(c.LayersDir); err != nil {
			return errdefs.InvalidField("layers_dir", "%v", err)
		}
	}
	if c.LogWriter != "" && !filepath.IsAbs(c.LogWriter) {
		return errdefs.InvalidField("log_writer", "%q is not an absolute path (the shim runs it)", c.LogWriter)
	}
	if !filepath.IsAbs(c.NetHook) {
		return errdefs.InvalidField("net_hook", "%q is not an absolute path (runc runs it; NetHookPath finds it)", c.NetHook)
	}
	if c.RunTmpfsBytes < 0 || c.DevShmBytes < 0 {
		return errdefs.InvalidField("tmpfs_bytes", "tmpfs sizes must not be negative (run %d, dev %d)", c.RunTmpfsBytes, c.DevShmBytes)
	}
	return nil
}

// Runtime is runtime.Runtime on containerd + runc + CRIU. It is safe for
// concurrent use.
type Runtime struct {
	cfg Config
	// regClient is the HTTP client of every registry request (made once).
	regOnce   sync.Once
	regClient *http.Client
	log       *slog.Logger
	client    *client.Client
	sn        snapshots.Snapshotter

	net     *network.Manager
	ownsNet bool // net was made by New (and is closed by Close)

	criuConfig  string   // path of the CRIU config file handed to runc
	criuOptions []string // its lines; image options follow them (criuConfigFor)
	// emptyDir is an empty read-only directory bind-mounted over masked
	// directories (maskDirs: those that exist on this kernel).
	emptyDir string
	maskDirs map[string]bool
	// unmaskDirs are masked directories in /proc left unmasked because
	// they are empty on this kernel (see emptyProcDirs).
	unmaskDirs map[string]bool

	imageProcs   sync.Map // image digest -> imageProcess
	restoreBases sync.Map // checkpoint dir -> *restoreBase
	forkShims    shimGroups
	lazy         lazyState
	hotMetrics   *hotSetMetrics // the page server's hot sets (pageserver.go)
	// freezeRetries counts the thaw-and-freeze retries of freezes still
	// FREEZING (setFreezer); one freeze may take several.
	freezeRetries prometheus.Counter
	// seccomp: the first seccomp filters this host's sandboxes run under
	// (criupolicy.go).
	seccomp *seccompRoots

	// freezerKey is the empty cgroup held frozen from New to Close
	// (freezerkey.go).
	freezerKey string

	unpacked      sync.Map // image name + digest -> struct{}: unpacked into cfg.Snapshotter
	imageCRIUOpts sync.Map // image digest -> []string: its CRIU options (imageCRIUOptions)
	layers        layerSlots

	criuBinary   string // "criu" in controld's PATH, run by dumps ("": dumps go through runc)
	cgroupV2     bool
	runcDumpOnce sync.Once // warns once when dumps fall back to runc
	dumpViaRunc  bool      // tests: dump through runc, as the fallback does

	mu sync.Mutex
	// quiet holds sandboxes whose exit the runtime causes (Delete, Stop) so
	// Exits does not report it; entries expire.
	quiet map[string]time.Time
	// precreated holds sandboxes created ahead (Precreate*) awaiting their
	// Boot or Restore.
	precreated map[string]*precreated
}

var _ runtime.Runtime = (*Runtime)(nil)

// New connects to containerd and prepares the runtime's state directory.
func New(ctx context.Context, cfg Config) (*Runtime, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	dirs := []string{cfg.StateDir, filepath.Join(cfg.StateDir, "logs"), filepath.Join(cfg.StateDir, "work")}
	if cfg.LayersDir != "" {
		dirs = append(dirs, filepath.Join(cfg.LayersDir, cfg.Namespace))
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("containerdrt: state dir: %w", err)
		}
	}
	// Searchable by a replica's root, not listable (devlayout.go).
	if err := os.MkdirAll(cfg.DevDir, 0o711); err != nil {
		return nil, fmt.Errorf("containerdrt: dev dir: %w", err)
	}
	if err := os.Chmod(cfg.DevDir, 0o711); err != nil {
		return nil, fmt.Errorf("containerdrt: dev dir: %w", err)
	}
	criuOpts := runtimeCRIUOptions(cfg)
	criuConfig := filepath.Join(cfg.StateDir, "criu.conf")
	if err := atomicfile.Write(criuConfig, []byte(strings.Join(criuOpts, "\n")+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("containerdrt: criu config: %w", err)
	}
	netm, ownsNet := cfg.Network, false
	if netm == nil {
		var err error
		if netm, err = network.New(network.Config{RunDir: filepath.Join(cfg.StateDir, "net"), NoEgress: true, Logger: cfg.Logger}); err != nil {
			return nil, fmt.Errorf("containerdrt: %w", err)
		}
		ownsNet = true
	}
	// Beside the resolver file: what sandboxes bind-mount from the host.
	emptyDir := filepath.Join(netm.ShareDir(), "empty")
	err := os.MkdirAll(emptyDir, 0o555)
	if err == nil {
		err = os.Chmod(emptyDir, 0o555)
	}
	if err != nil {
		if ownsNet {
			netm.Close()
		}
		return nil, fmt.Errorf("containerdrt: empty dir: %w", err)
	}
	c, err := client.New(cfg.Address,
		client.WithDefaultNamespace(cfg.Namespace),
		client.WithTimeout(cfg.DialTimeout),
	)
	if err != nil {
		return nil, fmt.Errorf("containerdrt: connect to containerd at %s: %w: %w", cfg.Address, errdefs.ErrUnavailable, err)
	}
	hotMetrics := newHotSetMetrics()
	if cfg.PageServer == nil {
		cfg.PageServer = lazyPagesServer{hotDir: hotSetDir(cfg.StateDir), log: cfg.Logger, metrics: hotMetrics}
	}
	r := &Runtime{
		cfg:         cfg,
		log:         cfg.Logger,
		client:      c,
		sn:          c.SnapshotService(cfg.Snapshotter),
		criuConfig:  criuConfig,
		criuOptions: criuOpts,
		emptyDir:    emptyDir,
		maskDirs:    existingDirs(maskedDirCandidates),
		unmaskDirs:  emptyProcDirs(procMaskedDirCandidates),
		seccomp:     loadSeccompRoots(filepath.Join(cfg.StateDir, seccompRootsFile)),
		quiet:       map[string]time.Time{},
		precreated:  map[string]*precreated{},
		lazy:        lazyState{checkpoints: map[string]*lazyCheckpoint{}, replicas: map[string]*lazyReplica{}},
		hotMetrics:  hotMetrics,
		freezeRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "forkfleet", Subsystem: "controld", Name: "freeze_retries_total",
			Help: "Times a freeze of a sandbox, still FREEZING after 20 ms (then 40, 80, up to 640 ms), was thawed and written again: a process of the sandbox was exec'ing while it had other threads (cgroup.go, setFreezer).",
		}),
		criuBinary: lookPath("criu"),
		cgroupV2:   isCgroupV2(cfg.CgroupRoot),
		net:        netm,
		ownsNet:    ownsNet,
	}
	if n := conntrackBuckets(); n > maxConntrackBuckets {
		r.log.Warn("every checkpoint walks the host's whole conntrack table twice (CRIU), about 1 ms per 30000 buckets; deploy/host-setup.sh lowers it",
			"nf_conntrack_buckets", n, "suggested", maxConntrackBuckets)
	}
	if _, err := c.Version(r.ctx(ctx)); err != nil {
		c.Close()
		if ownsNet {
			netm.Close()
		}
		return nil, fmt.Errorf("containerdrt: containerd at %s: %w", cfg.Address, convertErr(err))
	}
	if cfg.UserNamespaces != nil {
		if err := r.checkIDMappedSnapshots(r.ctx(ctx)); err != nil {
			c.Close()
			if ownsNet {
				netm.Close()
			}
			return nil, fmt.Errorf("containerdrt: %w", err)
		}
		// Reservations of sandboxes that are gone (a crash, a killed test).
		cfg.UserNamespaces.Reclaim(func(owner string) bool { return r.ownerGone(r.ctx(ctx), owner) })
	}
	if r.freezerKey, err = holdFreezerKey(cfg.CgroupRoot, cfg.CgroupParent); err != nil {
		// Only slower freezes and thaws without it.
		r.log.Warn("no freezer key", "err", err)
	}
	return r, nil
}

// Close removes the sandboxes precreated but never booted (they are the
// runtime's own) and closes the connection to containerd. Booted sandboxes
// keep running.
func (r *Runtime) Close() error {
	r.mu.Lock()
	pending := r.precreated
	r.precreated = map[string]*precreated{}
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(r.ctx(context.Background()), cleanupTimeout)
	defer cancel()
	var errs []error
	r.closeLazy(ctx)
	if err := r.closeLayerSlots(ctx); err != nil {
		errs = append(errs, err)
	}
	for id, sb := range pending {
		if sb == nil {
			continue
		}
		if err := r.cleanup(ctx, id, sb.container, sb.task, true); err != nil {
			errs = append(errs, fmt.Errorf("precreated sandbox %s: %w", id, err))
		}
	}
	if err := r.client.Close(); err != nil {
		errs = append(errs, err)
	}
	if err := releaseFreezerKey(r.freezerKey); err != nil {
		errs = append(errs, err)
	}
	if r.ownsNet {
		// A runtime's own manager (mode none, under its state directory):
		// its bind mounts would pin that directory (a test's temporary one)
		// while sandboxes outlive the runtime; their namespaces stay with
		// their processes.
		r.net.Close()
		if err := r.net.Forget(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Client is the underlying containerd client (for tests and tools).
func (r *Runtime) Client() *client.Client { return r.client }

// Config returns the effective configuration (defaults filled in).
func (r *Runtime) Config() Config { return r.cfg }

// ctx puts the runtime's namespace on ctx.
func (r *Runtime) ctx(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, r.cfg.Namespace)
}

func (r *Runtime) logPath(id string) string {
	return filepath.Join(r.cfg.StateDir, "logs", id+".log")
}

func (r *Runtime) workDir(name string) string {
	return filepath.Join(r.cfg.StateDir, "work", name)
}

// cgroupsPath is the OCI linux.cgroupsPath of sandbox id.
func (r *Runtime) cgroupsPath(id string) string {
	return filepath.Join(r.cfg.CgroupParent, id)
}

// runcOptions are the shim options for every container and task. Task
// options replace the container's runtime options entirely, so callers start
// from this full set and add the CRIU paths.
func (r *Runtime) runcOptions() *options.Options {
	return &options.Options{
		BinaryName:    r.cfg.RuncBinary,
		Root:          r.cfg.RuncRoot,
		SystemdCgroup: false,
	}
}

func withTaskOptions(o *options.Options) client.NewTaskOpts {
	return func(_ context.Context, _ *client.Client, ti *client.TaskInfo) error {
		ti.Options = o
		return nil
	}
}

// setQuiet marks id's next exit as caused by the runtime.
func (r *Runtime) setQuiet(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	for k, until := range r.quiet {
		if now.After(until) {
			delete(r.quiet, k)
		}
	}
	r.quiet[id] = now.Add(time.Minute)
}

func (r *Runtime) isQuiet(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	until, ok := r.quiet[id]
	return ok && time.Now().Before(until)
}

func validateID(id string) error {
	if err := identifiers.Validate(id); err != nil {
		return errdefs.InvalidField("id", "%v", err)
	}
	return nil
}

// convertErr maps containerd and gRPC errors onto forkfleet's classes; the
// original error stays in the chain.
func convertErr(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		err = errgrpc.ToNative(err) // raw service clients return gRPC status errors
	}
	var class error
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case cerrdefs.IsNotFound(err):
		class = errdefs.ErrNotFound
	case cerrdefs.IsAlreadyExists(err):
		class = errdefs.ErrAlreadyExists
	case cerrdefs.IsFailedPrecondition(err), cerrdefs.IsConflict(err):
		class = errdefs.ErrFailedPrecondition
	case cerrdefs.IsInvalidArgument(err):
		class = errdefs.ErrInvalidArgument
	case cerrdefs.IsUnavailable(err):
		class = errdefs.ErrUnavailable
	case cerrdefs.IsCanceled(err):
		class = errdefs.ErrCanceled
	case cerrdefs.IsDeadlineExceeded(err):
		class = errdefs.ErrDeadlineExceeded
	default:
		if s, ok := status.FromError(err); ok && s.Code() == codes.Unavailable {
			class = errdefs.ErrUnavailable
		} else {
			class = errdefs.ErrInternal
		}
	}
	if errors.Is(err, class) {
		return err
	}
	return fmt.Errorf("%w: %w", class, err)
}

// maskedDirCandidates are the directories among containerd's default masked
// paths that may be masked with a bind mount (runc refuses mounts inside
// /proc, so /proc/acpi and friends keep runc's tmpfs).
var maskedDirCandidates = []string{"/sys/firmware", "/sys/devices/virtual/powercap"}

// procMaskedDirCandidates are the directories among containerd's default
// masked paths in /proc: runc masks each with a read-only tmpfs.
var procMaskedDirCandidates = []string{"/proc/acpi", "/proc/asound", "/proc/scsi"}

// emptyProcDirs returns those of paths that are empty directories on this
// kernel when controld starts: masking them hides nothing and costs a tar
// on every dump and restore (4 ms each here), so they are left unmasked.
// Their entries come from drivers (ACPI, sound, SCSI): one loaded later
// shows its entries unmasked in sandboxes booted before controld restarts,
// and in forks of their checkpoints.
func emptyProcDirs(paths []string) map[string]bool {
	out := map[string]bool{}
	for _, p := range paths {
		if ents, err := os.ReadDir(p); err == nil && len(ents) == 0 {
			out[p] = true
		}
	}
	return out
}

// maxConntrackBuckets is the conntrack table size above which controld warns:
// CRIU walks the whole (host-wide) table twice per dump.
const maxConntrackBuckets = 65536

func conntrackBuckets() int {
	b, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_buckets")
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

func existingDirs(paths []string) map[string]bool {
	out := map[string]bool{}
	for _, p := range paths {
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			out[p] = true
		}
	}
	return out
}

func lookPath(name string) string {
	p, _ := exec.LookPath(name)
	return p
}

func isCgroupV2(root string) bool {
	_, err := os.Stat(filepath.Join(root, "cgroup.controllers"))
	return err == nil
}

// cgroupV1Yard returns root when it is a cgroup v1 tree with one directory
// per hierarchy, which CRIU can use as its cgroup yard: otherwise every dump
// and restore mounts all the hierarchies into a yard of its own first
// (10 to 14 ms of each dump's frozen window measured here).
func cgroupV1Yard(root string) (string, bool) {
	if isCgroupV2(root) {
		return "", false
	}
	for _, c := range []string{"freezer", "memory", "pids", "cpu", "devices"} {
		if st, err := os.Stat(filepath.Join(root, c)); err != nil || !st.IsDir() {
			return "", false
		}
	}
	return root, true
}
