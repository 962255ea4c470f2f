//go:build linux

package containerdrt

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	tasks "github.com/containerd/containerd/api/services/tasks/v1"
	tasktypes "github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	cerrdefs "github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/guestsock"
	"github.com/forkfleet/forkfleet/controld/internal/network"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/sandboxlog"
)

// cleanupTimeout bounds the cleanup of a failed Boot/Restore, which runs
// even when the caller's ctx is done.
const cleanupTimeout = 30 * time.Second

// sandbox is a container whose task is created (runc create or, for a
// restore, the shim holding the restore options) but maybe not started.
type sandbox struct {
	id        string
	container client.Container
	task      client.Task
	// fingerprint identifies the request a precreated sandbox serves.
	fingerprint string
}

// Boot creates and starts a sandbox from an image.
func (r *Runtime) Boot(ctx context.Context, spec runtime.BootSpec) (runtime.Instance, error) {
	if err := validateBootSpec(spec); err != nil {
		return runtime.Instance{}, err
	}
	if spec.Image == "" {
		return runtime.Instance{}, errdefs.InvalidField("image", "required")
	}
	ctx = r.ctx(ctx)
	if sb := r.takePrecreated(ctx, spec.ID, bootFingerprint(spec)); sb != nil {
		return r.start(ctx, sb, spec.Network.Policy)
	}
	sb, err := r.createBoot(ctx, spec)
	if err != nil {
		return runtime.Instance{}, err
	}
	return r.start(ctx, sb, spec.Network.Policy)
}

// createBoot creates the container and its task without starting it.
func (r *Runtime) createBoot(ctx context.Context, spec runtime.BootSpec) (*sandbox, error) {
	img, err := r.image(ctx, spec.Image)
	if err != nil {
		return nil, err
	}
	criuOpts, err := r.imageCRIUOptions(ctx, img)
	if err != nil {
		return nil, err
	}
	rng, err := r.takeRange(ctx, spec.ID)
	if err != nil {
		return nil, err
	}
	nsb, err := r.setupNetwork(ctx, spec, false)
	if err != nil {
		r.releaseRange(spec.ID, rng)
		return nil, err
	}
	c, err := r.client.NewContainer(ctx, spec.ID,
		client.WithImage(img),
		client.WithSnapshotter(r.cfg.Snapshotter),
		client.WithNewSnapshot(spec.ID, img, snapshotOpts(rng)...),
		client.WithRuntime(r.cfg.Runtime, r.runcOptions()),
		client.WithNewSpec(r.sandboxSpecOpts(oci.WithImageConfig(img), spec, criuOpts, nsb, rng, runLayoutRootfs)...),
		client.WithContainerLabels(withImageDigest(r.labelsOf(spec), img.Target().Digest.String())),
	)
	if err != nil {
		r.releaseRange(spec.ID, rng) // the container was not made: its range is not its spec's
		if !cerrdefs.IsAlreadyExists(err) {
			r.cleanup(ctx, spec.ID, nil, nil, true)
		} else {
			r.net.Release(ctx, spec.ID) // ours: Setup succeeded for this id
		}
		if cerrdefs.IsNotFound(err) {
			// The image's layers were collected since they were unpacked:
			// check again next time.
			r.unpacked.Delete(unpackKey(img))
		}
		return nil, fmt.Errorf("sandbox %s: create container: %w", spec.ID, convertErr(err))
	}
	return r.createTask(ctx, spec, c, nil)
}

