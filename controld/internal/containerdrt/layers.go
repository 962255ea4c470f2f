//go:build linux

package containerdrt

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	tasks "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/api/types/runc/options"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/typeurl/v2"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/btrfs"
)

// Disk quotas. A sandbox with a disk budget (BootSpec.DiskBytes) writes into
// a writable layer of its own outside containerd's snapshotter: a btrfs
// subvolume under Config.LayersDir whose quota group is limited to the
// budget, holding the overlay's upper/ and work/ directories. The kernel
// refuses writes past the budget (EDQUOT) whoever writes, root and the
// overlay's own copy-ups included, and the filesystem is a preallocated
// file (deploy/host-setup.sh): no sandbox write takes space from the host.
//
// containerd still prepares the sandbox's snapshot (its lower layers, GC
// references, Delete with snapshot cleanup): only the task's rootfs mount
// differs, the snapshot's overlay with upperdir and workdir replaced by the
// layer's. The snapshot's own upper stays empty. The container carries the
// layer's path in its labels (labelLayer), which the checkpoint's layer
// copy reads from.
//
// Layout: <LayersDir>/<namespace>/<sandbox id>/{upper,work}.

// checkLayersDir verifies that dir can enforce disk budgets.
func checkLayersDir(dir string) error {
	ok, err := btrfs.IsBtrfs(dir)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%s is not a btrfs filesystem (deploy/host-setup.sh mounts one there)", dir)
	}
	if ok, err := btrfs.QuotaEnabled(dir); err != nil || !ok {
		return fmt.Errorf("btrfs quotas are not enabled on %s (btrfs quota enable %s): %v", dir, dir, err)
	}
	return nil
}

func (r *Runtime) layersRoot() string { return filepath.Join(r.cfg.LayersDir, r.cfg.Namespace) }

func (r *Runtime) layerDir(id string) string { return filepath.Join(r.layersRoot(), id) }

// createLayer makes sandbox id's writable layer, limited to budget bytes.
// A layer left by an earlier sandbox of this id is replaced.
func (r *Runtime) createLayer(id string, budget int64) (string, error) {
	if r.cfg.LayersDir == "" {
		return "", fmt.Errorf("sandbox %s: %w: a disk budget needs a layers filesystem (Config.LayersDir)", id, errdefs.ErrFailedPrecondition)
	}
	if err := r.removeLayer(id); err != nil {
		return "", err
	}
	dir := r.layerDir(id)
	if err := btrfs.CreateSubvolume(r.layersRoot(), id); err != nil {
		if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
			return "", fmt.Errorf("sandbox %s: %w: the layers filesystem %s is full: %w", id, errdefs.ErrResourceExhausted, r.cfg.LayersDir, err)
		}
		return "", fmt.Errorf("sandbox %s: %w: writable layer: %w", id, errdefs.ErrInternal, err)
	}
	err := btrfs.SetLimit(dir, uint64(budget))
	if err == nil {
		err = os.Mkdir(filepath.Join(dir, "upper"), 0o755)
	}
	if err == nil {
		err = os.Mkdir(filepath.Join(dir, "work"), 0o711)
	}
	if err != nil {
		r.removeLayer(id)
		return "", fmt.Errorf("sandbox %s: %w: writable layer: %w", id, errdefs.ErrInternal, err)
	}
	return dir, nil
}

// removeLayer deletes sandbox id's writable layer, if it has one.
func (r *Runtime) removeLayer(id string) error {
	if r.cfg.LayersDir == "" {
		return nil
	}
	if !btrfs.IsSubvolume(r.layerDir(id)) {
		return nil
	}
	if err := btrfs.DeleteSubvolume(r.layersRoot(), id); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("sandbox %s: remove writable layer: %w", id, err)
	}
	return nil
}

// layerOf returns the writable layer a container's labels name ("" for a
// sandbox without one), refusing a path outside the runtime's layers.
func (r *Runtime) layerOf(id string, labels map[string]string) (string, error) {
	dir := labels[labelLayer]
	if dir == "" {
		return "", nil
	}
	if r.cfg.LayersDir == "" || dir != r.layerDir(id) {
		return "", fmt.Errorf("sandbox %s: %w: its writable layer %q is not this runtime's %q", id, errdefs.ErrFailedPrecondition, dir, r.layerDir(id))
	}
	return dir, nil
}

// withLayer returns a snapshot's overlay mount with its upper and work
// directories on layer.
func withLayer(ms []mount.Mount, layer string) ([]mount.Mount, error) {
	if len(ms) != 1 || ms[0].Type != "overlay" {
		return nil, fmt.Errorf("snapshot mounts %+v: want one overlay (an image with layers)", ms)
	}
	m := ms[0]
	opts := make([]string, 0, len(m.Options))
	var up, work bool
	for _, o := range m.Options {
		switch {
		case strings.HasPrefix(o, "upperdir="):
			o, up = "upperdir="+filepath.Join(layer, "upper"), true
		case strings.HasPrefix(o, "workdir="):
			o, work = "workdir="+filepath.Join(layer, "work"), true
		}
		opts = append(opts, o)
	}
	if !up || !work {
		return nil, fmt.Errorf("snapshot overlay without upperdir and workdir: %v", m.Options)
	}
	m.Options = opts
	return []mount.Mount{m}, nil
}

