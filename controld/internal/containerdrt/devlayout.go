package containerdrt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// A sandbox's /dev is a tmpfs, which CRIU tars at every dump and untars at
// every restore (tar and gzip: two program starts, about 5 ms of a
// replica's CPU). A checkpoint whose /dev holds only what runc made there
// (devTemplate) and an empty /dev/shm has it dumped as an external mount
// instead (dev layout "bind"): nothing is tarred, and each replica's
// restore binds a tmpfs controld made for it, with the same entries made
// from the template (devDir; released once the replica's task started).
// Anything else in /dev (a file in /dev/shm, a link, a fifo, a changed
// mode, another mount) keeps CRIU's tar. The host reads nothing of the
// sandbox's /dev but the names, types, modes, owners and link targets of
// at most len(devTemplate)+1 entries, never follows a link, and copies
// nothing from it: what a replica's /dev holds comes from the template.
// docs/security.md, "A replica's /dev".
const devLayoutBind = "bind"

// devEntry is one entry runc makes in a sandbox's /dev (user namespaces:
// the device nodes are binds of the host's, over empty files).
type devEntry struct {
	name     string
	typ      uint32 // S_IFDIR, S_IFLNK or S_IFCHR (a bound device node)
	perm     uint32 // dirs: the mode's permission bits as the sandbox sees them
	mkPerm   uint32 // dirs: those of the directory made (a mount point: runc's)
	target   string // links
	rdev     uint64 // device nodes: the host's device
	optional bool
}

var devTemplate = []devEntry{
	// pts and mqueue: mount points (checkDevEntry).
	{name: "pts", typ: unix.S_IFDIR, mkPerm: 0o755},
	{name: "mqueue", typ: unix.S_IFDIR, mkPerm: 0o755},
	{name: "shm", typ: unix.S_IFDIR, perm: 0o1777, mkPerm: 0o1777, optional: true}, // guestd's, empty
	{name: "fd", typ: unix.S_IFLNK, target: "/proc/self/fd"},
	{name: "stdin", typ: unix.S_IFLNK, target: "/proc/self/fd/0"},
	{name: "stdout", typ: unix.S_IFLNK, target: "/proc/self/fd/1"},
	{name: "stderr", typ: unix.S_IFLNK, target: "/proc/self/fd/2"},
	{name: "ptmx", typ: unix.S_IFLNK, target: "pts/ptmx"},
	{name: "core", typ: unix.S_IFLNK, target: "/proc/kcore", optional: true},
	{name: "null", typ: unix.S_IFCHR, rdev: unix.Mkdev(1, 3)},
	{name: "zero", typ: unix.S_IFCHR, rdev: unix.Mkdev(1, 5)},
	{name: "full", typ: unix.S_IFCHR, rdev: unix.Mkdev(1, 7)},
	{name: "random", typ: unix.S_IFCHR, rdev: unix.Mkdev(1, 8)},
	{name: "urandom", typ: unix.S_IFCHR, rdev: unix.Mkdev(1, 9)},
	{name: "tty", typ: unix.S_IFCHR, rdev: unix.Mkdev(5, 0)},
}

func devTemplateEntry(name string) (devEntry, bool) {
	i := slices.IndexFunc(devTemplate, func(e devEntry) bool { return e.name == name })
	if i < 0 {
		return devEntry{}, false
	}
	return devTemplate[i], true
}

