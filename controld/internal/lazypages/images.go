package lazypages

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// CRIU 4.2's image format (criu/include/magic.h, images/*.proto).
const (
	imgCommonMagic = 0x54564319
	pagemapMagic   = 0x56084025
	mmMagic        = 0x57492820

	pePresent = 1 << 2 // pages are in pages-<id>.img
	peLazy    = 1 << 1 // pages may be restored lazily
	peParent  = 1 << 0 // pages are in the parent checkpoint

	mapPrivate   = 0x02
	mapAnonymous = 0x20
	mapLocked    = 0x2000
	mapHugetlb   = 0x40000

	vmaAreaVsyscall = 1 << 2
	vmaAreaVDSO     = 1 << 3
	vmaAreaVVAR     = 1 << 12
	vmaAreaGuard    = 1 << 16
)

// Bounds on what a checkpoint may claim. The images come from a sandbox's
// checkpoint (or an import): nothing in them is trusted.
const (
	maxProcesses   = 4096     // pagemap-<pid>.img files in one checkpoint
	maxDirEntries  = 1 << 16  // files in the images directory
	maxMetaFile    = 16 << 20 // a pagemap or mm image
	maxMetaTotal   = 64 << 20 // all of them together
	maxMessage     = 16 << 20 // one protobuf message in them
	maxUserAddress = 1 << 57  // above any x86-64 user address (5-level paging)
)

// Images is one checkpoint's page images, parsed and mapped read-only
// once and shared by every Session that restores a replica of it. The
// mappings keep the pages readable after the checkpoint's files are
// removed: the pin is this object, not the directory. Close drops the
// owner's reference; the mappings go when the last session has closed too.
type Images struct {
	dir       string
	procs     map[int32]*procImage
	lazyPages int64
	metaBytes int64 // read while opening, bounded by maxMetaTotal

	// pagesByID is every pages-<id>.img with its hot set, by id: what a
	// persisted hot set (hotfile.go) is checked against.
	pagesByID map[uint32]pagesImage

	mu     sync.Mutex
	refs   int // the owner's (until Close) and one per live session
	closed bool
	maps   [][]byte

	keep hotKeeper // where the hot set is persisted (hotfile.go)
}

// procImage is one dumped process: its lazy runs in dump-time addresses.
type procImage struct {
	pid   int32
	runs  []span  // sorted, disjoint, each inside one lazy VMA
	pages []byte  // the mapping of its pages-<id>.img; shared between processes of one id
	hot   *hotSet // the hot pages of that image (hot.go); shared likewise
}

// span is [start, end) in the process's address space whose bytes are at
// off in the pages image.
type span struct {
	start, end uint64
	off        uint64
}

func invalid(file, format string, args ...any) error {
	return fmt.Errorf("lazypages: %s: %s: %w", file, fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
}

// Open parses and maps the page images of the checkpoint in dir: every
// pagemap-<pid>.img with its mm-<pid>.img and pages-<id>.img. Call it once
// per checkpoint; every replica's Listen shares the result.
func Open(dir string) (*Images, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("lazypages: images %s: %w", dir, err)
	}
	defer d.Close()
	var names []string
	for {
		batch, err := d.Readdirnames(1024)
		names = append(names, batch...)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("lazypages: images %s: %w", dir, err)
		}
		if len(names) > maxDirEntries {
			return nil, invalid(dir, "more than %d entries", maxDirEntries)
		}
	}
	im := &Images{dir: dir, procs: map[int32]*procImage{}, refs: 1}
	pagesByID := map[uint32]pagesImage{}
	im.pagesByID = pagesByID
	dfd := int(d.Fd())
	ok := false
	defer func() {
		if !ok {
			im.unmap()
		}
	}()
	sort.Strings(names)
	for _, name := range names {
		pid, isPagemap := pagemapPID(name)
		if !isPagemap {
			continue
		}
		if len(im.procs) == maxProcesses {
			return nil, invalid(dir, "more than %d pagemap images", maxProcesses)
		}
		p, err := im.openProc(dfd, pid, pagesByID)
		if err != nil {
			return nil, err
		}
		im.procs[pid] = p
		for _, r := range p.runs {
			im.lazyPages += int64((r.end - r.start) / pageSize)
		}
	}
	if len(im.procs) == 0 {
		return nil, fmt.Errorf("lazypages: images %s: no pagemap-<pid>.img: %w", dir, errdefs.ErrInvalidArgument)
	}
	ok = true
	return im, nil
}

