package lazypages

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/atomicfile"
)

// A persisted hot set (KeepHot): the checkpoint's working set (hot.go)
// written to a file of controld's own, so that a controld restart does
// not make the checkpoint's next lazy replica learn it again.
//
// The file is controld's, in its own state directory, never in the
// checkpoint's: a sandbox decides which pages are in the set (which of its
// own pages it touched), nothing else; an import cannot bring one. It is
// checked against the checkpoint's images as they were validated by Open:
// a file that does not match them exactly (its format and version, its
// checksum, one bitmap per pages image of that image's length, bits only
// on lazy pages) is ignored with its reason (HotSetError) and removed, and
// the set is learned again. It never fails an Open or a restore.
//
// Format (little endian):
//
//	"FFHOTSET"  magic, 8 bytes
//	u32         version (1)
//	u32         number of pages images (every pages-<id>.img, by id)
//	per image, ascending ids:
//	  u32       its id
//	  u64       its length in pages
//	  u64 * w   its bitmap, one bit per page, w = (pages + 63) / 64
//	u32         CRC-32C of everything before
const (
	hotMagic   = "FFHOTSET"
	hotVersion = 1
	// maxHotFile bounds what is read: 64 MiB of bitmap is 2 TiB of pages.
	maxHotFile = 64 << 20
)

// HotWriteDelay is how long after a session grew the set it is written:
// the sessions of a fan-out, which complete together, share one write.
// A variable for tests.
var HotWriteDelay = time.Second

// HotSetReason says why a persisted hot set was ignored.
type HotSetReason string

const (
	HotSetUnreadable HotSetReason = "unreadable"  // not a regular file, or it could not be read
	HotSetTooLarge   HotSetReason = "too_large"   // more bytes than these images' hot set takes
	HotSetTruncated  HotSetReason = "truncated"   // it ends early
	HotSetFormat     HotSetReason = "format"      // not a hot set file, or malformed
	HotSetVersion    HotSetReason = "version"     // another version of the format
	HotSetChecksum   HotSetReason = "checksum"    // its bytes changed
	HotSetMismatch   HotSetReason = "mismatch"    // made for other images: pages images or lengths differ
	HotSetStrayPages HotSetReason = "stray_pages" // pages that are not lazy pages of these images
)

// HotSetError is a persisted hot set that was ignored (KeepHot). It is an
// errdefs.ErrInvalidArgument.
type HotSetError struct {
	Path   string
	Reason HotSetReason
	Detail string
}

func (e *HotSetError) Error() string {
	return fmt.Sprintf("lazypages: hot set %s: %s: %s", e.Path, e.Reason, e.Detail)
}

func (e *HotSetError) Unwrap() error { return errdefs.ErrInvalidArgument }

// KeepHot persists the checkpoint's hot set at path (a file in a directory
// of controld's own, created when needed). A set found there is checked
// against these images and added to the hot set; one that does not match
// is removed and KeepHot returns why (a *HotSetError): the set is learned
// again. No file is no error. From then on, a session that grows the set
// has it written there HotWriteDelay later (atomically: the old file or
// the new one), one write for the sessions of that delay, and Close writes
// a set changed since; wrote, when not nil, is called after every write
// with its error (nil: written), for the caller to count. Call it once,
// after Open and before the first Listen.
func (im *Images) KeepHot(path string, log *slog.Logger, wrote func(error)) error {
	if log == nil {
		log = slog.Default()
	}
	err := im.loadHot(path)
	if err != nil {
		if rerr := os.Remove(path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			log.Warn("remove ignored hot set", "file", path, "err", rerr)
		}
	}
	k := &im.keep
	k.mu.Lock()
	k.path, k.log, k.wrote = path, log, wrote
	k.mu.Unlock()
	return err
}

// RemoveHot removes the hot set persisted at path (its checkpoint is
// deleted): no error when there is none. The checkpoint's Images must be
// closed first.
func RemoveHot(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("lazypages: remove hot set: %w", err)
	}
	return nil
}

// hotKeeper writes an Images' hot set to its file.
type hotKeeper struct {
	mu      sync.Mutex
	path    string // "" until KeepHot
	log     *slog.Logger
	wrote   func(error) // KeepHot's: after every write
	timer   *time.Timer // a write scheduled
	dirty   bool        // the set grew since the last write
	stopped bool        // Close: no write after its own

	writeMu sync.Mutex // one write at a time
	writes  int        // files written (tests)
}

