//go:build linux

package containerdrt

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// racyWindow: a file whose ctime is this close to (or after) the start of
// the first pass may have changed again within the same timestamp tick, so
// the second pass copies it again regardless of its stat. Kernel file times
// advance in coarse ticks (up to 10 ms).
const racyWindow = 50 * time.Millisecond

// layerCopier mirrors an overlay upperdir (src) into another snapshot's
// empty upperdir (dst): a first pass while the sandbox runs, a second pass
// while it is frozen that copies only what changed since. Whiteouts
// (0/0 character devices), opaque directories (trusted.overlay.* xattrs),
// hard links, ownership, modes and times are kept. Unix socket files are
// skipped: they are not content, and CRIU binds restored listeners anew.
type layerCopier struct {
	src, dst string
	seen     map[string]entryStat // relative path -> source stat when copied
	links    map[inode]string     // source inode -> relative path in dst
	start    time.Time            // when the first pass began
	buf      []byte
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
		src:   src,
		dst:   dst,
		seen:  map[string]entryStat{},
		links: map[inode]string{},
		buf:   make([]byte, 256<<10),
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

func (lc *layerCopier) walk(ctx context.Context, second bool) error {
	visited := make(map[string]bool, len(lc.seen))
	var dirs []string
	racy := unix.NsecToTimespec(lc.start.Add(-racyWindow).UnixNano())
	err := filepath.WalkDir(lc.src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			// Entries may vanish while the sandbox runs (first pass); the
			// second pass runs frozen and sees the final state.
			if !second && errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		rel, err := filepath.Rel(lc.src, path)
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(path, &st); err != nil {
			if !second && errors.Is(err, unix.ENOENT) {
				return nil
			}
			return fmt.Errorf("lstat %s: %w", path, err)
		}
		visited[rel] = true
		cur := statOf(&st)
		typ := st.Mode & unix.S_IFMT
		if typ == unix.S_IFDIR {
			dirs = append(dirs, rel)
		}
		if second {
			prev, ok := lc.seen[rel]
			if ok && prev == cur && timespecBefore(cur.ctime, racy) {
				return nil
			}
			if ok && prev.mode&unix.S_IFMT != typ {
				if err := os.RemoveAll(filepath.Join(lc.dst, rel)); err != nil {
					return err
				}
				delete(lc.seen, rel)
			}
		}
		if err := lc.copyEntry(rel, path, &st, second); err != nil {
			if !second && errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return fmt.Errorf("copy %s: %w", rel, err)
		}
		lc.seen[rel] = cur
		return nil
	})
	if err != nil {
		return err
	}
	if !second {
		return nil
	}
	// Remove what disappeared, parents before children (RemoveAll takes the
	// children with them).
	var gone []string
	for rel := range lc.seen {
		if !visited[rel] {
			gone = append(gone, rel)
		}
	}
	slices.Sort(gone)
	for _, rel := range gone {
		if err := os.RemoveAll(filepath.Join(lc.dst, rel)); err != nil {
			return fmt.Errorf("remove %s: %w", rel, err)
		}
		delete(lc.seen, rel)
	}
	for inoKey, rel := range lc.links {
		if _, ok := lc.seen[rel]; !ok {
			delete(lc.links, inoKey)
		}
	}
	// Directory times last: creating entries changed them. Deepest first.
	slices.SortFunc(dirs, func(a, b string) int {
		return strings.Count(b, "/") - strings.Count(a, "/")
	})
	for _, rel := range dirs {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(lc.src, rel), &st); err != nil {
			return err
		}
		if err := setTimes(filepath.Join(lc.dst, rel), &st); err != nil {
			return err
		}
	}
	return nil
}

func timespecBefore(a, b unix.Timespec) bool {
	return a.Sec < b.Sec || (a.Sec == b.Sec && a.Nsec < b.Nsec)
}

func (lc *layerCopier) copyEntry(rel, src string, st *unix.Stat_t, second bool) error {
	dst := filepath.Join(lc.dst, rel)
	typ := st.Mode & unix.S_IFMT
	if typ == unix.S_IFSOCK {
		return nil
	}
	if typ == unix.S_IFDIR {
		if err := unix.Mkdir(dst, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return err
		}
		return copyMeta(src, dst, st)
	}
	if rel == "." {
		return fmt.Errorf("upperdir root is not a directory")
	}
	// Replace whatever the destination holds.
	if err := unix.Unlink(dst); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	key := inode{dev: st.Dev, ino: st.Ino}
	if typ != unix.S_IFDIR && st.Nlink > 1 {
		if first, ok := lc.links[key]; ok && first != rel {
			if _, still := lc.seen[first]; still || !second {
				if err := unix.Link(filepath.Join(lc.dst, first), dst); err == nil {
					return nil
				}
			}
		}
		lc.links[key] = rel
	}
	switch typ {
	case unix.S_IFREG:
		if err := lc.copyFile(src, dst); err != nil {
			return err
		}
	case unix.S_IFLNK:
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := unix.Symlink(target, dst); err != nil {
			return err
		}
	case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO:
		if err := unix.Mknod(dst, st.Mode, int(st.Rdev)); err != nil {
			return err
		}
	default:
		return fmt.Errorf("unsupported file type %o", typ)
	}
	if err := copyMeta(src, dst, st); err != nil {
		return err
	}
	return setTimes(dst, st)
}

// copyFile copies content; io.Copy between files uses copy_file_range, so
// the data stays in the kernel.
func (lc *layerCopier) copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.CopyBuffer(out, in, lc.buf); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// copyMeta copies owner, xattrs (overlay's opaque/redirect markers, file
// capabilities) and permission bits. chown clears setuid bits and file
// capabilities, so it goes first.
func copyMeta(src, dst string, st *unix.Stat_t) error {
	if err := unix.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if err := copyXattrs(src, dst); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
			return err
		}
	}
	return nil
}

func copyXattrs(src, dst string) error {
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
		if err := unix.Lsetxattr(dst, name, val, 0); err != nil {
			return fmt.Errorf("set xattr %s: %w", name, err)
		}
	}
	have, err := listXattrs(dst)
	if err != nil {
		return err
	}
	for _, name := range have {
		if !want[name] {
			if err := unix.Lremovexattr(dst, name); err != nil && !errors.Is(err, unix.ENODATA) {
				return fmt.Errorf("remove xattr %s: %w", name, err)
			}
		}
	}
	return nil
}

func listXattrs(path string) ([]string, error) {
	buf := make([]byte, 1024)
	for {
		n, err := unix.Llistxattr(path, buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("list xattrs of %s: %w", path, err)
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

func getXattr(path, name string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Lgetxattr(path, name, buf)
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

func setTimes(path string, st *unix.Stat_t) error {
	ts := []unix.Timespec{st.Atim, st.Mtim}
	return unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, unix.AT_SYMLINK_NOFOLLOW)
}