// pagemapPID parses "pagemap-<pid>.img" (not pagemap-shmem-*).
func pagemapPID(name string) (int32, bool) {
	s, ok := strings.CutPrefix(name, "pagemap-")
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, ".img")
	if !ok || s == "" || s[0] == '0' || s[0] == '+' {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil || n <= 0 {
		return 0, false
	}
	return int32(n), true
}

// LazyBytes is how many bytes a lazy restore of this checkpoint leaves to
// the page server (every process's lazy pages).
func (im *Images) LazyBytes() int64 { return im.lazyPages * pageSize }

// Processes lists the dumped pids whose pages the images hold.
func (im *Images) Processes() []int32 {
	pids := make([]int32, 0, len(im.procs))
	for pid := range im.procs {
		pids = append(pids, pid)
	}
	sort.Slice(pids, func(i, j int) bool { return pids[i] < pids[j] })
	return pids
}

// Close releases the owner's reference. Sessions still serving keep the
// mappings until they close; Listen fails after Close. A persisted hot set
// (KeepHot) is written now if it changed since its last write, and never
// after Close returns.
func (im *Images) Close() error {
	im.keep.stop(im)
	im.mu.Lock()
	defer im.mu.Unlock()
	if im.closed {
		return nil
	}
	im.closed = true
	im.releaseLocked()
	return nil
}

func (im *Images) acquire() error {
	im.mu.Lock()
	defer im.mu.Unlock()
	if im.closed {
		return fmt.Errorf("lazypages: images %s are closed: %w", im.dir, errdefs.ErrFailedPrecondition)
	}
	im.refs++
	return nil
}

func (im *Images) release() {
	im.mu.Lock()
	defer im.mu.Unlock()
	im.releaseLocked()
}

func (im *Images) releaseLocked() {
	im.refs--
	if im.refs == 0 {
		im.unmap()
	}
}

func (im *Images) unmap() {
	for _, m := range im.maps {
		_ = unix.Munmap(m)
	}
	im.maps = nil
}

// pagesImage is one pages-<id>.img: its mapping and its hot set.
type pagesImage struct {
	pages []byte
	hot   *hotSet
}

func (im *Images) openProc(dfd int, pid int32, pagesByID map[uint32]pagesImage) (*procImage, error) {
	pmName := fmt.Sprintf("pagemap-%d.img", pid)
	pm, err := im.readMeta(dfd, pmName)
	if err != nil {
		return nil, err
	}
	pagesID, entries, err := parsePagemap(pmName, pm)
	if err != nil {
		return nil, err
	}
	mmName := fmt.Sprintf("mm-%d.img", pid)
	mm, err := im.readMeta(dfd, mmName)
	if err != nil {
		return nil, err
	}
	vmas, err := parseMM(mmName, mm)
	if err != nil {
		return nil, err
	}
	pi, ok := pagesByID[pagesID]
	pagesName := fmt.Sprintf("pages-%d.img", pagesID)
	if !ok {
		pages, err := mapPages(dfd, pagesName)
		if err != nil {
			return nil, err
		}
		if pages != nil {
			im.maps = append(im.maps, pages)
		}
		pi = pagesImage{pages: pages, hot: &hotSet{}}
		pagesByID[pagesID] = pi
	}
	pages := pi.pages
	var present uint64
	for _, e := range entries {
		if e.flags&pePresent != 0 {
			present += e.nrPages
		}
	}
	if present > uint64(len(pages))/pageSize {
		return nil, invalid(pmName, "claims %d pages, %s holds %d", present, pagesName, len(pages)/pageSize)
	}
	runs, err := lazyRuns(pmName, entries, vmas)
	if err != nil {
		return nil, err
	}
	return &procImage{pid: pid, runs: runs, pages: pages, hot: pi.hot}, nil
}

