package ocilayout

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// ErrUnsupportedFile is returned for sockets, devices and other files a
// layer built by WriteTar does not carry.
var ErrUnsupportedFile = errors.New("ocilayout: unsupported file type")

// TarEntry maps a host path (a regular file, a symlink or a directory tree)
// to an absolute path inside the layer.
type TarEntry struct {
	Source string // host path
	Dest   string // path in the image, e.g. "/usr/local/bin/guestd"
}

// TarOptions fixes the metadata that would otherwise make digests depend on
// the build host and time.
type TarOptions struct {
	UID, GID int
	// ModTime of every entry. The zero value means the Unix epoch.
	ModTime time.Time
	// NoParents omits directory entries for the parents of each Dest.
	// By default they are written (0755, UID/GID) so the layer is complete
	// on its own.
	NoParents bool
}

// WriteTar writes a reproducible tar stream of entries to w: names sorted,
// ownership and mtime fixed by opts, no user/group names, no atime/ctime,
// permission bits kept (setuid/setgid/sticky too), hard links within a tree
// kept as links. The output depends only on file contents, modes, link
// targets and opts.
func WriteTar(ctx context.Context, w io.Writer, entries []TarEntry, opts TarOptions) error {
	mtime := opts.ModTime
	if mtime.IsZero() {
		mtime = time.Unix(0, 0)
	}
	mtime = mtime.UTC().Truncate(time.Second)

	type item struct {
		src, dest string // dest: clean, relative ("usr/local/bin/guestd")
	}
	var items []item
	seen := map[string]string{}
	for _, e := range entries {
		dest, err := cleanDest(e.Dest)
		if err != nil {
			return err
		}
		if e.Source == "" {
			return fmt.Errorf("ocilayout: tar entry %q has no source", e.Dest)
		}
		st, err := os.Lstat(e.Source)
		if err != nil {
			return fmt.Errorf("ocilayout: tar source: %w", err)
		}
		add := func(src, dst string) error {
			if prev, ok := seen[dst]; ok {
				return fmt.Errorf("ocilayout: %q added twice (from %s and %s)", "/"+dst, prev, src)
			}
			seen[dst] = src
			items = append(items, item{src, dst})
			return nil
		}
		if !st.IsDir() {
			if err := add(e.Source, dest); err != nil {
				return err
			}
			continue
		}
		err = filepath.WalkDir(e.Source, func(p string, _ fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(e.Source, p)
			if err != nil {
				return err
			}
			dst := dest
			if rel != "." {
				dst = path.Join(dest, filepath.ToSlash(rel))
			}
			if dst == "" { // the root directory itself maps to "/": no entry
				return nil
			}
			return add(p, dst)
		})
		if err != nil {
			return fmt.Errorf("ocilayout: walk %s: %w", e.Source, err)
		}
	}

	if !opts.NoParents {
		for _, it := range append([]item(nil), items...) {
			for d := path.Dir(it.dest); d != "." && d != "/"; d = path.Dir(d) {
				if _, ok := seen[d]; ok {
					continue
				}
				seen[d] = ""
				items = append(items, item{"", d})
			}
		}
	}
	sort.Slice(items, func(i, j int) bool { return items[i].dest < items[j].dest })

	tw := tar.NewWriter(w)
	type inode struct{ dev, ino uint64 }
	links := map[inode]string{}
	for _, it := range items {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr := &tar.Header{
			Uid:     opts.UID,
			Gid:     opts.GID,
			ModTime: mtime,
			Format:  tar.FormatPAX,
		}
		if it.src == "" { // synthesized parent directory
			hdr.Typeflag, hdr.Name, hdr.Mode = tar.TypeDir, it.dest+"/", 0o755
			if err := tw.WriteHeader(hdr); err != nil {
				return fmt.Errorf("ocilayout: tar header %s: %w", it.dest, err)
			}
			continue
		}
		st, err := os.Lstat(it.src)
		if err != nil {
			return fmt.Errorf("ocilayout: tar source: %w", err)
		}
		hdr.Mode = int64(st.Mode().Perm())
		if st.Mode()&fs.ModeSetuid != 0 {
			hdr.Mode |= 0o4000
		}
		if st.Mode()&fs.ModeSetgid != 0 {
			hdr.Mode |= 0o2000
		}
		if st.Mode()&fs.ModeSticky != 0 {
			hdr.Mode |= 0o1000
		}
		var body *os.File
		switch mode := st.Mode(); {
		case mode.IsDir():
			hdr.Typeflag, hdr.Name = tar.TypeDir, it.dest+"/"
		case mode&fs.ModeSymlink != 0:
			target, err := os.Readlink(it.src)
			if err != nil {
				return fmt.Errorf("ocilayout: readlink: %w", err)
			}
			hdr.Typeflag, hdr.Name, hdr.Linkname = tar.TypeSymlink, it.dest, target
		case mode.IsRegular():
			hdr.Name = it.dest
			if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Nlink > 1 {
				key := inode{uint64(sys.Dev), uint64(sys.Ino)}
				if first, ok := links[key]; ok {
					hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
					break
				}
				links[key] = it.dest
			}
			hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size()
			if body, err = os.Open(it.src); err != nil {
				return fmt.Errorf("ocilayout: open: %w", err)
			}
		default:
			return fmt.Errorf("%w: %s (%s)", ErrUnsupportedFile, it.src, st.Mode().Type())
		}
		if err := tw.WriteHeader(hdr); err != nil {
			if body != nil {
				body.Close()
			}
			return fmt.Errorf("ocilayout: tar header %s: %w", it.dest, err)
		}
		if body != nil {
			n, err := io.Copy(tw, ctxReader{ctx: ctx, r: body})
			body.Close()
			if err != nil {
				return fmt.Errorf("ocilayout: tar %s: %w", it.src, err)
			}
			if n != hdr.Size {
				return fmt.Errorf("ocilayout: %s changed size while archiving", it.src)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("ocilayout: close tar: %w", err)
	}
	return nil
}

// cleanDest turns an absolute image path into a clean relative tar name
// ("" for "/"), rejecting relative paths and escapes.
func cleanDest(dest string) (string, error) {
	if !strings.HasPrefix(dest, "/") {
		return "", fmt.Errorf("ocilayout: destination %q must be absolute", dest)
	}
	c := path.Clean(dest)
	if strings.Contains(dest, "/../") || strings.HasSuffix(dest, "/..") {
		return "", fmt.Errorf("ocilayout: destination %q must not contain ..", dest)
	}
	return strings.TrimPrefix(c, "/"), nil
}