// createTask creates the task of a new container; restore carries the CRIU
// paths of a memory-tier fork. On error the container is removed.
func (r *Runtime) createTask(ctx context.Context, spec runtime.BootSpec, c client.Container, restore *restorePaths) (*sandbox, error) {
	id := spec.ID
	opts := r.runcOptions()
	if restore != nil {
		opts.CriuImagePath = restore.image
		opts.CriuWorkPath = restore.work
	}
	// A stale log of an earlier sandbox with this id must not be appended to.
	if err := r.removeLog(id); err != nil {
		r.cleanup(ctx, id, c, nil, true)
		return nil, fmt.Errorf("sandbox %s: %w: %w", id, errdefs.ErrInternal, err)
	}
	stdio, err := r.stdio(spec)
	if err != nil {
		r.cleanup(ctx, id, c, nil, true)
		return nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	var layer string
	if spec.DiskBytes > 0 {
		// The container exists (its id was free): a layer of that id is
		// debris of an earlier one, replaced.
		if layer, err = r.createLayer(id, spec.DiskBytes); err != nil {
			r.cleanup(ctx, id, c, nil, true)
			return nil, err
		}
	}
	t, err := r.newGroupedTask(ctx, c, id, layer, stdio, opts)
	if err != nil {
		r.cleanup(ctx, id, c, nil, true)
		return nil, fmt.Errorf("sandbox %s: create task: %w", id, convertErr(err))
	}
	return &sandbox{id: id, container: c, task: t}, nil
}

// labelsOf is a new sandbox's container labels: sandboxLabels, and where
// its writable layer lives when it has a disk budget.
func (r *Runtime) labelsOf(spec runtime.BootSpec) map[string]string {
	l := sandboxLabels(spec)
	if spec.DiskBytes > 0 {
		l[labelLayer] = r.layerDir(spec.ID)
	}
	return l
}

// setupNetwork makes the sandbox's network namespace (and in mode egress
// its router, uplink, DNS stub and policy) before its container exists. An
// id whose network exists already is refused without touching it.
func (r *Runtime) setupNetwork(ctx context.Context, spec runtime.BootSpec, forRestore bool) (network.Sandbox, error) {
	nsb, err := r.net.Setup(ctx, spec.ID, spec.Network.Mode, spec.Network.Policy, forRestore || spec.Network.Hold)
	if err != nil {
		return nsb, fmt.Errorf("sandbox %s: %w", spec.ID, err)
	}
	return nsb, nil
}

// start starts a created task, with the policy the request asked for (a
// precreated sandbox was made with another one, maybe); on error the
// sandbox is removed.
func (r *Runtime) start(ctx context.Context, sb *sandbox, policy network.Policy) (runtime.Instance, error) {
	if err := r.net.SetPolicy(ctx, sb.id, policy); err != nil {
		r.cleanup(ctx, sb.id, sb.container, sb.task, true)
		return runtime.Instance{}, fmt.Errorf("sandbox %s: network policy: %w", sb.id, err)
	}
	if err := sb.task.Start(ctx); err != nil {
		tail := r.logTail(sb.id) // before cleanup removes the log
		r.cleanup(ctx, sb.id, sb.container, sb.task, true)
		return runtime.Instance{}, fmt.Errorf("sandbox %s: start: %w%s", sb.id, convertErr(err), tail)
	}
	started := time.Now()
	info, err := sb.container.Info(ctx, client.WithoutRefreshedMetadata)
	if err != nil {
		r.cleanup(ctx, sb.id, sb.container, sb.task, true)
		return runtime.Instance{}, fmt.Errorf("sandbox %s: %w", sb.id, convertErr(err))
	}
	pid := sb.task.Pid()
	return runtime.Instance{
		ID:            sb.id,
		PID:           pid,
		Status:        runtime.StatusRunning,
		ACISocket:     aciSocket(pid),
		Labels:        userLabels(info.Labels),
		ImageDigest:   info.Labels[labelImageDigest],
		CreatedAt:     info.CreatedAt,
		TaskStartedAt: started,
	}, nil
}

// aciSocket addresses guestd's socket of the sandbox whose init is pid,
// pinned to that process by its start time (zero when it is already gone).
func aciSocket(pid uint32) guestsock.Addr {
	if pid == 0 {
		return guestsock.Addr{}
	}
	start, err := guestsock.ProcessStart(pid)
	if err != nil {
		return guestsock.Addr{}
	}
	return guestsock.Addr{PID: pid, Start: start, Path: ACISocketInSandbox}
}

// image returns an image unpacked into the runtime's snapshotter.
func (r *Runtime) image(ctx context.Context, name string) (client.Image, error) {
	img, err := r.client.GetImage(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("image %q: %w", name, convertErr(err))
	}
	return r.unpackImage(ctx, img)
}

// unpackImage returns img once it is unpacked into the runtime's snapshotter.
func (r *Runtime) unpackImage(ctx context.Context, img client.Image) (client.Image, error) {
	name := img.Name()
	key := unpackKey(img)
	if _, ok := r.unpacked.Load(key); ok {
		return img, nil
	}
	ok, err := img.IsUnpacked(ctx, r.cfg.Snapshotter)
	if err != nil {
		return nil, fmt.Errorf("image %q: %w", name, convertErr(err))
	}
	if !ok {
		if err := img.Unpack(ctx, r.cfg.Snapshotter); err != nil {
			return nil, fmt.Errorf("image %q: unpack: %w", name, convertErr(err))
		}
	}
	r.unpacked.Store(key, struct{}{})
	return img, nil
}

func unpackKey(img client.Image) string {
	return img.Name() + "@" + img.Target().Digest.String()
}

// cleanup removes what a failed or deleted sandbox left: task, container,
// snapshot (key id), cgroups, log, its user namespace range and a fork's
// image directory. It runs past the caller's ctx.
func (r *Runtime) cleanup(ctx context.Context, id string, c client.Container, t client.Task, removeLog bool) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	var errs []error
	r.setQuiet(id)
	// Before its task's delete, which may end a shared shim's daemon.
	r.forkShims.leave(ctx, id)
	if t != nil {
		if err := r.killAndDeleteTask(ctx, id, t); err != nil {
			errs = append(errs, err)
		}
	}
	if c != nil {
		// Its processes are gone: its range may go to another sandbox.
		if t == nil || len(errs) == 0 {
			if err := r.releaseRangeOf(ctx, id, c); err != nil {
				errs = append(errs, err)
			}
		}
		if info, err := c.Info(ctx, client.WithoutRefreshedMetadata); err == nil {
			if err := r.removeForkImages(id, info.Labels); err != nil {
				errs = append(errs, err)
			}
		}
		if err := c.Delete(ctx, client.WithSnapshotCleanup); err != nil && !cerrdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete container: %w", err))
		}
	} else if err := r.sn.Remove(ctx, id); err != nil && !cerrdefs.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("remove snapshot: %w", err))
	}
	if err := r.removeCgroups(id); err != nil {
		errs = append(errs, err)
	}
	// After the task: its rootfs (the overlay over the layer) is unmounted.
	if err := r.removeLayer(id); err != nil {
		errs = append(errs, err)
	}
	// After the task: a namespace goes once no process holds it.
	if err := r.net.Release(ctx, id); err != nil {
		errs = append(errs, err)
	}
	if err := r.releaseDev(id); err != nil {
		errs = append(errs, err)
	}
	if removeLog {
		if err := r.removeLog(id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// killAndDeleteTask kills every process of the task and deletes it. A frozen
// cgroup holds SIGKILL pending, so the freezer is thawed after the kill.
func (r *Runtime) killAndDeleteTask(ctx context.Context, id string, t client.Task) error {
	st, err := t.Status(ctx)
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("task status: %w", err)
	}
	// A fork created for a restore has no process until Start (runc restore
	// runs there): nothing to kill, and no exit would ever come.
	noProcess := st.Status == client.Created && t.Pid() == 0
	if st.Status != client.Stopped && !noProcess {
		exitCh, err := t.Wait(ctx)
		if err != nil && !cerrdefs.IsNotFound(err) {
			return fmt.Errorf("task wait: %w", err)
		}
		if kerr := r.killAll(ctx, id); kerr != nil {
			if !errors.Is(kerr, errNoFreezer) {
				r.log.WarnContext(ctx, "kill through the freezer failed; asking runc", "sandbox", id, "err", kerr)
			}
			if err := r.killTaskAll(ctx, id, t, st.Status); err != nil {
				return err
			}
		}
		if exitCh != nil {
			select {
			case <-exitCh:
			case <-ctx.Done():
				return fmt.Errorf("task %s did not exit after SIGKILL: %w", id, ctx.Err())
			}
		}
	}
	if _, err := t.Delete(ctx); err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("task delete: %w", err)
	}
	return nil
}

