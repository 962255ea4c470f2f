package lazypages

import (
	"reflect"
	"testing"
)

// spans maps the set's bits (pages of the pages image) back to the
// addresses of the runs that hold them, split at the runs' ends.
func TestHotSetSpans(t *testing.T) {
	const p = pageSize
	h := &hotSet{}
	if got := h.spans([]span{{start: 0x10000, end: 0x20000}}); got != nil {
		t.Fatalf("an empty set lists %v", got)
	}
	// Image pages 0-15 are run A (16 pages at 0x10000), 16-19 run B at 0x40000.
	runs := []span{{start: 0x10000, end: 0x10000 + 16*p, off: 0}, {start: 0x40000, end: 0x40000 + 4*p, off: 16 * p}}
	rec := make([]uint64, words(make([]byte, 20*p)))
	setBits(rec, 2, 5)   // A: pages 2-4
	setBits(rec, 15, 18) // A's last page, B's first two
	setBits(rec, 64, 70) // past the image: ignored (no such run)
	h.add(rec)
	want := []span{
		{start: 0x10000 + 2*p, end: 0x10000 + 5*p, off: 2 * p},
		{start: 0x10000 + 15*p, end: 0x10000 + 16*p, off: 15 * p},
		{start: 0x40000, end: 0x40000 + 2*p, off: 16 * p},
	}
	if got := h.spans(runs); !reflect.DeepEqual(got, want) {
		t.Fatalf("spans\n got %+v\nwant %+v", got, want)
	}
	if n := h.pages(); n != 6 {
		t.Fatalf("%d hot pages, want 6", n)
	}
	// Sets add up.
	more := make([]uint64, len(rec))
	setBits(more, 19, 20)
	h.add(more)
	if got := h.spans(runs[1:]); len(got) != 2 || got[1].start != 0x40000+3*p {
		t.Fatalf("after a second record: %+v", got)
	}
}
