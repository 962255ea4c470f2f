//go:build linux

package containerdrt

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	criucore "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	criuinventory "github.com/checkpoint-restore/go-criu/v7/crit/images/inventory"
	criunetdev "github.com/checkpoint-restore/go-criu/v7/crit/images/netdev"
	criupstree "github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
	criuuserns "github.com/checkpoint-restore/go-criu/v7/crit/images/userns"
	"github.com/checkpoint-restore/go-criu/v7/magic"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	cerrdefs "github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/userns"
)

// User namespaces. With Config.UserNamespaces set, every sandbox (a boot, a
// replica of either tier, a warm or fork slot, a pool member) runs in a
// user namespace of its own, its ids 0..65535 a range of host ids reserved
// for it alone (package userns): root in a sandbox is an unprivileged host
// user, another one in each sandbox.
//
//   - Files. The image's layers stay as they are: containerd's overlayfs
//     snapshotter mounts them idmapped (remap-ids) with the sandbox's range,
//     and makes its writable layer's root the sandbox's root. The writable
//     layer (the snapshot's upper directory or the disk-quota layer) holds
//     host ids; a checkpoint's layer copy stores the sandbox's own ids
//     instead (layerCopier.owner), as image layers do, so every fork mounts
//     it idmapped with its own range.
//   - Processes. CRIU dumps the user namespace's mappings (userns-*.img)
//     with everything else in the sandbox's own ids, and recreates the user
//     namespace from that image at a restore. A memory-tier fork restores
//     from a directory of its own (forkImages): links to the checkpoint's
//     images, but a userns image with the fork's range. The restored tasks
//     read their images as the fork's root, before and after CRIU maps it
//     (its first task opens timens-0.img racing the parent's write of the
//     map), so the images are readable by any user (shareImages) inside
//     directories only root can traverse: the tasks open them through the
//     image directory's descriptor, which needs no path.
//   - Network. The network namespace belongs to the user namespace: runc
//     and CRIU make it, and the network hook finishes it (package network).

// rangeOwner names a sandbox's reservation.
func (r *Runtime) rangeOwner(id string) string { return r.cfg.Namespace + "/" + id }

// takeRange reserves a range for sandbox id (nil when sandboxes run in the
// host's user namespace). Ranges whose sandbox has no container are
// reclaimed when none is free.
func (r *Runtime) takeRange(ctx context.Context, id string) (*userns.Range, error) {
	if r.cfg.UserNamespaces == nil {
		return nil, nil
	}
	rng, err := r.cfg.UserNamespaces.Take(r.rangeOwner(id), func(owner string) bool { return r.ownerGone(ctx, owner) })
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	return &rng, nil
}

// releaseRange gives back a range taken for a sandbox whose container was
// never made.
func (r *Runtime) releaseRange(id string, rng *userns.Range) {
	if rng == nil {
		return
	}
	if err := r.cfg.UserNamespaces.Release(r.rangeOwner(id), *rng); err != nil {
		r.log.Warn("release a user namespace range", "sandbox", id, "err", err)
	}
}

// releaseRangeOf gives back the range of container c (its spec says which),
// once its processes are gone.
func (r *Runtime) releaseRangeOf(ctx context.Context, id string, c client.Container) error {
	if r.cfg.UserNamespaces == nil || c == nil {
		return nil
	}
	info, err := c.Info(ctx, client.WithoutRefreshedMetadata)
	if err != nil {
		return fmt.Errorf("user namespace range: %w", err)
	}
	rng, err := rangeOfContainer(info)
	if err != nil || rng == nil {
		return err
	}
	if err := r.cfg.UserNamespaces.Release(r.rangeOwner(id), *rng); err != nil {
		return fmt.Errorf("user namespace range: %w", err)
	}
	return nil
}

// ownerGone reports whether the sandbox owning a reservation has no
// container: reservations are host-wide, owners "<namespace>/<id>".
func (r *Runtime) ownerGone(ctx context.Context, owner string) bool {
	ns, id, ok := strings.Cut(owner, "/")
	if !ok {
		return true
	}
	_, err := r.client.ContainerService().Get(namespaces.WithNamespace(ctx, ns), id)
	return cerrdefs.IsNotFound(err)
}