// killTaskAll kills the task's processes through containerd (runc kill
// --all) and thaws what was frozen, where killAll cannot.
func (r *Runtime) killTaskAll(ctx context.Context, id string, t client.Task, status client.ProcessStatus) error {
	if err := t.Kill(ctx, syscall.SIGKILL, client.WithKillAll); err != nil && !cerrdefs.IsNotFound(err) {
		// A created (never started) task has only runc init: kill
		// without --all is what runc accepts in every state.
		if err2 := t.Kill(ctx, syscall.SIGKILL); err2 != nil && !cerrdefs.IsNotFound(err2) {
			return fmt.Errorf("task kill: %w", err)
		}
	}
	if status == client.Paused {
		_ = t.Resume(ctx)
	}
	if err := r.setFreezer(ctx, id, freezerThawed); err != nil && !errors.Is(err, errNoFreezer) {
		return fmt.Errorf("thaw for kill: %w", err)
	}
	return nil
}

// Delete kills the sandbox and removes its task, container, snapshot,
// cgroups and log.
func (r *Runtime) Delete(ctx context.Context, id string) error {
	if err := validateID(id); err != nil {
		return err
	}
	ctx = r.ctx(ctx)
	r.dropPrecreated(id)
	c, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", id, convertErr(err))
	}
	info, err := c.Info(ctx, client.WithoutRefreshedMetadata)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", id, convertErr(err))
	}
	if info.Labels[labelSandbox] != "true" {
		return fmt.Errorf("sandbox %s: %w (container is not a forkfleet sandbox)", id, errdefs.ErrNotFound)
	}
	t, err := c.Task(ctx, nil)
	if err != nil && !cerrdefs.IsNotFound(err) {
		return fmt.Errorf("sandbox %s: %w", id, convertErr(err))
	}
	if err := r.cleanup(ctx, id, c, t, true); err != nil {
		return fmt.Errorf("sandbox %s: delete: %w", id, convertErr(err))
	}
	r.endLazy(id) // its processes are gone: no page is missed
	return nil
}