// checkDevEntries refuses a dev layout's entry list that is not a set of
// the template's names holding every required one (checkpoint.json of an
// imported checkpoint is the importer's).
func checkDevEntries(layout string, names []string) error {
	switch layout {
	case "":
		if len(names) > 0 {
			return fmt.Errorf("dev entries without the dev layout: %w", errdefs.ErrFailedPrecondition)
		}
		return nil
	case devLayoutBind:
	default:
		return fmt.Errorf("dev layout %q: %w", layout, errdefs.ErrFailedPrecondition)
	}
	seen := map[string]bool{}
	for _, n := range names {
		if _, ok := devTemplateEntry(n); !ok || seen[n] {
			return fmt.Errorf("dev entry %q: %w", n, errdefs.ErrFailedPrecondition)
		}
		seen[n] = true
	}
	for _, e := range devTemplate {
		if !e.optional && !seen[e.name] {
			return fmt.Errorf("dev entries lack %q: %w", e.name, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

// seesMountsOf says controld shares the mount namespace of the frozen
// sandbox's shim (its init's parent), in which runc and CRIU run: a
// replica's /dev that controld mounts is seen by them only then. A unit
// with PrivateMounts=yes does not: its checkpoints keep CRIU's tar. The
// parent is read from /proc/<init>/stat, which the sandbox cannot shape
// (the kernel writes it; comm is skipped up to its last parenthesis).
func seesMountsOf(pid uint32) bool {
	ppid, err := statPPID(strconv.FormatUint(uint64(pid), 10))
	if err != nil {
		return false
	}
	var self, shim unix.Stat_t
	if unix.Stat("/proc/self/ns/mnt", &self) != nil || unix.Stat("/proc/"+strconv.Itoa(ppid)+"/ns/mnt", &shim) != nil {
		return false
	}
	return self.Dev == shim.Dev && self.Ino == shim.Ino
}

// statPPID reads pid's parent from /proc/<pid>/stat: "pid (comm) state
// ppid ...", where comm may hold spaces and parentheses.
func statPPID(pid string) (int, error) {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%s/stat: no comm", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, fmt.Errorf("/proc/%s/stat: short", pid)
	}
	return strconv.Atoi(f[1])
}

// errDevNotTemplate says a sandbox's /dev is not the template's: CRIU
// tars it.
var errDevNotTemplate = errors.New("/dev is not runc's")

// standardDev returns the names in the /dev of the frozen sandbox whose
// init is pid when it is the template's (errDevNotTemplate otherwise): a
// tmpfs mounted there, owned by the sandbox's root in a user namespace of
// its own, holding only template entries with the template's types, modes,
// owners and targets, and an empty shm. Nothing is followed: /dev is
// reached inside the sandbox's root without links, and its entries are
// read with lstat and readlink.
func standardDev(pid uint32) ([]string, error) {
	if !seesMountsOf(pid) {
		return nil, fmt.Errorf("%w: controld runs in a mount namespace of its own: runc would not see a replica's /dev", errDevNotTemplate)
	}
	p := "/proc/" + strconv.FormatUint(uint64(pid), 10)
	uid, err := sandboxRoot(p + "/uid_map")
	if err != nil {
		return nil, err
	}
	gid, err := sandboxRoot(p + "/gid_map")
	if err != nil {
		return nil, err
	}
	root, err := unix.Open(p+"/root", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(root)
	fd, err := unix.Openat2(root, "dev", &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errDevNotTemplate, err)
	}
	dir := os.NewFile(uintptr(fd), "dev")
	defer dir.Close()
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return nil, err
	}
	var stx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_MODE|unix.STATX_UID|unix.STATX_GID, &stx); err != nil {
		return nil, err
	}
	switch {
	case sfs.Type != unix.TMPFS_MAGIC:
		return nil, fmt.Errorf("%w: not a tmpfs", errDevNotTemplate)
	case stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0 || stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT == 0:
		return nil, fmt.Errorf("%w: not a mount's root", errDevNotTemplate)
	case stx.Mode&0o7777 != 0o755 || stx.Uid != uid || stx.Gid != gid:
		return nil, fmt.Errorf("%w: mode %o, owner %d:%d", errDevNotTemplate, stx.Mode, stx.Uid, stx.Gid)
	}
	// At most one entry more than the template has: more says enough.
	names, err := dir.Readdirnames(len(devTemplate) + 1)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	if len(names) > len(devTemplate) {
		return nil, fmt.Errorf("%w: more than %d entries", errDevNotTemplate, len(devTemplate))
	}
	for _, n := range names {
		e, ok := devTemplateEntry(n)
		if !ok {
			return nil, fmt.Errorf("%w: %q", errDevNotTemplate, n)
		}
		if err := checkDevEntry(fd, e, uid, gid); err != nil {
			return nil, err
		}
	}
	if err := checkDevEntries(devLayoutBind, names); err != nil {
		return nil, fmt.Errorf("%w: %w", errDevNotTemplate, err)
	}
	slices.Sort(names)
	return names, nil
}

// checkDevEntry checks one entry of /dev (dirfd) against its template.
func checkDevEntry(dirfd int, e devEntry, uid, gid uint32) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, e.name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("%w: %s: %w", errDevNotTemplate, e.name, err)
	}
	bad := func(what string) error { return fmt.Errorf("%w: %s: %s", errDevNotTemplate, e.name, what) }
	if st.Mode&unix.S_IFMT != e.typ {
		return bad(fmt.Sprintf("type %o", st.Mode&unix.S_IFMT))
	}
	switch e.typ {
	case unix.S_IFCHR:
		// The host's node, bound over runc's empty file.
		if st.Rdev != e.rdev {
			return bad("another device")
		}
		return nil
	case unix.S_IFDIR:
		if e.name == "pts" || e.name == "mqueue" {
			// Mount points, seen as the root of what runc mounted there
			// (whose owner and mode are that filesystem's): what is mounted
			// is dumped as a mount, what it hides is runc's directory.
			var stx unix.Statx_t
			if err := unix.Statx(dirfd, e.name, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_TYPE, &stx); err != nil {
				return bad(err.Error())
			}
			if stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0 || stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT == 0 {
				return bad("not a mount point")
			}
			return nil
		}
		if st.Mode&0o7777 != e.perm {
			return bad(fmt.Sprintf("mode %o", st.Mode&0o7777))
		}
	}
	if st.Uid != uid || st.Gid != gid {
		return bad(fmt.Sprintf("owner %d:%d", st.Uid, st.Gid))
	}
	switch e.name {
	case "shm":
		// Empty, and no mount: one name read says it is not.
		fd, err := unix.Openat2(dirfd, e.name, &unix.OpenHow{
			Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_XDEV,
		})
		if err != nil {
			return bad(err.Error())
		}
		d := os.NewFile(uintptr(fd), e.name)
		defer d.Close()
		if names, _ := d.Readdirnames(1); len(names) > 0 {
			return bad("not empty")
		}
	}
	if e.typ == unix.S_IFLNK {
		buf := make([]byte, len(e.target)+1)
		n, err := unix.Readlinkat(dirfd, e.name, buf)
		if err != nil || string(buf[:n]) != e.target {
			return bad("another target")
		}
	}
	return nil
}