// changed schedules a write of the set, which grew.
func (k *hotKeeper) changed(im *Images) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.path == "" || k.stopped {
		return
	}
	k.dirty = true
	if k.timer == nil {
		k.timer = time.AfterFunc(HotWriteDelay, func() { k.flush(im, false) })
	}
}

// stop writes the set if it changed, and no more after.
func (k *hotKeeper) stop(im *Images) {
	k.mu.Lock()
	k.stopped = true
	if k.timer != nil {
		k.timer.Stop()
		k.timer = nil
	}
	k.mu.Unlock()
	k.flush(im, true)
}

// flush writes the set if it changed since the last write; only the final
// one (stop's) writes once stopped.
func (k *hotKeeper) flush(im *Images, final bool) {
	k.writeMu.Lock()
	defer k.writeMu.Unlock()
	k.mu.Lock()
	if !final {
		k.timer = nil
	}
	if !k.dirty || (k.stopped && !final) {
		k.mu.Unlock()
		return
	}
	k.dirty = false
	path, log, wrote := k.path, k.log, k.wrote
	k.mu.Unlock()
	b := im.encodeHot()
	err := os.MkdirAll(filepath.Dir(path), 0o700)
	if err == nil {
		err = atomicfile.Write(path, b, 0o600)
	}
	if wrote != nil {
		wrote(err)
	}
	if err != nil {
		// The set stays in memory; a later session writes it again.
		log.Warn("persist hot set", "file", path, "err", err)
		k.mu.Lock()
		k.dirty = true
		k.mu.Unlock()
		return
	}
	k.writes++
}

// hotWrites is how many files the keeper wrote (tests).
func (im *Images) hotWrites() int {
	im.keep.writeMu.Lock()
	defer im.keep.writeMu.Unlock()
	return im.keep.writes
}

