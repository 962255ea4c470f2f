package lazypages

import (
	"fmt"
	"testing"
)

const P = pageSize

func TestMissingDrop(t *testing.T) {
	m := newMissing([]span{{0, 10 * P, 0}, {20 * P, 30 * P, 10 * P}})
	m.drop(2*P, 4*P)   // split the first
	m.drop(9*P, 21*P)  // cut the end of one and the start of the next
	m.drop(40*P, 50*P) // nothing there
	want := []span{{0, 2 * P, 0}, {4 * P, 9 * P, 4 * P}, {21 * P, 30 * P, 11 * P}}
	if fmt.Sprint(m.s) != fmt.Sprint(want) {
		t.Fatalf("got %v, want %v", m.s, want)
	}
	if m.pages() != 2+5+9 {
		t.Fatalf("pages %d", m.pages())
	}
	if r, ok := m.find(5 * P); !ok || r.start != 4*P {
		t.Fatalf("find: %v %v", r, ok)
	}
	if _, ok := m.find(3 * P); ok {
		t.Fatal("found a dropped page")
	}
	if n := m.next(9 * P); n != 21*P {
		t.Fatalf("next %#x", n)
	}
	if n := m.next(31 * P); n != ^uint64(0) {
		t.Fatalf("next past the end %#x", n)
	}
	m.drop(0, 100*P)
	if !m.empty() {
		t.Fatalf("not empty: %v", m.s)
	}
}

func TestMissingRemap(t *testing.T) {
	m := newMissing([]span{{10 * P, 20 * P, 0}, {30 * P, 32 * P, 10 * P}})
	// Move pages 15..31 to 100..116: the tail of the first span and the
	// whole of the second, keeping their image offsets.
	m.remap(15*P, 100*P, 17*P)
	want := []span{{10 * P, 15 * P, 0}, {100 * P, 105 * P, 5 * P}, {115 * P, 117 * P, 10 * P}}
	if fmt.Sprint(m.s) != fmt.Sprint(want) {
		t.Fatalf("got %v, want %v", m.s, want)
	}
	// Backwards, between spans (mremap unmapped the destination first).
	m.remap(100*P, 40*P, 20*P)
	want = []span{{10 * P, 15 * P, 0}, {40 * P, 45 * P, 5 * P}, {55 * P, 57 * P, 10 * P}}
	if fmt.Sprint(m.s) != fmt.Sprint(want) {
		t.Fatalf("got %v, want %v", m.s, want)
	}
	c := m.clone()
	c.drop(0, 100*P)
	if m.empty() {
		t.Fatal("clone shares its spans")
	}
}

func TestWindow(t *testing.T) {
	r := span{start: 0, end: 100 * P}
	for _, c := range []struct{ addr, chunk, start, end uint64 }{
		{0, 16 * P, 0, 16 * P},
		{50 * P, 16 * P, 50 * P, 66 * P},
		{95 * P, 16 * P, 84 * P, 100 * P}, // moved back to stay inside
		{50 * P, 200 * P, 0, 100 * P},     // small runs come whole
	} {
		s, e := window(r, c.addr, c.chunk)
		if s != c.start || e != c.end {
			t.Errorf("window(%#x, %#x) = %#x-%#x, want %#x-%#x", c.addr, c.chunk, s, e, c.start, c.end)
		}
	}
}