// rangeOfContainer reads a sandbox's range from its spec (nil: it runs in
// the host's user namespace).
func rangeOfContainer(info containers.Container) (*userns.Range, error) {
	if info.Spec == nil {
		return nil, nil
	}
	v, err := typeurl.UnmarshalAny(info.Spec)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: spec: %w", info.ID, err)
	}
	s, ok := v.(*specs.Spec)
	if !ok {
		return nil, fmt.Errorf("sandbox %s: spec is a %T", info.ID, v)
	}
	return rangeOfSpec(s)
}

// rangeOfSpec reads the one mapping withUserNamespace writes.
func rangeOfSpec(s *specs.Spec) (*userns.Range, error) {
	if s.Linux == nil || (len(s.Linux.UIDMappings) == 0 && len(s.Linux.GIDMappings) == 0) {
		return nil, nil
	}
	u, g := s.Linux.UIDMappings, s.Linux.GIDMappings
	if len(u) != 1 || len(g) != 1 || u[0].ContainerID != 0 || g[0].ContainerID != 0 || u[0].Size != userns.Size || g[0].Size != userns.Size {
		return nil, fmt.Errorf("%w: id mappings %v %v are not a sandbox's range", errdefs.ErrFailedPrecondition, u, g)
	}
	return &userns.Range{UID: u[0].HostID, GID: g[0].HostID}, nil
}

// withUserNamespace puts the sandbox in a user namespace of its own mapped
// to rng (nil: in the host's).
func withUserNamespace(rng *userns.Range) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Linux == nil {
			s.Linux = &specs.Linux{}
		}
		nss := s.Linux.Namespaces[:0]
		for _, ns := range s.Linux.Namespaces {
			if ns.Type != specs.UserNamespace {
				nss = append(nss, ns)
			}
		}
		s.Linux.Namespaces = nss
		s.Linux.UIDMappings, s.Linux.GIDMappings = nil, nil
		if rng == nil {
			return nil
		}
		s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UserNamespace})
		s.Linux.UIDMappings = []specs.LinuxIDMapping{{ContainerID: 0, HostID: rng.UID, Size: userns.Size}}
		s.Linux.GIDMappings = []specs.LinuxIDMapping{{ContainerID: 0, HostID: rng.GID, Size: userns.Size}}
		return nil
	}
}

// snapshotOpts are the labels of a sandbox's writable snapshot: with a
// range, the snapshotter mounts the layers below idmapped (remap-ids) and
// gives the sandbox's root the writable layer's root.
func snapshotOpts(rng *userns.Range) []snapshots.Opt {
	if rng == nil {
		return nil
	}
	return []snapshots.Opt{client.WithUserNSRemapperLabels(
		[]specs.LinuxIDMapping{{ContainerID: 0, HostID: rng.UID, Size: userns.Size}},
		[]specs.LinuxIDMapping{{ContainerID: 0, HostID: rng.GID, Size: userns.Size}},
	)}
}

// checkIDMappedSnapshots refuses a snapshotter that cannot mount layers
// idmapped: the fallback copies and chowns the whole image per range.
func (r *Runtime) checkIDMappedSnapshots(ctx context.Context) error {
	caps, err := r.client.GetSnapshotterCapabilities(ctx, r.cfg.Snapshotter)
	if err != nil {
		return fmt.Errorf("snapshotter %s: %w", r.cfg.Snapshotter, convertErr(err))
	}
	for _, c := range caps {
		if c == "remap-ids" {
			return nil
		}
	}
	return fmt.Errorf("%w: snapshotter %s cannot mount layers idmapped (capabilities %v; it needs a kernel with idmapped mounts): sandboxes cannot run in user namespaces here",
		errdefs.ErrFailedPrecondition, r.cfg.Snapshotter, caps)
}

