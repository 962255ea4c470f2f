//go:build linux

package containerdrt

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// The filesystem proof of a fork: a digest of the sandbox's files outside
// volatile paths, over what its writable layers changed against the image
// (the sandbox's own layer and the checkpoint layers below it, merged with
// overlayfs's rules: upper entries win, whiteouts hide, opaque directories
// stop the merge). The checkpoint records it from the layer it commits (a
// copy made while the source was frozen); a replica's must equal it.
//
// The layers' contents are the sandbox's and hostile: the walk never follows
// a link (every open is relative to an open directory, O_NOFOLLOW), reads
// only what fstat on the open descriptor says is a regular file, opens with
// O_NONBLOCK (a FIFO swapped in meanwhile cannot block it), and bounds the
// entries and bytes it reads instead of trusting sizes.

// volatileDirs change by themselves at run time (logs, caches, sockets,
// temporary files): they are left out of the digest. A directory named
// .cache anywhere is left out too.
var volatileDirs = []string{"tmp", "var/tmp", "run", "var/run", "var/log", "var/cache", "dev", "proc", "sys"}

// Bounds of one digest.
const (
	fsDigestMaxEntries = 1 << 20
	fsDigestMaxBytes   = 4 << 30
)

var _ runtime.LayerDigester = (*Runtime)(nil)

// LayerDigest returns the filesystem digest of a running sandbox.
func (r *Runtime) LayerDigest(ctx context.Context, id string) ([]byte, error) {
	if err := validateID(id); err != nil {
		return nil, err
	}
	ctx = r.ctx(ctx)
	c, err := r.client.ContainerService().Get(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, convertErr(err))
	}
	layers, err := r.deltaLayers(ctx, c.SnapshotKey)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	// A sandbox with a disk budget writes to a layer of its own.
	if own, err := r.layerOf(id, c.Labels); err != nil {
		return nil, err
	} else if own != "" {
		layers[0] = filepath.Join(own, "upper")
	}
	return layerDigest(layers)
}

// deltaLayers returns the directories of an active snapshot's own layer and
// of the checkpoint layers under it, top first.
func (r *Runtime) deltaLayers(ctx context.Context, key string) ([]string, error) {
	ms, err := r.sn.Mounts(ctx, key)
	if err != nil {
		return nil, convertErr(err)
	}
	upper, err := upperDir(ms)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errdefs.ErrFailedPrecondition, err)
	}
	var lowers []string
	for _, o := range ms[0].Options {
		if v, ok := strings.CutPrefix(o, "lowerdir="); ok {
			lowers = strings.Split(v, ":")
		}
	}
	info, err := r.sn.Stat(ctx, key)
	if err != nil {
		return nil, convertErr(err)
	}
	n := 0
	for p := info.Parent; strings.HasPrefix(p, checkpointLayerPrefix) && n < len(lowers); n++ {
		pi, err := r.sn.Stat(ctx, p)
		if err != nil {
			return nil, convertErr(err)
		}
		p = pi.Parent
	}
	return append([]string{upper}, lowers[:n]...), nil
}

// layerDigest merges layers (top first) and digests the result: for every
// path outside volatileDirs, in a fixed order, its kind and, for regular
// files and links, the SHA-256 of the content or the link's target.
func layerDigest(layers []string) ([]byte, error) {
	roots := make([]int, 0, len(layers))
	defer func() {
		for _, fd := range roots {
			unix.Close(fd)
		}
	}()
	for _, l := range layers {
		fd, err := unix.Open(l, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("layer %s: %w", l, err)
		}
		roots = append(roots, fd)
	}
	w := &digestWalk{h: sha256.New()}
	if err := w.dir("", roots); err != nil {
		return nil, err
	}
	return w.h.Sum(nil), nil
}

type digestWalk struct {
	h       hash.Hash
	entries int
	bytes   int64
	buf     []byte
}

type layerEntry struct {
	dirfd int // the layer's open directory holding it
	mode  uint32
	rdev  uint64
}