// sandboxRoot reads the host id of the sandbox's id 0 from a uid_map or
// gid_map; a sandbox without a user namespace of its own (identity map)
// keeps CRIU's tar: its device nodes are nodes in /dev, not binds.
func sandboxRoot(path string) (uint32, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l)
		if len(f) != 3 || f[0] != "0" {
			continue
		}
		host, err := strconv.ParseUint(f[1], 10, 32)
		if err != nil {
			return 0, err
		}
		if host == 0 {
			return 0, fmt.Errorf("%w: no user namespace", errDevNotTemplate)
		}
		return uint32(host), nil
	}
	return 0, fmt.Errorf("%w: %s maps no root", errDevNotTemplate, path)
}

// devDir is the mount point of replica id's /dev, which its restore binds
// (the container's spec names it): <DevDir>/<id>/dev, where <id> is owned
// by the replica's root with mode 0700, so that its restore's CRIU (the
// replica's root by then) reaches it and no other user of the host does.
func (r *Runtime) devDir(id string) string {
	return filepath.Join(r.cfg.DevDir, id, "dev")
}

// prepareDev makes replica id's /dev: a tmpfs with the options runc gives
// a sandbox's, owned by the replica's root (uid, gid on the host), holding
// the template's entries among names. Only controld writes into it before
// the restore, and it is unmounted from the host (releaseDev) once the
// replica's task started.
func (r *Runtime) prepareDev(id string, names []string, uid, gid uint32) (retErr error) {
	if err := checkDevEntries(devLayoutBind, names); err != nil {
		return err
	}
	if err := r.releaseDev(id); err != nil { // an earlier sandbox's of the id
		return err
	}
	dir := r.devDir(id)
	top := filepath.Dir(dir)
	if err := os.Mkdir(top, 0o700); err != nil {
		return fmt.Errorf("replica /dev: %w: %w", errdefs.ErrInternal, err)
	}
	defer func() {
		if retErr != nil {
			r.releaseDev(id)
		}
	}()
	for _, step := range []func() error{
		func() error { return os.Chmod(top, 0o700) },
		func() error { return os.Mkdir(dir, 0o700) },
		func() error { return os.Lchown(top, int(uid), int(gid)) },
	} {
		if err := step(); err != nil {
			return fmt.Errorf("replica /dev: %w: %w", errdefs.ErrInternal, err)
		}
	}
	// The flags of runc's /dev (CRIU sets the dumped mount's on the bind,
	// and could not clear a nodev set here). No device node can appear in
	// it: making one takes CAP_MKNOD in the host's user namespace, which no
	// process of a sandbox has, and a link cannot cross filesystems.
	data := fmt.Sprintf("mode=755,size=%d,uid=%d,gid=%d", r.cfg.DevShmBytes, uid, gid)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_STRICTATIME, data); err != nil {
		return fmt.Errorf("replica /dev: mount: %w: %w", errdefs.ErrInternal, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("replica /dev: %w: %w", errdefs.ErrInternal, err)
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("replica /dev: %w: %w", errdefs.ErrInternal, err)
	}
	defer unix.Close(fd)
	for _, n := range names {
		e, _ := devTemplateEntry(n)
		if err := makeDevEntry(fd, e, uid, gid); err != nil {
			return fmt.Errorf("replica /dev: %s: %w: %w", n, errdefs.ErrInternal, err)
		}
	}
	return nil
}