// shareImages makes a dump's images readable by the root of any sandbox's
// user namespace (see above): the files 0644, the directory 0711. Their
// parents stay root's alone (the checkpoint directory is 0700), so no
// other user of the host can reach them by path.
func shareImages(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	ents, err := d.ReadDir(-1)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			return fmt.Errorf("%s/%s: not a regular file", dir, e.Name())
		}
		if err := unix.Fchmodat(int(d.Fd()), e.Name(), 0o644, unix.AT_SYMLINK_NOFOLLOW); err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
			return err
		}
	}
	return unix.Fchmod(int(d.Fd()), 0o711)
}

// forkImagesDir is where a memory-tier fork's own view of its checkpoint's
// images lives while it is restored: inside the checkpoint's directory, so
// the links never cross a filesystem.
func forkImagesDir(checkpointDir, id string) string {
	return filepath.Join(checkpointDir, ".restore-"+id)
}

// forkImages makes the image directory a memory-tier fork restores from:
// with a range, a directory of hard links to the checkpoint's images and a
// userns image of the fork's own range (CRIU maps the user namespace it
// makes from that image); without, the checkpoint's own. Either way the
// images must have been dumped as this host runs sandboxes (in a user
// namespace, or not), with a network namespace of their own.
func forkImages(checkpointDir, id string, rng *userns.Range) (string, error) {
	usernsImages, err := checkImagesLayout(filepath.Join(checkpointDir, criuImageDir), rng != nil)
	if err != nil {
		return "", fmt.Errorf("checkpoint %s: %w", checkpointDir, err)
	}
	return linkForkImages(checkpointDir, id, rng, usernsImages)
}

// linkForkImages is forkImages of a checkpoint whose layout was checked
// (usernsImages: checkImagesLayout's).
func linkForkImages(checkpointDir, id string, rng *userns.Range, usernsImages []string) (string, error) {
	src := filepath.Join(checkpointDir, criuImageDir)
	if rng == nil {
		return src, nil
	}
	dst := forkImagesDir(checkpointDir, id)
	if err := os.RemoveAll(dst); err != nil {
		return "", fmt.Errorf("%w: %w", errdefs.ErrInternal, err)
	}
	if err := linkImages(src, dst, usernsImages, *rng); err != nil {
		os.RemoveAll(dst)
		return "", fmt.Errorf("%w: fork images: %w", errdefs.ErrInternal, err)
	}
	return dst, nil
}

func linkImages(src, dst string, usernsImages []string, rng userns.Range) error {
	// Modes set explicitly: controld's umask (0077 under its unit) would
	// take the fork's root's search and read permissions away.
	if err := os.Mkdir(dst, 0o711); err != nil {
		return err
	}
	if err := os.Chmod(dst, 0o711); err != nil {
		return err
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range ents {
		name := e.Name()
		switch {
		case strings.HasPrefix(name, "userns-") && strings.HasSuffix(name, ".img"):
			continue // written below
		case strings.HasPrefix(name, "stats-"):
			continue // CRIU's own statistics, rewritten by every run
		case !e.Type().IsRegular():
			return fmt.Errorf("%s: not a regular file", filepath.Join(src, name))
		}
		if err := os.Link(filepath.Join(src, name), filepath.Join(dst, name)); err != nil {
			return err
		}
	}
	maps := []*criuuserns.UidGidExtent{{First: proto.Uint32(0), LowerFirst: proto.Uint32(rng.UID), Count: proto.Uint32(userns.Size)}}
	gmaps := []*criuuserns.UidGidExtent{{First: proto.Uint32(0), LowerFirst: proto.Uint32(rng.GID), Count: proto.Uint32(userns.Size)}}
	for _, name := range usernsImages {
		e := &criuuserns.UsernsEntry{UidMap: maps, GidMap: gmaps}
		if err := writeSingleEntry(filepath.Join(dst, name), magic.LoadMagic().ByName["USERNS"], e); err != nil {
			return err
		}
	}
	return nil
}

// checkImagesLayout checks that a dump's processes run in network and user
// namespaces as this host's sandboxes do: a network namespace of their own
// (not one joined by path, as sandboxes before their network hook ran in),
// and a user namespace of their own exactly when the host gives sandboxes
// one (CRIU recreates one from the images whatever the spec says, with the
// mappings the images hold). It returns the userns images.
func checkImagesLayout(dir string, wantUserns bool) ([]string, error) {
	own, err := imagesOwnUserns(dir)
	if err != nil {
		return nil, err
	}
	switch {
	case wantUserns && !own:
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "CHECKPOINT_WITHOUT_USER_NAMESPACE",
			"its processes were dumped in the host's user namespace, and this host runs sandboxes in user namespaces of their own: take the checkpoint again, or fork it at the disk tier")
	case !wantUserns && own:
		return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "CHECKPOINT_USER_NAMESPACE",
			"its processes were dumped in a user namespace, and this host runs sandboxes in its own (userns.enabled is false): fork it at the disk tier")
	}
	nets, err := filepath.Glob(filepath.Join(dir, "netns-*.img"))
	if err != nil {
		return nil, err
	}
	for _, p := range nets {
		var ns criunetdev.NetnsEntry
		if err := readSingleEntry(p, magic.LoadMagic().ByName["NETNS"], &ns); err != nil {
			return nil, err
		}
		if ns.ExtKey != nil {
			return nil, errdefs.WithReason(errdefs.ErrFailedPrecondition, "CHECKPOINT_NETWORK_LAYOUT",
				"its processes were dumped in a network namespace controld made (before sandboxes' namespaces were their own): take the checkpoint again, or fork it at the disk tier")
		}
	}
	usernsImages, err := filepath.Glob(filepath.Join(dir, "userns-*.img"))
	if err != nil {
		return nil, err
	}
	if own && len(usernsImages) != 1 {
		return nil, policyErr("%d user namespace images", len(usernsImages))
	}
	for i, p := range usernsImages {
		usernsImages[i] = filepath.Base(p)
	}
	return usernsImages, nil
}

