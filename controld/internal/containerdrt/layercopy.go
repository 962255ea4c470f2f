//go:build linux

package containerdrt

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/userns"
)

// racyWindow: a file whose ctime is this close to (or after) the start of
// the first pass may have changed again within the same timestamp tick, so
// the second pass copies it again regardless of its stat. Kernel file times
// advance in coarse ticks (up to 10 ms).
const racyWindow = 50 * time.Millisecond

// maxLayerDepth bounds directory nesting in a writable layer: the copier
// holds two descriptors per level, and a sandbox must not be able to make
// controld run out of them.
const maxLayerDepth = 1024

// layerCopier mirrors an overlay upperdir (src) into another snapshot's
// empty upperdir (dst): a first pass while the sandbox runs, a second pass
// while it is frozen that copies only what changed since. Whiteouts
// (0/0 character devices), opaque directories (trusted.overlay.* xattrs),
// hard links, ownership, modes and times are kept. Unix socket files are
// skipped: they are not content, and CRIU binds restored listeners anew.
//
// src belongs to a running, hostile sandbox: while the first pass runs it
// can swap any directory for a symlink to a host directory (renameat2
// RENAME_EXCHANGE), and a copier that resolved paths would then copy host
// files into the layer, or delete host files through symlinks it copied.
// So nothing is ever resolved by path on either side: the walk holds a
// directory descriptor per level and reaches each entry with *at calls
// relative to it, opens with O_NOFOLLOW (a symlink is never followed, only
// copied as a link), and checks with fstat that what it opened is what it
// listed. An entry that changed in between is left to the second pass,
// which runs frozen and sees the final state. dst is the runtime's own, and
// is reached the same way, so a symlink copied there is never followed
// either.
type layerCopier struct {
	src, dst string
	seen     map[string]entryStat // relative path -> source stat when copied
	children map[string][]string  // relative dir path -> names recorded in seen
	links    map[inode]string     // source inode -> relative path in dst
	start    time.Time            // when the first pass began
	buf      []byte
	// owner, when set, is the range of the sandbox whose layer is copied:
	// its writable layer holds host ids, a committed layer the sandbox's
	// own (as image layers do), which every fork mounts idmapped with its
	// own range.
	owner *userns.Range

	second bool
	racy   unix.Timespec
	dstTop int // dst's root directory while walking
}

type inode struct{ dev, ino uint64 }

type entryStat struct {
	mode  uint32
	ino   uint64
	size  int64
	mtime unix.Timespec
	ctime unix.Timespec
}

func statOf(st *unix.Stat_t) entryStat {
	return entryStat{mode: st.Mode, ino: st.Ino, size: st.Size, mtime: st.Mtim, ctime: st.Ctim}
}

func newLayerCopier(src, dst string) *layerCopier {
	return &layerCopier{
		src:      src,
		dst:      dst,
		seen:     map[string]entryStat{},
		children: map[string][]string{},
		links:    map[inode]string{},
		buf:      make([]byte, 256<<10),
	}
}

// Bytes is the size of the regular files copied (the layer's content).
func (lc *layerCopier) Bytes() int64 {
	var n int64
	counted := map[uint64]bool{} // hard links count once
	for _, st := range lc.seen {
		if st.mode&unix.S_IFMT == unix.S_IFREG && !counted[st.ino] {
			counted[st.ino] = true
			n += st.size
		}
	}
	return n
}

// First copies everything (the sandbox may be running).
func (lc *layerCopier) First(ctx context.Context) error {
	lc.start = time.Now()
	return lc.walk(ctx, false)
}

// Sync copies what changed since First and removes what disappeared. The
// sandbox is frozen, so the result is consistent with its processes.
func (lc *layerCopier) Sync(ctx context.Context) error {
	return lc.walk(ctx, true)
}

// dirNode is one directory level of the walk.
type dirNode struct {
	rel   string // relative to the layer root ("." for the root)
	src   int    // the source directory, opened O_NOFOLLOW
	dst   int    // the copy, opened on demand (-1)
	dirty bool   // the copy's entries or metadata changed: set its times after its entries
}

const openDir = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC

func (lc *layerCopier) walk(ctx context.Context, second bool) error {
	lc.second = second
	lc.racy = unix.NsecToTimespec(lc.start.Add(-racyWindow).UnixNano())
	src, err := unix.Open(lc.src, openDir, 0)
	if err != nil {
		return fmt.Errorf("open upperdir %s: %w", lc.src, err)
	}
	defer unix.Close(src)
	dst, err := unix.Open(lc.dst, openDir, 0)
	if err != nil {
		return fmt.Errorf("open copy %s: %w", lc.dst, err)
	}
	defer unix.Close(dst)
	lc.dstTop = dst
	defer func() { lc.dstTop = -1 }()

	var st unix.Stat_t
	if err := unix.Fstat(src, &st); err != nil {
		return err
	}
	root := &dirNode{rel: ".", src: src, dst: dst}
	cur := statOf(&st)
	if prev, ok := lc.seen["."]; !second || !ok || prev != cur || !timespecBefore(cur.ctime, lc.racy) {
		if err := lc.copyMetaFd(src, dst, &st); err != nil {
			return fmt.Errorf("copy .: %w", err)
		}
		root.dirty = true
	}
	lc.seen["."] = cur
	if err := lc.copyDir(ctx, root, 0); err != nil {
		return err
	}
	if root.dirty {
		if err := setTimesFd(dst, &st); err != nil {
			return err
		}
	}
	if second {
		for k, rel := range lc.links {
			if _, ok := lc.seen[rel]; !ok {
				delete(lc.links, k)
			}
		}
	}
	return nil
}

// raced reports whether err on the first pass means the entry changed
// under the walk (it is left to the second pass, which runs frozen).
func (lc *layerCopier) raced(err error) bool {
	if lc.second {
		return false
	}
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) ||
		errors.Is(err, unix.EINVAL) || errors.Is(err, errEntryChanged)
}

var errEntryChanged = errors.New("entry changed while being copied")

// copyError names the entry a copy failed on.
type copyError struct {
	rel string
	err error
}

func (e *copyError) Error() string { return "copy " + e.rel + ": " + e.err.Error() }
func (e *copyError) Unwrap() error { return e.err }

func (lc *layerCopier) copyDir(ctx context.Context, d *dirNode, depth int) error {
	if depth > maxLayerDepth {
		return &copyError{rel: d.rel[:min(len(d.rel), 64)] + "...", err: fmt.Errorf("%w: the writable layer nests directories deeper than %d", errdefs.ErrFailedPrecondition, maxLayerDepth)}
	}
	names, err := readDirNames(d.src)
	if err != nil {
		return fmt.Errorf("list %s: %w", d.rel, err)
	}
	slices.Sort(names)
	recorded := make([]string, 0, len(names))
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		ok, err := lc.copyEntry(ctx, d, name, depth)
		if err != nil {
			var ce *copyError
			if errors.As(err, &ce) || errors.Is(err, ctx.Err()) {
				return err // named where it happened, once
			}
			return &copyError{rel: path.Join(d.rel, name), err: err}
		}
		if ok {
			recorded = append(recorded, name)
		}
	}
	if lc.second {
		// What the last pass recorded here and this one did not list is gone.
		for _, name := range lc.children[d.rel] {
			if _, still := slices.BinarySearch(names, name); still {
				continue
			}
			dfd, err := lc.dstDirOf(d)
			if err != nil {
				return err
			}
			if err := removeAt(dfd, name, 0); err != nil {
				return fmt.Errorf("remove %s: %w", path.Join(d.rel, name), err)
			}
			lc.forget(path.Join(d.rel, name))
			d.dirty = true
		}
	}
	lc.children[d.rel] = recorded
	return nil
}

