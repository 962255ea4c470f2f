package lazypages

import (
	"math/bits"
	"sync"
)

// The working set of a checkpoint (its hot set): the lazy pages that its
// replicas needed before they were verified. A browser replica touches
// almost all of its lazy pages before it is verified (11,600 of 12,600:
// Xvfb's framebuffer, the compositor's and the renderer's heaps), each
// through a fault that stops a thread until controld has answered it; a
// session that knows them copies them in bulk as soon as the restore has
// registered its tasks' memory (CRIU's restorer does that per task, tens of
// milliseconds before the restore ends and the tasks run), so the replica
// starts with them in and faults only for the rest.
//
// It is learned, not configured: a session records which pages its faults
// brought in (the faulting window and its neighbourhood) until Complete, and
// a session that completes (its replica verified) adds them to its Images.
// Later sessions of the checkpoint prefetch the union. Nothing in it comes
// from the sandbox but which of its own pages it touched: it indexes pages of
// the checkpoint's validated images (one bit per page of a pages image,
// allocated on the first record), so a replica can at most make its
// checkpoint's later replicas restore everything before they run: an eager
// restore's cost, for its own replicas only.

// hotSet is one pages image's hot pages, shared by the processes whose pages
// it holds.
type hotSet struct {
	mu   sync.Mutex
	bits []uint64 // one bit per page of the pages image; nil until learned
}

// words is the length of a bitmap over pages bytes.
func words(pages []byte) int { return (len(pages)/pageSize + 63) / 64 }

// add ORs a session's record into the set and says whether it grew.
func (h *hotSet) add(rec []uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.bits == nil {
		h.bits = make([]uint64, len(rec))
	}
	grew := false
	for i := range min(len(rec), len(h.bits)) { // one image: one length
		grew = grew || rec[i]&^h.bits[i] != 0
		h.bits[i] |= rec[i]
	}
	return grew
}

// pages counts the hot pages.
func (h *hotSet) pages() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var n int64
	for _, w := range h.bits {
		n += int64(bits.OnesCount64(w))
	}
	return n
}

// spans lists the hot pages of runs (a process's lazy runs in dump-time
// addresses) as spans, in address order.
func (h *hotSet) spans(runs []span) []span {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.bits == nil {
		return nil
	}
	var out []span
	for _, r := range runs {
		first := r.off / pageSize
		n := (r.end - r.start) / pageSize
		for i := uint64(0); i < n; {
			if !testBit(h.bits, first+i) {
				i++
				continue
			}
			j := i + 1
			for j < n && testBit(h.bits, first+j) {
				j++
			}
			out = append(out, span{start: r.start + i*pageSize, end: r.start + j*pageSize, off: r.off + i*pageSize})
			i = j
		}
	}
	return out
}

func testBit(b []uint64, i uint64) bool {
	return i/64 < uint64(len(b)) && b[i/64]&(1<<(i%64)) != 0
}

// setBits sets bits [from, to) of b (within it: a record is sized to its
// pages image, and offsets are inside it).
func setBits(b []uint64, from, to uint64) {
	for i := from; i < to && i/64 < uint64(len(b)); i++ {
		b[i/64] |= 1 << (i % 64)
	}
}

// HotPages is how many pages of the checkpoint its replicas have needed
// before they were verified so far: what the next replica prefetches.
func (im *Images) HotPages() int64 {
	var n int64
	seen := map[*hotSet]bool{}
	for _, p := range im.procs {
		if !seen[p.hot] {
			seen[p.hot] = true
			n += p.hot.pages()
		}
	}
	return n
}