// openImage opens name in the images directory without following a link
// or blocking on a FIFO, and admits only a regular file.
func openImage(dfd int, name string) (*os.File, int64, error) {
	fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, 0, fmt.Errorf("lazypages: %s: %w", name, errdefs.ErrNotFound)
		}
		if errors.Is(err, unix.ELOOP) {
			return nil, 0, invalid(name, "is a symbolic link")
		}
		return nil, 0, fmt.Errorf("lazypages: open %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("lazypages: stat %s: %w", name, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		f.Close()
		return nil, 0, invalid(name, "not a regular file")
	}
	return f, st.Size, nil
}

func (im *Images) readMeta(dfd int, name string) ([]byte, error) {
	f, size, err := openImage(dfd, name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if size > maxMetaFile {
		return nil, invalid(name, "%d bytes, more than %d", size, maxMetaFile)
	}
	if im.metaBytes += size; im.metaBytes > maxMetaTotal {
		return nil, invalid(im.dir, "pagemap and mm images of more than %d bytes", maxMetaTotal)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(f, b); err != nil {
		return nil, invalid(name, "short read: %v", err)
	}
	return b, nil
}

// mapPages maps a pages image read-only and shared: every replica's copies
// come from one page cache, and UFFDIO_COPY reads it in the kernel (a file
// truncated under the mapping fails the copy with EFAULT, never a SIGBUS
// here, since this process never touches the mapping itself).
func mapPages(dfd int, name string) ([]byte, error) {
	f, size, err := openImage(dfd, name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if size == 0 {
		return nil, nil
	}
	if size%pageSize != 0 {
		return nil, invalid(name, "%d bytes, not whole pages", size)
	}
	if uint64(size) > maxUserAddress {
		return nil, invalid(name, "%d bytes", size)
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("lazypages: map %s: %w", name, err)
	}
	return m, nil
}

// entry is one pagemap entry, its compat fields resolved as CRIU's
// init_compat_pagemap_entry does.
type entry struct {
	vaddr   uint64
	nrPages uint64
	flags   uint32
	off     uint64 // where its pages start in the pages image (present entries)
}

// parsePagemap reads a pagemap image: magic, pagemap_head, then entries,
// each a little-endian u32 size and a protobuf message.
func parsePagemap(name string, b []byte) (uint32, []entry, error) {
	msgs, err := splitImage(name, b, pagemapMagic)
	if err != nil {
		return 0, nil, err
	}
	if len(msgs) == 0 {
		return 0, nil, invalid(name, "no pagemap_head")
	}
	var pagesID uint32
	var haveID bool
	if err := eachField(name, msgs[0], func(num protowire.Number, typ protowire.Type, v uint64) error {
		if num == 1 {
			if typ != protowire.VarintType || v > 1<<31 {
				return invalid(name, "bad pages_id")
			}
			pagesID, haveID = uint32(v), true
		}
		return nil
	}); err != nil {
		return 0, nil, err
	}
	if !haveID {
		return 0, nil, invalid(name, "pagemap_head without pages_id")
	}
	entries := make([]entry, 0, len(msgs)-1)
	var prevEnd, off uint64
	for i, m := range msgs[1:] {
		e, err := parseEntry(name, m)
		if err != nil {
			return 0, nil, fmt.Errorf("entry %d: %w", i, err)
		}
		if e.vaddr%pageSize != 0 {
			return 0, nil, invalid(name, "entry %d at %#x not page aligned", i, e.vaddr)
		}
		if e.nrPages == 0 || e.nrPages > maxUserAddress/pageSize || e.vaddr >= maxUserAddress ||
			e.nrPages*pageSize > maxUserAddress-e.vaddr {
			return 0, nil, invalid(name, "entry %d: %d pages at %#x", i, e.nrPages, e.vaddr)
		}
		if i > 0 && e.vaddr < prevEnd {
			return 0, nil, invalid(name, "entry %d at %#x overlaps or precedes the one before (ends %#x)", i, e.vaddr, prevEnd)
		}
		if e.flags&^(pePresent|peLazy|peParent) != 0 {
			return 0, nil, invalid(name, "entry %d: unknown flags %#x", i, e.flags)
		}
		if e.flags&peParent != 0 {
			return 0, nil, fmt.Errorf("lazypages: %s: entry %d: pages in a parent checkpoint (incremental dumps are not served): %w",
				name, i, errdefs.ErrFailedPrecondition)
		}
		if e.flags&peLazy != 0 && e.flags&pePresent == 0 {
			return 0, nil, fmt.Errorf("lazypages: %s: entry %d: lazy pages not in the images (a lazy dump's remote pages are not served): %w",
				name, i, errdefs.ErrFailedPrecondition)
		}
		prevEnd = e.vaddr + e.nrPages*pageSize
		if e.flags&pePresent != 0 {
			e.off = off
			if off += e.nrPages * pageSize; off > maxUserAddress {
				return 0, nil, invalid(name, "more present pages than any pages image holds")
			}
		}
		entries = append(entries, e)
	}
	return pagesID, entries, nil
}

func parseEntry(name string, m []byte) (entry, error) {
	var e entry
	var haveVaddr, haveCompat, haveFlags, haveNr, inParent bool
	var compat uint64
	err := eachField(name, m, func(num protowire.Number, typ protowire.Type, v uint64) error {
		if num >= 1 && num <= 5 && typ != protowire.VarintType {
			return invalid(name, "field %d has wire type %d", num, typ)
		}
		switch num {
		case 1:
			e.vaddr, haveVaddr = v, true
		case 2:
			if v > 1<<32-1 {
				return invalid(name, "compat_nr_pages %d", v)
			}
			compat, haveCompat = v, true
		case 3:
			inParent = v != 0
		case 4:
			if v > 1<<32-1 {
				return invalid(name, "flags %#x", v)
			}
			e.flags, haveFlags = uint32(v), true
		case 5:
			e.nrPages, haveNr = v, true
		}
		return nil
	})
	if err != nil {
		return e, err
	}
	if !haveVaddr || !haveCompat {
		return e, invalid(name, "entry without vaddr or nr_pages")
	}
	switch {
	case inParent:
		e.flags |= peParent
	case !haveFlags:
		e.flags = pePresent
	}
	if !haveNr {
		e.nrPages = compat
	}
	return e, nil
}

// vma is the part of a dumped VMA that matters here.
type vma struct {
	start, end uint64
}

// parseMM reads mm-<pid>.img (magic, one mm_entry) and returns its VMAs
// that CRIU restores lazily (vma_entry_can_be_lazy), sorted and checked.
func parseMM(name string, b []byte) ([]vma, error) {
	msgs, err := splitImage(name, b, mmMagic)
	if err != nil {
		return nil, err
	}
	if len(msgs) != 1 {
		return nil, invalid(name, "%d mm entries, want 1", len(msgs))
	}
	var vmas []vma
	err = eachBytesField(name, msgs[0], 14, func(v []byte) error {
		var start, end, flags, status uint64
		var have int
		err := eachField(name, v, func(num protowire.Number, typ protowire.Type, x uint64) error {
			if num >= 1 && num <= 7 && typ != protowire.VarintType {
				return invalid(name, "vma field %d has wire type %d", num, typ)
			}
			switch num {
			case 1:
				start, have = x, have|1
			case 2:
				end, have = x, have|2
			case 6:
				flags = x
			case 7:
				status = x
			}
			return nil
		})
		if err != nil {
			return err
		}
		if have != 3 {
			return invalid(name, "vma without start or end")
		}
		lazy := flags&mapAnonymous != 0 && flags&mapPrivate != 0 && flags&(mapLocked|mapHugetlb) == 0 &&
			status&(vmaAreaVDSO|vmaAreaVVAR|vmaAreaVsyscall|vmaAreaGuard) == 0
		if !lazy {
			return nil
		}
		if start%pageSize != 0 || end%pageSize != 0 || start >= end || end > maxUserAddress {
			return invalid(name, "vma %#x-%#x", start, end)
		}
		if n := len(vmas); n > 0 && start < vmas[n-1].end {
			return invalid(name, "vma %#x-%#x overlaps or precedes %#x-%#x", start, end, vmas[n-1].start, vmas[n-1].end)
		}
		vmas = append(vmas, vma{start, end})
		return nil
	})
	return vmas, err
}

// lazyRuns cuts the lazy pagemap entries at VMA boundaries (one
// UFFDIO_COPY cannot cross a VMA), as CRIU's collect_iovs does. A lazy page
// outside every lazy VMA is an inconsistent image.
func lazyRuns(name string, entries []entry, vmas []vma) ([]span, error) {
	var runs []span
	v := 0
	for _, e := range entries {
		if e.flags&peLazy == 0 {
			continue
		}
		start, end := e.vaddr, e.vaddr+e.nrPages*pageSize
		for start < end {
			for v < len(vmas) && vmas[v].end <= start {
				v++
			}
			if v == len(vmas) || vmas[v].start > start {
				return nil, invalid(name, "lazy page %#x is in no lazy VMA", start)
			}
			cut := min(end, vmas[v].end)
			runs = append(runs, span{start: start, end: cut, off: e.off + (start - e.vaddr)})
			start = cut
		}
	}
	return runs, nil
}

// splitImage checks a protobuf image's magic and splits the size-prefixed
// messages after it.
func splitImage(name string, b []byte, magic uint32) ([][]byte, error) {
	if len(b) < 8 {
		return nil, invalid(name, "%d bytes, no image header", len(b))
	}
	if m := binary.LittleEndian.Uint32(b); m != imgCommonMagic {
		return nil, invalid(name, "head magic %#x, want %#x", m, imgCommonMagic)
	}
	if m := binary.LittleEndian.Uint32(b[4:]); m != magic {
		return nil, invalid(name, "magic %#x, want %#x", m, magic)
	}
	b = b[8:]
	var msgs [][]byte
	for len(b) > 0 {
		if len(b) < 4 {
			return nil, invalid(name, "truncated message size")
		}
		n := binary.LittleEndian.Uint32(b)
		b = b[4:]
		if n > maxMessage || uint64(n) > uint64(len(b)) {
			return nil, invalid(name, "message of %d bytes, %d left", n, len(b))
		}
		msgs = append(msgs, b[:n])
		b = b[n:]
	}
	return msgs, nil
}

// eachField calls fn for every field of message m, with its varint or
// fixed value (0 for length-delimited ones, which it skips).
func eachField(name string, m []byte, fn func(protowire.Number, protowire.Type, uint64) error) error {
	for len(m) > 0 {
		num, typ, n := protowire.ConsumeTag(m)
		if n < 0 {
			return invalid(name, "bad protobuf tag: %v", protowire.ParseError(n))
		}
		m = m[n:]
		var v uint64
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(m)
		case protowire.Fixed32Type:
			var x uint32
			x, n = protowire.ConsumeFixed32(m)
			v = uint64(x)
		case protowire.Fixed64Type:
			v, n = protowire.ConsumeFixed64(m)
		default:
			n = protowire.ConsumeFieldValue(num, typ, m)
		}
		if n < 0 {
			return invalid(name, "bad protobuf field %d: %v", num, protowire.ParseError(n))
		}
		m = m[n:]
		if err := fn(num, typ, v); err != nil {
			return err
		}
	}
	return nil
}

// eachBytesField calls fn with every length-delimited field number want.
func eachBytesField(name string, m []byte, want protowire.Number, fn func([]byte) error) error {
	for len(m) > 0 {
		num, typ, n := protowire.ConsumeTag(m)
		if n < 0 {
			return invalid(name, "bad protobuf tag: %v", protowire.ParseError(n))
		}
		m = m[n:]
		if num == want {
			if typ != protowire.BytesType {
				return invalid(name, "field %d has wire type %d", num, typ)
			}
			v, n := protowire.ConsumeBytes(m)
			if n < 0 {
				return invalid(name, "bad protobuf field %d: %v", num, protowire.ParseError(n))
			}
			if err := fn(v); err != nil {
				return err
			}
			m = m[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, m)
		if n < 0 {
			return invalid(name, "bad protobuf field %d: %v", num, protowire.ParseError(n))
		}
		m = m[n:]
	}
	return nil
}