// pagesIDs lists the pages images' ids, ascending.
func (im *Images) pagesIDs() []uint32 {
	ids := make([]uint32, 0, len(im.pagesByID))
	for id := range im.pagesByID {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// hotFileSize is the size of these images' hot set file.
func (im *Images) hotFileSize() int64 {
	n := int64(len(hotMagic) + 8 + 4)
	for _, pi := range im.pagesByID {
		n += 12 + int64(words(pi.pages))*8
	}
	return n
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// encodeHot is the hot set as a file.
func (im *Images) encodeHot() []byte {
	b := make([]byte, 0, im.hotFileSize())
	b = append(b, hotMagic...)
	b = binary.LittleEndian.AppendUint32(b, hotVersion)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(im.pagesByID)))
	for _, id := range im.pagesIDs() {
		pi := im.pagesByID[id]
		b = binary.LittleEndian.AppendUint32(b, id)
		b = binary.LittleEndian.AppendUint64(b, uint64(len(pi.pages)/pageSize))
		pi.hot.mu.Lock()
		for i := range words(pi.pages) {
			var w uint64
			if i < len(pi.hot.bits) {
				w = pi.hot.bits[i]
			}
			b = binary.LittleEndian.AppendUint64(b, w)
		}
		pi.hot.mu.Unlock()
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

// hotImage is one pages image's part of a hot set file.
type hotImage struct {
	id    uint32
	pages uint64
	bits  []uint64
}

// decodeHot parses a hot set file: its format, not yet its images.
func decodeHot(b []byte) ([]hotImage, HotSetReason, string) {
	if len(b) < len(hotMagic) {
		return nil, HotSetTruncated, fmt.Sprintf("%d bytes", len(b))
	}
	if string(b[:len(hotMagic)]) != hotMagic {
		return nil, HotSetFormat, fmt.Sprintf("magic %q", b[:len(hotMagic)])
	}
	r := b[len(hotMagic):]
	if len(r) < 8 {
		return nil, HotSetTruncated, "no header"
	}
	if v := binary.LittleEndian.Uint32(r); v != hotVersion {
		return nil, HotSetVersion, fmt.Sprintf("version %d, want %d", v, hotVersion)
	}
	n := binary.LittleEndian.Uint32(r[4:])
	r = r[8:]
	if n > maxProcesses {
		return nil, HotSetFormat, fmt.Sprintf("%d pages images", n)
	}
	out := make([]hotImage, 0, n)
	for i := range n {
		if len(r) < 12 {
			return nil, HotSetTruncated, fmt.Sprintf("pages image %d of %d", i, n)
		}
		h := hotImage{id: binary.LittleEndian.Uint32(r), pages: binary.LittleEndian.Uint64(r[4:])}
		r = r[12:]
		if i > 0 && h.id <= out[i-1].id {
			return nil, HotSetFormat, fmt.Sprintf("pages image %d after %d", h.id, out[i-1].id)
		}
		if h.pages > maxUserAddress/pageSize {
			return nil, HotSetFormat, fmt.Sprintf("pages image %d of %d pages", h.id, h.pages)
		}
		w := (h.pages + 63) / 64
		if uint64(len(r)) < w*8 {
			return nil, HotSetTruncated, fmt.Sprintf("pages image %d: %d bitmap bytes of %d", h.id, len(r), w*8)
		}
		h.bits = make([]uint64, w)
		for j := range h.bits {
			h.bits[j] = binary.LittleEndian.Uint64(r[j*8:])
		}
		r = r[w*8:]
		out = append(out, h)
	}
	if len(r) < 4 {
		return nil, HotSetTruncated, "no checksum"
	}
	if len(r) > 4 {
		return nil, HotSetFormat, fmt.Sprintf("%d bytes after the checksum", len(r)-4)
	}
	if got, want := binary.LittleEndian.Uint32(r), crc32.Checksum(b[:len(b)-4], castagnoli); got != want {
		return nil, HotSetChecksum, fmt.Sprintf("crc32c %#x, want %#x", got, want)
	}
	return out, "", ""
}

// loadHot reads, checks and adds the hot set at path (none: nil).
func (im *Images) loadHot(path string) error {
	fail := func(r HotSetReason, format string, args ...any) error {
		return &HotSetError{Path: path, Reason: r, Detail: fmt.Sprintf(format, args...)}
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fail(HotSetUnreadable, "open: %v", err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fail(HotSetUnreadable, "stat: %v", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return fail(HotSetUnreadable, "not a regular file")
	}
	if want := im.hotFileSize(); st.Size > want || st.Size > maxHotFile {
		return fail(HotSetTooLarge, "%d bytes, these images' hot set takes %d", st.Size, want)
	}
	b := make([]byte, st.Size)
	if _, err := io.ReadFull(f, b); err != nil {
		return fail(HotSetTruncated, "read: %v", err)
	}
	sets, reason, detail := decodeHot(b)
	if reason != "" {
		return fail(reason, "%s", detail)
	}
	ids := im.pagesIDs()
	if len(sets) != len(ids) {
		return fail(HotSetMismatch, "%d pages images, the checkpoint has %d", len(sets), len(ids))
	}
	masks := im.lazyMasks()
	for i, h := range sets {
		pi := im.pagesByID[ids[i]]
		if h.id != ids[i] || h.pages != uint64(len(pi.pages)/pageSize) {
			return fail(HotSetMismatch, "pages image %d of %d pages, the checkpoint's is %d of %d",
				h.id, h.pages, ids[i], len(pi.pages)/pageSize)
		}
		mask := masks[pi.hot]
		for j, w := range h.bits {
			var m uint64
			if j < len(mask) {
				m = mask[j]
			}
			if w&^m != 0 {
				return fail(HotSetStrayPages, "pages image %d: pages %d to %d hold pages that are not lazy", h.id, j*64, j*64+63)
			}
		}
	}
	for i, h := range sets {
		if slices.ContainsFunc(h.bits, func(w uint64) bool { return w != 0 }) {
			im.pagesByID[ids[i]].hot.add(h.bits)
		}
	}
	return nil
}

// lazyMasks is, per pages image (by its hot set), a bitmap of its lazy
// pages: what a hot set may hold.
func (im *Images) lazyMasks() map[*hotSet][]uint64 {
	masks := map[*hotSet][]uint64{}
	for _, p := range im.procs {
		m := masks[p.hot]
		if m == nil {
			m = make([]uint64, words(p.pages))
			masks[p.hot] = m
		}
		for _, r := range p.runs {
			setBits(m, r.off/pageSize, r.off/pageSize+(r.end-r.start)/pageSize)
		}
	}
	return masks
}