// dstDirOf returns d's directory in the copy, opening it on first use:
// resolved from the copy's root following nothing (the copy holds the
// sandbox's symlinks).
func (lc *layerCopier) dstDirOf(d *dirNode) (int, error) {
	if d.dst >= 0 {
		return d.dst, nil
	}
	fd, err := unix.Openat2(lc.dstTop, d.rel, &unix.OpenHow{
		Flags:   openDir,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		return -1, fmt.Errorf("copy of %s: %w", d.rel, err)
	}
	d.dst = fd
	return fd, nil
}

// copyEntry copies one entry of d; ok reports that it is recorded in seen
// (copied, unchanged, or a socket).
func (lc *layerCopier) copyEntry(ctx context.Context, d *dirNode, name string, depth int) (ok bool, err error) {
	rel := path.Join(d.rel, name)
	var st unix.Stat_t
	if err := unix.Fstatat(d.src, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if lc.raced(err) {
			return false, nil
		}
		return false, err
	}
	typ := st.Mode & unix.S_IFMT
	prev, had := lc.seen[rel]
	if lc.second && had && prev.mode&unix.S_IFMT != typ {
		// Replaced by another kind of file: its copy (a whole tree, for a
		// directory) goes first.
		dfd, err := lc.dstDirOf(d)
		if err != nil {
			return false, err
		}
		if err := removeAt(dfd, name, 0); err != nil {
			return false, err
		}
		lc.forget(rel)
		had = false
		d.dirty = true
	}
	unchanged := func(cur entryStat) bool {
		return lc.second && had && prev == cur && timespecBefore(cur.ctime, lc.racy)
	}
	switch typ {
	case unix.S_IFDIR:
		return lc.copySubdir(ctx, d, name, rel, &st, had, unchanged, depth)
	case unix.S_IFSOCK:
		lc.seen[rel] = statOf(&st)
		return true, nil
	}
	if unchanged(statOf(&st)) {
		return true, nil
	}
	dfd, err := lc.dstDirOf(d)
	if err != nil {
		return false, err
	}
	// Replace whatever the copy holds.
	if err := removeAt(dfd, name, 0); err != nil {
		return false, err
	}
	d.dirty = true
	if typ != unix.S_IFDIR && st.Nlink > 1 {
		key := inode{dev: st.Dev, ino: st.Ino}
		if first, ok := lc.links[key]; ok && first != rel {
			if _, still := lc.seen[first]; still || !lc.second {
				if lc.linkCopy(first, dfd, name) == nil {
					lc.seen[rel] = statOf(&st)
					return true, nil
				}
			}
		}
		lc.links[key] = rel
	}
	switch typ {
	case unix.S_IFREG:
		err = lc.copyFile(d.src, dfd, name, &st)
	case unix.S_IFLNK:
		err = lc.copySymlink(d.src, dfd, name, &st)
	case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO:
		err = lc.copyNode(d.src, dfd, name, &st)
	default:
		return false, fmt.Errorf("unsupported file type %o", typ)
	}
	if err != nil {
		// A half-made copy is removed; the second pass makes it again.
		unix.Unlinkat(dfd, name, 0)
		if lc.raced(err) {
			return false, nil
		}
		return false, err
	}
	lc.seen[rel] = statOf(&st) // st: what was opened and copied
	return true, nil
}

// copySubdir copies a directory's metadata (unless unchanged) and then its
// entries, one level deeper.
func (lc *layerCopier) copySubdir(ctx context.Context, d *dirNode, name, rel string, listed *unix.Stat_t, had bool, unchanged func(entryStat) bool, depth int) (bool, error) {
	sfd, err := unix.Openat(d.src, name, openDir, 0)
	if err != nil {
		if lc.raced(err) {
			return false, nil
		}
		return false, err
	}
	child := &dirNode{rel: rel, src: sfd, dst: -1}
	defer func() {
		unix.Close(sfd)
		if child.dst >= 0 {
			unix.Close(child.dst)
		}
	}()
	var st unix.Stat_t
	if err := unix.Fstat(sfd, &st); err != nil {
		return false, err
	}
	if st.Dev != listed.Dev || st.Ino != listed.Ino {
		if lc.raced(errEntryChanged) {
			return false, nil
		}
		return false, errEntryChanged
	}
	cur := statOf(&st)
	if !unchanged(cur) {
		pfd, err := lc.dstDirOf(d)
		if err != nil {
			return false, err
		}
		if !had {
			// Nothing recorded here: whatever the copy holds is stale.
			if err := removeAt(pfd, name, 0); err != nil {
				return false, err
			}
		}
		if err := unix.Mkdirat(pfd, name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return false, err
		} else if err == nil {
			d.dirty = true
		}
		if child.dst, err = unix.Openat(pfd, name, openDir, 0); err != nil {
			return false, err
		}
		if err := lc.copyMetaFd(sfd, child.dst, &st); err != nil {
			return false, err
		}
		child.dirty = true
	}
	lc.seen[rel] = cur
	if err := lc.copyDir(ctx, child, depth+1); err != nil {
		return false, err
	}
	if child.dirty {
		// After its entries: creating them changed the copy's times.
		dfd, err := lc.dstDirOf(child)
		if err != nil {
			return false, err
		}
		if err := setTimesFd(dfd, &st); err != nil {
			return false, err
		}
	}
	return true, nil
}

// forget drops rel and everything below it from the copier's records.
func (lc *layerCopier) forget(rel string) {
	prefix := rel + "/"
	for k := range lc.seen {
		if k == rel || strings.HasPrefix(k, prefix) {
			delete(lc.seen, k)
		}
	}
	for k := range lc.children {
		if k == rel || strings.HasPrefix(k, prefix) {
			delete(lc.children, k)
		}
	}
}

// linkCopy hard-links the copy of first (a path in the copy) as name in
// dfd. first's directory is resolved below the copy's root following
// nothing: the copy may hold the sandbox's symlinks by now.
func (lc *layerCopier) linkCopy(first string, dfd int, name string) error {
	dir, base := path.Split(first)
	if dir == "" {
		dir = "."
	}
	pfd, err := unix.Openat2(lc.dstTop, dir, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	return unix.Linkat(pfd, base, dfd, name, 0)
}

// copyFile copies a regular file's content and metadata. The source is
// opened without following a link and without blocking (a FIFO swapped in
// would otherwise hang the walk), and must be the regular file listed.
// io.Copy between files uses copy_file_range: the data stays in the kernel.
func (lc *layerCopier) copyFile(sdir, ddir int, name string, st *unix.Stat_t) error {
	sfd, err := unix.Openat(sdir, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	in := os.NewFile(uintptr(sfd), name)
	defer in.Close()
	var got unix.Stat_t
	if err := unix.Fstat(sfd, &got); err != nil {
		return err
	}
	if got.Mode&unix.S_IFMT != unix.S_IFREG || got.Dev != st.Dev || got.Ino != st.Ino {
		return errEntryChanged
	}
	*st = got
	dfd, err := unix.Openat(ddir, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	out := os.NewFile(uintptr(dfd), name)
	defer out.Close()
	if err := lc.copyData(out, in); err != nil {
		return err
	}
	if err := lc.copyMetaFd(sfd, dfd, st); err != nil {
		return err
	}
	return setTimesFd(dfd, st)
}

// copyData copies in to out in the kernel. A sandbox with a disk quota
// writes its layer on another filesystem than the checkpoint's (btrfs and
// containerd's root), where copy_file_range fails with EXDEV and Go's copy
// falls back to 32 KiB reads and writes through user space: sendfile copies
// between any two files in the kernel (a 100 MB layer: its first copy
// about 10 ms slower than ext4 to ext4, 25 ms with the fallback).
// The source may grow while the sandbox runs: both copy to its end.
func (lc *layerCopier) copyData(out, in *os.File) error {
	const chunk = 1 << 30
	ofd, ifd := int(out.Fd()), int(in.Fd())
	sendfile := false
	for {
		var n int
		var err error
		if sendfile {
			n, err = unix.Sendfile(ofd, ifd, nil, chunk)
		} else {
			n, err = unix.CopyFileRange(ifd, nil, ofd, nil, chunk, 0)
			if err != nil && !sendfile && (errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EOPNOTSUPP) ||
				errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL)) {
				sendfile = true
				continue
			}
		}
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			if sendfile && (errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS)) {
				// Neither works on these files: user space it is.
				_, err = io.CopyBuffer(struct{ io.Writer }{out}, struct{ io.Reader }{in}, lc.buf)
			}
			return err
		}
		if n == 0 {
			return nil
		}
	}
}