func makeDevEntry(dirfd int, e devEntry, uid, gid uint32) error {
	switch e.typ {
	case unix.S_IFDIR:
		if err := unix.Mkdirat(dirfd, e.name, 0o700); err != nil {
			return err
		}
		if err := unix.Fchownat(dirfd, e.name, int(uid), int(gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		return unix.Fchmodat(dirfd, e.name, e.mkPerm, 0)
	case unix.S_IFLNK:
		if err := unix.Symlinkat(e.target, dirfd, e.name); err != nil {
			return err
		}
		return unix.Fchownat(dirfd, e.name, int(uid), int(gid), unix.AT_SYMLINK_NOFOLLOW)
	default:
		// runc's empty file under the bound device node.
		f, err := unix.Openat(dirfd, e.name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
		if err != nil {
			return err
		}
		defer unix.Close(f)
		if err := unix.Fchmod(f, 0o644); err != nil { // controld's umask is 0077
			return err
		}
		return unix.Fchown(f, int(uid), int(gid))
	}
}

// releaseDev unmounts replica id's /dev from the host (the replica's bind
// keeps it) and removes its directories. Nothing is followed: the mount
// point is the host's own directory, in one only root and the replica's
// root can search, and the replica never sees it.
func (r *Runtime) releaseDev(id string) error {
	dir := r.devDir(id)
	for {
		err := unix.Unmount(dir, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			break // not a mount point (any more), or no directory
		}
		if err != nil {
			return fmt.Errorf("replica /dev: unmount: %w: %w", errdefs.ErrInternal, err)
		}
	}
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Remove(d); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("replica /dev: %w: %w", errdefs.ErrInternal, err)
		}
	}
	return nil
}

// releaseDevs releases the /dev of the sandboxes in ids left by a
// controld that stopped (the dev dir may be shared: only these are ours).
func (r *Runtime) releaseDevs(ids map[string]bool) error {
	entries, err := os.ReadDir(r.cfg.DevDir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	var errs []error
	for _, e := range entries {
		if ids[e.Name()] {
			errs = append(errs, r.releaseDev(e.Name()))
		}
	}
	return errors.Join(errs...)
}

// withDevBind has the replica's /dev bound from src (its restore binds it
// into the replica's mount namespace as the checkpoint's external /dev).
func withDevBind(src string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		i := slices.IndexFunc(s.Mounts, func(m specs.Mount) bool { return m.Destination == "/dev" })
		if i < 0 {
			return fmt.Errorf("no /dev mount: %w", errdefs.ErrInternal)
		}
		s.Mounts[i] = specs.Mount{Destination: "/dev", Type: "bind", Source: src,
			Options: []string{"rbind", "nosuid"}}
		return nil
	}
}

// specDevBind says the spec (runc's state config) binds /dev.
func specDevBind(st *runcState) bool {
	for _, m := range st.Config.Mounts {
		if m.Device == "bind" && strings.TrimPrefix(m.Destination, st.Config.Rootfs) == "/dev" {
			return true
		}
	}
	return false
}
