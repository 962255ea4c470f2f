package lazypages

import "sort"

// missing is the set of a process's lazy pages not yet in its memory, in
// its current addresses (remaps move them), sorted and disjoint. It is
// CRIU's lazy_iov list as a sorted slice.
type missing struct {
	s []span
}

func newMissing(runs []span) *missing {
	return &missing{s: append([]span(nil), runs...)}
}

func (m *missing) clone() *missing { return newMissing(m.s) }

func (m *missing) empty() bool { return len(m.s) == 0 }

func (m *missing) pages() uint64 {
	var n uint64
	for _, r := range m.s {
		n += (r.end - r.start) / pageSize
	}
	return n
}

// index is the first span whose end is above addr.
func (m *missing) index(addr uint64) int {
	return sort.Search(len(m.s), func(i int) bool { return m.s[i].end > addr })
}

// find returns the span holding addr.
func (m *missing) find(addr uint64) (span, bool) {
	i := m.index(addr)
	if i < len(m.s) && m.s[i].start <= addr {
		return m.s[i], true
	}
	return span{}, false
}

// next is the start of the first missing page at or above addr (or ^0).
func (m *missing) next(addr uint64) uint64 {
	i := m.index(addr)
	if i == len(m.s) {
		return ^uint64(0)
	}
	return max(m.s[i].start, addr)
}

// drop removes [start, end): the pages are in, or gone from the process.
func (m *missing) drop(start, end uint64) {
	if start >= end {
		return
	}
	i := m.index(start)
	var out []span
	j := i
	for ; j < len(m.s) && m.s[j].start < end; j++ {
		r := m.s[j]
		if r.start < start {
			out = append(out, span{start: r.start, end: start, off: r.off})
		}
		if r.end > end {
			out = append(out, span{start: end, end: r.end, off: r.off + (end - r.start)})
		}
	}
	if i == j {
		return
	}
	m.s = append(m.s[:i], append(out, m.s[j:]...)...)
}

// remap moves [from, from+n) to [to, to+n), as mremap moved the pages.
func (m *missing) remap(from, to, n uint64) {
	if n == 0 || from == to {
		return
	}
	end := from + n
	var moved []span
	i := m.index(from)
	for j := i; j < len(m.s) && m.s[j].start < end; j++ {
		r := m.s[j]
		s, e := max(r.start, from), min(r.end, end)
		moved = append(moved, span{start: s - from + to, end: e - from + to, off: r.off + (s - r.start)})
	}
	if len(moved) == 0 {
		return
	}
	m.drop(from, end)
	// The destination held no missing pages: mremap unmapped it first (an
	// UNMAP event dropped them), so the moved spans insert without overlap.
	m.drop(to, to+n)
	for _, r := range moved {
		k := m.index(r.start)
		m.s = append(m.s, span{})
		copy(m.s[k+1:], m.s[k:])
		m.s[k] = r
	}
}

// window picks what to serve for a fault at addr inside r: all of r when
// it is at most chunk, else chunk bytes from addr (moved back to stay
// inside r), so a fault brings its neighbourhood.
func window(r span, addr, chunk uint64) (uint64, uint64) {
	if r.end-r.start <= chunk {
		return r.start, r.end
	}
	start := addr
	end := min(r.end, start+chunk)
	if end-start < chunk {
		start = end - chunk
	}
	return start, end
}