// copySymlink copies a symlink as a symlink (its target is data: it is
// never resolved).
func (lc *layerCopier) copySymlink(sdir, ddir int, name string, st *unix.Stat_t) error {
	target, err := readlinkat(sdir, name)
	if err != nil {
		return err
	}
	if err := unix.Symlinkat(target, ddir, name); err != nil {
		return err
	}
	return lc.copyMetaAt(sdir, ddir, name, st)
}

// copyNode copies a device node or FIFO (overlay whiteouts are 0/0
// character devices); nothing is opened.
func (lc *layerCopier) copyNode(sdir, ddir int, name string, st *unix.Stat_t) error {
	if err := unix.Mknodat(ddir, name, st.Mode, int(st.Rdev)); err != nil {
		return err
	}
	return lc.copyMetaAt(sdir, ddir, name, st)
}

func readlinkat(dir int, name string) (string, error) {
	for n := 256; ; n *= 4 {
		buf := make([]byte, n)
		m, err := unix.Readlinkat(dir, name, buf)
		if err != nil {
			return "", err
		}
		if m < n {
			return string(buf[:m]), nil
		}
	}
}

// copyMetaFd copies owner, xattrs (overlay's opaque/redirect markers, file
// capabilities) and permission bits between open files. chown clears
// setuid bits and file capabilities, so it goes first.
func (lc *layerCopier) copyMetaFd(src, dst int, st *unix.Stat_t) error {
	uid, gid := lc.ownerOf(st)
	if err := unix.Fchown(dst, int(uid), int(gid)); err != nil {
		return err
	}
	if err := copyXattrs(fdXattrs{src}, fdXattrs{dst}, lc.xattrValue); err != nil {
		return err
	}
	return unix.Fchmod(dst, st.Mode&0o7777)
}