// List returns every forkfleet sandbox in the namespace.
func (r *Runtime) List(ctx context.Context) ([]runtime.Instance, error) {
	ctx = r.ctx(ctx)
	cs, err := r.client.ContainerService().List(ctx, sandboxFilter)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", convertErr(err))
	}
	out := make([]runtime.Instance, 0, len(cs))
	for _, c := range cs {
		inst, err := r.instance(ctx, c)
		if err != nil {
			return nil, err
		}
		out = append(out, inst)
	}
	return out, nil
}

// Get returns one sandbox as List would.
func (r *Runtime) Get(ctx context.Context, id string) (runtime.Instance, error) {
	if err := validateID(id); err != nil {
		return runtime.Instance{}, err
	}
	ctx = r.ctx(ctx)
	c, err := r.client.ContainerService().Get(ctx, id)
	if err != nil {
		return runtime.Instance{}, fmt.Errorf("sandbox %s: %w", id, convertErr(err))
	}
	if c.Labels[labelSandbox] != "true" {
		return runtime.Instance{}, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return r.instance(ctx, c)
}

func (r *Runtime) instance(ctx context.Context, c containers.Container) (runtime.Instance, error) {
	inst := runtime.Instance{
		ID:          c.ID,
		Status:      runtime.StatusStopped,
		Labels:      userLabels(c.Labels),
		ImageDigest: c.Labels[labelImageDigest],
		CreatedAt:   c.CreatedAt,
	}
	if c.Labels[labelLazyRestore] != "" {
		_, live := r.lazySession(c.ID)
		inst.LazyPending = !live // its page server was another controld's
	}
	st, err := r.client.TaskService().Get(ctx, taskGetRequest(c.ID))
	if err != nil {
		err = errgrpc.ToNative(err)
		if cerrdefs.IsNotFound(err) {
			return inst, nil
		}
		return runtime.Instance{}, fmt.Errorf("sandbox %s: task: %w", c.ID, convertErr(err))
	}
	p := st.GetProcess()
	inst.PID = p.GetPid()
	inst.Status = taskStatus(p.GetStatus())
	if inst.Status == runtime.StatusRunning {
		if fst, err := r.freezerState(c.ID); err == nil && fst != freezerThawed {
			inst.Status = runtime.StatusFrozen
		}
	}
	if inst.Status == runtime.StatusRunning || inst.Status == runtime.StatusFrozen {
		inst.ACISocket = aciSocket(inst.PID)
		inst.TaskStartedAt = bootTicksTime(inst.ACISocket.Start)
	}
	return inst, nil
}

// bootTicksTime turns a process start time in clock ticks since boot
// (guestsock.Addr.Start; containerd does not keep start times) into wall
// time; zero when unknown.
func bootTicksTime(ticks uint64) time.Time {
	if ticks == 0 {
		return time.Time{}
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return time.Time{}
	}
	const clkTck = 100 // USER_HZ on Linux
	sinceBoot := time.Duration(ticks) * time.Second / clkTck
	return time.Now().Add(-(time.Duration(ts.Nano()) - sinceBoot)).Truncate(10 * time.Millisecond)
}

// Freeze stops every process of the sandbox (cgroup freezer). Idempotent.
func (r *Runtime) Freeze(ctx context.Context, id string) error {
	return r.freezeThaw(ctx, id, freezerFrozen)
}

// Thaw continues a frozen sandbox. Idempotent.
func (r *Runtime) Thaw(ctx context.Context, id string) error {
	return r.freezeThaw(ctx, id, freezerThawed)
}

func (r *Runtime) freezeThaw(ctx context.Context, id, want string) error {
	if err := validateID(id); err != nil {
		return err
	}
	ctx = r.ctx(ctx)
	err := r.setFreezer(ctx, id, want)
	if err == nil {
		return nil
	}
	if !errors.Is(err, errNoFreezer) {
		return fmt.Errorf("sandbox %s: freezer: %w: %w", id, errdefs.ErrInternal, err)
	}
	// No v1 freezer at the expected path: let containerd do it.
	t, terr := r.loadTask(ctx, id)
	if terr != nil {
		return terr
	}
	st, terr := t.Status(ctx)
	if terr != nil {
		return fmt.Errorf("sandbox %s: %w", id, convertErr(terr))
	}
	switch {
	case want == freezerFrozen && st.Status == client.Running:
		terr = t.Pause(ctx)
	case want == freezerThawed && st.Status == client.Paused:
		terr = t.Resume(ctx)
	case st.Status == client.Running || st.Status == client.Paused:
		return nil
	default:
		return fmt.Errorf("sandbox %s: task is %s: %w", id, st.Status, errdefs.ErrFailedPrecondition)
	}
	if terr != nil {
		return fmt.Errorf("sandbox %s: %w", id, convertErr(terr))
	}
	return nil
}

// loadTask loads a forkfleet sandbox's task.
func (r *Runtime) loadTask(ctx context.Context, id string) (client.Task, error) {
	c, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, convertErr(err))
	}
	t, err := c.Task(ctx, nil)
	if err != nil {
		if cerrdefs.IsNotFound(err) {
			return nil, fmt.Errorf("sandbox %s: no task: %w", id, errdefs.ErrFailedPrecondition)
		}
		return nil, fmt.Errorf("sandbox %s: %w", id, convertErr(err))
	}
	return t, nil
}

