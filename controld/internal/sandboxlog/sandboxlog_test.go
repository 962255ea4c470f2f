package sandboxlog

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A flood far larger than the budget leaves at most the budget on disk,
// and the most recent output is what is kept.
func TestBudgetHolds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sb.log")
	w, err := Open(path, MinBudget)
	if err != nil {
		t.Fatal(err)
	}
	line := []byte(strings.Repeat("x", 999) + "\n")
	for i := range 10_000 {
		if i == 9_999 {
			line = []byte("the last line\n")
		}
		if n, err := w.Write(line); n != len(line) || err != nil {
			t.Fatalf("write %d: %d %v", i, n, err)
		}
	}
	w.Close()
	var total int64
	for _, p := range []string{path, path + ".1"} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > MinBudget/2 {
			t.Fatalf("%s holds %d bytes, more than half the budget", p, st.Size())
		}
		total += st.Size()
	}
	if total > MinBudget || total < MinBudget/2 {
		t.Fatalf("%d bytes on disk for a budget of %d", total, MinBudget)
	}
	if tail := Tail(path, 14); string(tail) != "the last line\n" {
		t.Fatalf("tail %q", tail)
	}
	// The tail spans the rotation when the current file is short.
	if tail := Tail(path, MinBudget); int64(len(tail)) != total || !bytes.HasSuffix(tail, []byte("the last line\n")) {
		t.Fatalf("tail of %d bytes, want %d", len(tail), total)
	}
}

// Drain empties its readers whatever happens to the log, and a stale log
// of the same id, or a link planted at its path, is replaced, not followed.
func TestDrainAndReplace(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sb.log")
	target := filepath.Join(dir, "victim")
	os.WriteFile(target, []byte("keep"), 0o600)
	os.Symlink(target, path)
	os.WriteFile(path+".1", []byte("stale"), 0o600)
	w, err := Open(path, MinBudget)
	if err != nil {
		t.Fatal(err)
	}
	r1, w1 := io.Pipe()
	r2, w2 := io.Pipe()
	go func() { w1.Write([]byte("out\n")); w1.Close() }()
	go func() { w2.Write([]byte("err\n")); w2.Close() }()
	Drain(w, r1, r2)
	w.Close()
	got, _ := os.ReadFile(path)
	if len(got) != 8 {
		t.Fatalf("log %q", got)
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Fatalf("followed the link: %q", b)
	}
	if _, err := os.Stat(path + ".1"); !os.IsNotExist(err) {
		t.Fatal("stale half kept")
	}
	if _, err := Open(path, 1000); err == nil {
		t.Fatal("budget below the minimum accepted")
	}
}