// copyMetaAt is copyMetaFd for entries that are not opened (symlinks,
// device nodes), named in open directories, followed by their times.
func (lc *layerCopier) copyMetaAt(sdir, ddir int, name string, st *unix.Stat_t) error {
	uid, gid := lc.ownerOf(st)
	if err := unix.Fchownat(ddir, name, int(uid), int(gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	if err := copyXattrs(atXattrs{sdir, name}, atXattrs{ddir, name}, lc.xattrValue); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		if err := unix.Fchmodat(ddir, name, st.Mode&0o7777, 0); err != nil {
			return err
		}
	}
	return unix.UtimesNanoAt(ddir, name, []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW)
}

// ownerOf is the owner a copied entry gets: the source's, in the
// sandbox's own ids when its layer holds host ids (owner).
func (lc *layerCopier) ownerOf(st *unix.Stat_t) (uint32, uint32) {
	if lc.owner == nil {
		return st.Uid, st.Gid
	}
	return lc.owner.SandboxIDs(st.Uid, st.Gid)
}

// xattrValue is the value an xattr is copied with. A namespaced file
// capability (version 3) names the host uid of the root it applies to: in
// the sandbox's own ids it applies to whichever root mounts the layer (the
// kernel stores root 0 as version 2).
func (lc *layerCopier) xattrValue(name string, val []byte) []byte {
	const capV3, capV3Size = 0x03000000, 24
	if lc.owner == nil || name != "security.capability" || len(val) != capV3Size ||
		binary.LittleEndian.Uint32(val)&0xff000000 != capV3 {
		return val
	}
	root, _ := lc.owner.SandboxIDs(binary.LittleEndian.Uint32(val[20:]), lc.owner.GID)
	out := slices.Clone(val)
	binary.LittleEndian.PutUint32(out[20:], root)
	return out
}

func setTimesFd(fd int, st *unix.Stat_t) error {
	return unix.UtimesNanoAt(fd, "", []unix.Timespec{st.Atim, st.Mtim}, unix.AT_EMPTY_PATH)
}

// xattrFile is where xattrs are read or written: an open file, or an entry
// of an open directory that is not followed.
type xattrFile interface {
	list(buf []byte) (int, error)
	get(name string, buf []byte) (int, error)
	set(name string, val []byte) error
	remove(name string) error
}

type fdXattrs struct{ fd int }

func (f fdXattrs) list(buf []byte) (int, error)             { return unix.Flistxattr(f.fd, buf) }
func (f fdXattrs) get(name string, buf []byte) (int, error) { return unix.Fgetxattr(f.fd, name, buf) }
func (f fdXattrs) set(name string, val []byte) error        { return unix.Fsetxattr(f.fd, name, val, 0) }
func (f fdXattrs) remove(name string) error                 { return unix.Fremovexattr(f.fd, name) }

// atXattrs names an entry through /proc/self/fd/<dir>/<name> with the l*
// calls: the directory is the one held open (its magic link resolves to
// it), and the entry itself is not followed.
type atXattrs struct {
	dir  int
	name string
}

func (a atXattrs) path() string {
	return "/proc/self/fd/" + strconv.Itoa(a.dir) + "/" + a.name
}
func (a atXattrs) list(buf []byte) (int, error) { return unix.Llistxattr(a.path(), buf) }
func (a atXattrs) get(name string, buf []byte) (int, error) {
	return unix.Lgetxattr(a.path(), name, buf)
}
func (a atXattrs) set(name string, val []byte) error { return unix.Lsetxattr(a.path(), name, val, 0) }
func (a atXattrs) remove(name string) error          { return unix.Lremovexattr(a.path(), name) }

// pathXattrs names a file by path, not followed at its last component: for
// trees no sandbox can change (export's committed layers).
type pathXattrs string

func (p pathXattrs) list(buf []byte) (int, error) { return unix.Llistxattr(string(p), buf) }
func (p pathXattrs) get(name string, buf []byte) (int, error) {
	return unix.Lgetxattr(string(p), name, buf)
}
func (p pathXattrs) set(name string, val []byte) error {
	return unix.Lsetxattr(string(p), name, val, 0)
}
func (p pathXattrs) remove(name string) error { return unix.Lremovexattr(string(p), name) }

func copyXattrs(src, dst xattrFile, value func(name string, val []byte) []byte) error {
	names, err := listXattrs(src)
	if err != nil {
		return err
	}
	want := map[string]bool{}
	for _, name := range names {
		want[name] = true
		val, err := getXattr(src, name)
		if err != nil {
			if errors.Is(err, unix.ENODATA) {
				continue
			}
			return fmt.Errorf("get xattr %s: %w", name, err)
		}
		if err := dst.set(name, value(name, val)); err != nil {
			return fmt.Errorf("set xattr %s: %w", name, err)
		}
	}
	have, err := listXattrs(dst)
	if err != nil {
		return err
	}
	for _, name := range have {
		if !want[name] {
			if err := dst.remove(name); err != nil && !errors.Is(err, unix.ENODATA) {
				return fmt.Errorf("remove xattr %s: %w", name, err)
			}
		}
	}
	return nil
}

func listXattrs(f xattrFile) ([]string, error) {
	buf := make([]byte, 1024)
	for {
		n, err := f.list(buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("list xattrs: %w", err)
		}
		var names []string
		for _, name := range strings.Split(string(buf[:n]), "\x00") {
			if name != "" {
				names = append(names, name)
			}
		}
		return names, nil
	}
}

func getXattr(f xattrFile, name string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := f.get(name, buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// readDirNames lists a directory through its descriptor (from offset 0:
// the descriptor is fresh).
func readDirNames(fd int) ([]string, error) {
	buf := make([]byte, 32<<10)
	var names []string
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return nil, err
		}
		if n <= 0 {
			return names, nil
		}
		_, _, names = unix.ParseDirent(buf[:n], -1, names)
	}
}

// removeAt removes name in dir, a whole tree for a directory, following
// nothing (dir is in the runtime's copy, whose symlinks are the
// sandbox's).
func removeAt(dir int, name string, depth int) error {
	err := unix.Unlinkat(dir, name, 0)
	if err == nil || errors.Is(err, unix.ENOENT) {
		return nil
	}
	if !errors.Is(err, unix.EISDIR) {
		return err
	}
	if depth > maxLayerDepth {
		return fmt.Errorf("%s: %w: nested deeper than %d", name, errdefs.ErrFailedPrecondition, maxLayerDepth)
	}
	sub, err := unix.Openat(dir, name, openDir, 0)
	if err != nil {
		return err
	}
	names, err := readDirNames(sub)
	if err == nil {
		for _, n := range names {
			if err = removeAt(sub, n, depth+1); err != nil {
				break
			}
		}
	}
	unix.Close(sub)
	if err != nil {
		return err
	}
	return unix.Unlinkat(dir, name, unix.AT_REMOVEDIR)
}

func timespecBefore(a, b unix.Timespec) bool {
	return a.Sec < b.Sec || (a.Sec == b.Sec && a.Nsec < b.Nsec)
}