// imagesOwnUserns reports whether CRIU will restore a dump's processes in a
// user namespace of their own: their first task's is not the one CRIU ran
// in when it dumped them (inventory's root ids), which is how CRIU decides.
func imagesOwnUserns(dir string) (bool, error) {
	read := func(name, kind string, m proto.Message) error {
		err := readSingleEntry(filepath.Join(dir, name), magic.LoadMagic().ByName[kind], m)
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: the CRIU images in %s have no %s", errdefs.ErrFailedPrecondition, dir, name)
		}
		return err
	}
	var inv criuinventory.InventoryEntry
	if err := read("inventory.img", "INVENTORY", &inv); err != nil {
		return false, err
	}
	var root criupstree.PstreeEntry
	if err := read("pstree.img", "PSTREE", &root); err != nil {
		return false, err
	}
	var ids criucore.TaskKobjIdsEntry
	path := "ids-" + strconv.FormatUint(uint64(root.GetPid()), 10) + ".img"
	if err := read(path, "IDS", &ids); err != nil {
		return false, err
	}
	if inv.GetRootIds().UserNsId == nil || ids.UserNsId == nil {
		return false, policyErr("%s: no user namespace id", path)
	}
	return ids.GetUserNsId() != inv.GetRootIds().GetUserNsId(), nil
}

// writeSingleEntry writes a CRIU image of one entry (readSingleEntry's
// format).
func writeSingleEntry(path string, imageMagic uint64, m proto.Message) error {
	b, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	buf := binary.LittleEndian.AppendUint32(nil, uint32(magic.LoadMagic().ByName["IMG_COMMON"]))
	buf = binary.LittleEndian.AppendUint32(buf, uint32(imageMagic))
	buf = binary.LittleEndian.AppendUint32(buf, uint32(len(b)))
	buf = append(buf, b...)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(buf); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o644); err != nil { // whatever the umask
		f.Close()
		return err
	}
	return f.Close()
}

// removeForkImages removes a fork's image directory, if it has one (a
// fork's container names its checkpoint).
func (r *Runtime) removeForkImages(id string, labels map[string]string) error {
	dir := labels[labelCheckpoint]
	if dir == "" || r.validateCheckpointDir("checkpoint", dir) != nil {
		return nil
	}
	if err := os.RemoveAll(forkImagesDir(dir, id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("fork images: %w", err)
	}
	return nil
}
