package peers

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestPath(t *testing.T) {
	dir := t.TempDir()
	exe, plain := filepath.Join(dir, "tool"), filepath.Join(dir, "data")
	os.WriteFile(exe, nil, 0o755)
	os.WriteFile(plain, nil, 0o644)
	p := Peer{Name: "tool", Package: "pkg", Paths: []string{filepath.Join(dir, "absent"), plain, exe}}
	if got, err := p.Path(); err != nil || got != exe {
		t.Fatalf("Path = %q, %v: want the first existing executable %s", got, err, exe)
	}
	p.Paths = p.Paths[:2]
	if _, err := p.Path(); !errors.Is(err, ErrMissing) {
		t.Fatalf("no executable: %v", err)
	}
}

func TestTable(t *testing.T) {
	pk := Packages()
	if !slices.IsSorted(pk) || len(slices.Compact(slices.Clone(pk))) != len(pk) {
		t.Fatalf("packages not sorted and unique: %v", pk)
	}
	seen := map[string]bool{}
	for _, p := range All() {
		if seen[p.Name] || p.Package == "" || len(p.Paths) == 0 {
			t.Fatalf("bad peer %+v", p)
		}
		seen[p.Name] = true
		for _, path := range p.Paths {
			if !filepath.IsAbs(path) {
				t.Fatalf("%s: %s is not absolute: peers never come from PATH", p.Name, path)
			}
		}
	}
	if got := Describe([]Peer{{Name: "a", Package: "b"}}); got != "a (package b)" {
		t.Fatal(got)
	}
}