// dir digests directory rel, given open descriptors of it in each layer
// that has it (top first; a layer whose directory is opaque ends the list).
func (w *digestWalk) dir(rel string, fds []int) error {
	seen := map[string]bool{}
	var names []string
	merged := map[string][]layerEntry{}
	for _, fd := range fds {
		ents, err := readDirNames(fd) // every fd here is fresh: read from 0
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		for _, name := range ents {
			var st unix.Stat_t
			if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				if errors.Is(err, unix.ENOENT) {
					continue // gone meanwhile
				}
				return fmt.Errorf("%s/%s: %w", rel, name, err)
			}
			prev, had := merged[name]
			if !had && seen[name] {
				continue // hidden by an upper whiteout or non-directory
			}
			seen[name] = true
			isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
			if had && (!isDir || prev[len(prev)-1].mode&unix.S_IFMT != unix.S_IFDIR) {
				continue // an upper non-directory hides it, or it hides nothing below a file
			}
			if had && isOpaque(prev[len(prev)-1].dirfd, name) {
				continue
			}
			if !had {
				names = append(names, name)
			}
			merged[name] = append(prev, layerEntry{dirfd: fd, mode: st.Mode, rdev: st.Rdev})
		}
	}
	slices.Sort(names)
	for _, name := range names {
		es := merged[name]
		top := es[0]
		if top.mode&unix.S_IFMT == unix.S_IFCHR && top.rdev == 0 {
			continue // a whiteout: deleted against the image
		}
		path := name
		if rel != "" {
			path = rel + "/" + name
		}
		if volatile(path) {
			continue
		}
		if w.entries++; w.entries > fsDigestMaxEntries {
			return fmt.Errorf("more than %d files in the writable layers", fsDigestMaxEntries)
		}
		switch top.mode & unix.S_IFMT {
		case unix.S_IFDIR:
			fmt.Fprintf(w.h, "d %q\n", path)
			var sub []int
			for _, e := range es {
				fd, err := unix.Openat(e.dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
				if err != nil {
					if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
						continue // replaced meanwhile
					}
					closeAll(sub)
					return fmt.Errorf("%s: %w", path, err)
				}
				sub = append(sub, fd)
				if isOpaque(e.dirfd, name) {
					break
				}
			}
			err := w.dir(path, sub)
			closeAll(sub)
			if err != nil {
				return err
			}
		case unix.S_IFLNK:
			target := make([]byte, unix.PathMax)
			n, err := unix.Readlinkat(top.dirfd, name, target)
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			fmt.Fprintf(w.h, "l %q %q\n", path, target[:n])
		case unix.S_IFREG:
			sum, err := w.file(top.dirfd, name)
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			fmt.Fprintf(w.h, "f %q %x\n", path, sum)
		default:
			fmt.Fprintf(w.h, "o %q %o\n", path, top.mode&unix.S_IFMT)
		}
	}
	return nil
}

// file hashes a regular file without following links or trusting its size.
func (w *digestWalk) file(dirfd int, name string) ([]byte, error) {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	h := sha256.New()
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return h.Sum([]byte("not a regular file")), nil // swapped meanwhile
	}
	if w.buf == nil {
		w.buf = make([]byte, 256<<10)
	}
	for {
		n, err := f.Read(w.buf)
		h.Write(w.buf[:n])
		if w.bytes += int64(n); w.bytes > fsDigestMaxBytes {
			return nil, fmt.Errorf("more than %d bytes in the writable layers", int64(fsDigestMaxBytes))
		}
		if err == io.EOF {
			return h.Sum(nil), nil
		}
		if err != nil {
			return nil, err
		}
	}
}

func volatile(path string) bool {
	for _, v := range volatileDirs {
		if path == v || strings.HasPrefix(path, v+"/") {
			return true
		}
	}
	return path == ".cache" || strings.HasSuffix(path, "/.cache") || strings.Contains(path, "/.cache/") || strings.HasPrefix(path, ".cache/")
}

// isOpaque reports whether directory name in dirfd is an overlayfs opaque
// directory (it hides the lower layers' contents).
func isOpaque(dirfd int, name string) bool {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	buf := make([]byte, 8)
	for _, attr := range []string{"trusted.overlay.opaque", "user.overlay.opaque"} {
		if n, err := unix.Fgetxattr(fd, attr, buf); err == nil && bytes.Equal(buf[:n], []byte("y")) {
			return true
		}
	}
	return false
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