// logTail returns the end of a sandbox's log for error messages.
func (r *Runtime) logTail(id string) string {
	tail := strings.TrimSpace(string(sandboxlog.Tail(r.logPath(id), 2048)))
	if tail == "" {
		return ""
	}
	return fmt.Sprintf("\n--- sandbox log (%s) ---\n%s", r.logPath(id), tail)
}

// stdio is where a task's stdout and stderr go: files (runc re-plumbs files
// and pipes, not terminals, on restore). With a log budget, through the log
// writer (forkfleet-log, started by the shim), which keeps the most recent
// LogBytes and never blocks the sandbox; without, appended to one file
// (tests of the runtime alone: controld always sets a budget).
func (r *Runtime) stdio(spec runtime.BootSpec) (cio.Creator, error) {
	if spec.LogBytes == 0 {
		return cio.LogFile(r.logPath(spec.ID)), nil
	}
	if spec.LogBytes < sandboxlog.MinBudget {
		return nil, errdefs.InvalidField("log_bytes", "%d is below the %d floor", spec.LogBytes, sandboxlog.MinBudget)
	}
	if r.cfg.LogWriter == "" {
		return nil, fmt.Errorf("%w: a log budget needs the log writer (Config.LogWriter, forkfleet-log)", errdefs.ErrFailedPrecondition)
	}
	// binary-v2: the shim starts the task only once the writer says it is
	// ready, so a writer that cannot open its log fails the create.
	uri, err := cio.LogURIGenerator("binary-v2", r.cfg.LogWriter, map[string]string{
		"-path": r.logPath(spec.ID),
		"-max":  strconv.FormatInt(spec.LogBytes, 10),
	})
	if err != nil {
		return nil, fmt.Errorf("%w: log writer: %w", errdefs.ErrInternal, err)
	}
	return cio.LogURI(uri), nil
}

