package screen

import "testing"

func TestBounds(t *testing.T) {
	for n, want := range map[int]bool{MinEdge - 1: false, MinEdge: true, 1280: true, MaxEdge: true, MaxEdge + 1: false, 0: false, -1: false} {
		if got := EdgeOK(n); got != want {
			t.Errorf("EdgeOK(%d) = %v", n, got)
		}
	}
	for d, want := range map[int]bool{0: true, Depth: true, 8: false, 16: false, 30: false, 32: false} {
		if got := DepthOK(d); got != want {
			t.Errorf("DepthOK(%d) = %v", d, got)
		}
	}
}
