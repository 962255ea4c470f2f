//go:build linux

package harness

import (
	"bytes"
	"strings"
	"testing"
)

func TestDenseTextDeterministic(t *testing.T) {
	a, b := DenseText(200, 60), DenseText(200, 60)
	if a != b {
		t.Fatal("dense text differs between calls")
	}
	if n := strings.Count(a, "\n"); n != 60 {
		t.Fatalf("%d lines", n)
	}
	if !strings.Contains(a, "\x1b[3") {
		t.Fatal("no ANSI colors")
	}
}

func TestPhotoImage(t *testing.T) {
	a := PhotoImage(64, 40, 7)
	if !bytes.Equal(a, PhotoImage(64, 40, 7)) {
		t.Fatal("not deterministic")
	}
	if bytes.Equal(a, PhotoImage(64, 40, 8)) {
		t.Fatal("seed ignored")
	}
	if len(a) != 64*40*4 {
		t.Fatalf("len %d", len(a))
	}
	colors := map[[3]byte]bool{}
	for i := 0; i < len(a); i += 4 {
		colors[[3]byte{a[i], a[i+1], a[i+2]}] = true
	}
	// Photographic: nearly every pixel a different color.
	if len(colors) < 64*40/2 {
		t.Fatalf("only %d colors", len(colors))
	}
}