// matchOwner gives the layer's upper directory the owner and mode of the
// snapshot's own (the root directory the sandbox sees): a snapshot prepared
// for a user namespace is owned by the namespace's root, and so must be what
// replaces it.
func matchOwner(ms []mount.Mount, layer string) error {
	snapUpper, err := upperDir(ms)
	if err != nil {
		return err
	}
	var st syscall.Stat_t
	if err := syscall.Stat(snapUpper, &st); err != nil {
		return fmt.Errorf("%w: snapshot upper: %w", errdefs.ErrInternal, err)
	}
	up := filepath.Join(layer, "upper")
	if err := os.Lchown(up, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("%w: writable layer: %w", errdefs.ErrInternal, err)
	}
	if err := syscall.Chmod(up, st.Mode&0o7777); err != nil {
		return fmt.Errorf("%w: writable layer: %w", errdefs.ErrInternal, err)
	}
	return nil
}

// newTask creates c's task on its snapshot (snapshotKey), with the rootfs
// mount of rootfsMounts: client.NewTask always mounts the container's
// snapshot as the snapshotter gives it, so the request is made here, as
// NewTask would make it. layer is the sandbox's own writable layer ("" for
// none: the snapshot's upper directory).
func (r *Runtime) newTask(ctx context.Context, c client.Container, snapshotKey, layer string, stdio cio.Creator, opts *options.Options) (client.Task, error) {
	ms, err := r.sn.Mounts(ctx, snapshotKey)
	if err != nil {
		return nil, fmt.Errorf("snapshot mounts: %w", err)
	}
	rootfs, err := rootfsMounts(ms, layer)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errdefs.ErrFailedPrecondition, err)
	}
	if layer != "" {
		if err := matchOwner(ms, layer); err != nil {
			return nil, err
		}
	}
	io, err := stdio(c.ID())
	if err != nil {
		return nil, err
	}
	cfg := io.Config()
	o, err := typeurl.MarshalAnyToProto(opts)
	if err != nil {
		io.Close()
		return nil, err
	}
	if _, err := r.client.TaskService().Create(ctx, &tasks.CreateTaskRequest{
		ContainerID: c.ID(),
		Rootfs:      mount.ToProto(rootfs),
		Stdin:       cfg.Stdin,
		Stdout:      cfg.Stdout,
		Stderr:      cfg.Stderr,
		Terminal:    cfg.Terminal,
		Options:     o,
	}); err != nil {
		io.Close()
		return nil, errgrpc.ToNative(err)
	}
	return c.Task(ctx, nil)
}

// rootfsMounts is a sandbox's rootfs mount: the snapshot's overlay, on
// layer when it has one, mounted "volatile". A sandbox's writable layer
// never outlives the host's uptime (a host crash ends its processes, and
// its task is never created again on the same snapshot), so overlayfs's
// syncs of the upper directory buy nothing: without the option, every
// copy-up of a lower file (a fork opening its checkpoint's files for
// writing: a browser's profile databases, about 150 at a restore) ends in
// an fsync, 3 to 10 ms each on these disks, paid inside CRIU's restore.
// A checkpoint's layer is copied from the upper directory (page cache
// included) and committed by controld, not by this mount.
func rootfsMounts(ms []mount.Mount, layer string) ([]mount.Mount, error) {
	if len(ms) != 1 || ms[0].Type != "overlay" {
		return nil, fmt.Errorf("snapshot mounts %+v: want one overlay (an image with layers)", ms)
	}
	if layer != "" {
		var err error
		if ms, err = withLayer(ms, layer); err != nil {
			return nil, err
		}
	}
	m := ms[0]
	m.Options = append(slices.Clip(m.Options), overlayVolatile)
	return []mount.Mount{m}, nil
}

// overlayVolatile is overlayfs's option that omits syncs of the upper
// directory (Linux 5.10).
const overlayVolatile = "volatile"

// removeOrphanLayers deletes the writable layers of this namespace whose
// sandbox has no container (a crash between a layer's creation and its
// container's, or between a container's deletion and its layer's).
func (r *Runtime) removeOrphanLayers(containers map[string]bool) error {
	if r.cfg.LayersDir == "" {
		return nil
	}
	ents, err := os.ReadDir(r.layersRoot())
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	var errs []error
	for _, e := range ents {
		if containers[e.Name()] || !e.IsDir() {
			continue
		}
		r.log.Warn("removing a writable layer without a sandbox", "sandbox", e.Name())
		if err := r.removeLayer(e.Name()); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