// removeLog removes a sandbox's log (both halves).
func (r *Runtime) removeLog(id string) error {
	var errs []error
	for _, p := range []string{r.logPath(id), r.logPath(id) + ".1"} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func fileTail(path, what string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || st.Size() == 0 {
		return ""
	}
	off := max(st.Size()-n, 0)
	buf := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(buf, off); err != nil {
		return ""
	}
	return fmt.Sprintf("\n--- %s (%s) ---\n%s", what, path, strings.TrimSpace(string(buf)))
}

func taskGetRequest(id string) *tasks.GetRequest {
	return &tasks.GetRequest{ContainerID: id}
}

func taskStatus(s tasktypes.Status) runtime.InstanceStatus {
	switch s {
	case tasktypes.Status_CREATED:
		return runtime.StatusCreated
	case tasktypes.Status_RUNNING:
		return runtime.StatusRunning
	case tasktypes.Status_PAUSED, tasktypes.Status_PAUSING:
		return runtime.StatusFrozen
	case tasktypes.Status_STOPPED:
		return runtime.StatusStopped
	}
	return runtime.StatusUnknown
}

// criuLogErrors returns CRIU's error lines from a dump or restore log (the
// last lines of a failed run are usually cleanup noise), or its tail.
func criuLogErrors(path, what string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		// CRIU cannot raise its own RLIMIT_NOFILE under runc; harmless.
		if strings.Contains(l, "Error (") && !strings.Contains(l, "RLIMIT_NOFILE") {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	if len(lines) == 0 {
		return fileTail(path, what, 2048)
	}
	if len(lines) > 12 {
		lines = lines[:12]
	}
	return fmt.Sprintf("\n--- %s errors (%s) ---\n%s", what, path, strings.Join(lines, "\n"))
}
