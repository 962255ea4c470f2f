//go:build linux

package containerdrt

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// The merged digest of layers equals the digest of the same tree written
// flat, ignores volatile paths, and follows no link.
func TestLayerDigest(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("whiteouts (char 0:0) and trusted.overlay xattrs need root")
	}
	put := func(root, rel, content string) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	lower, upper, flat := t.TempDir(), t.TempDir(), t.TempDir()
	put(lower, "a/x", "old")
	put(lower, "a/y", "deleted above")
	put(lower, "b/z", "kept")
	put(lower, "o/hidden", "under an opaque directory")
	put(lower, "tmp/t", "volatile")
	put(upper, "a/x", "new")
	if err := unix.Mknod(filepath.Join(upper, "a/y"), unix.S_IFCHR|0o600, 0); err != nil {
		t.Fatal(err)
	}
	put(upper, "o/shown", "opaque")
	if err := unix.Setxattr(filepath.Join(upper, "o"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", filepath.Join(upper, "c")); err != nil {
		t.Fatal(err)
	}
	put(upper, "home/u/.cache/x", "volatile")

	put(flat, "a/x", "new")
	put(flat, "b/z", "kept")
	put(flat, "o/shown", "opaque")
	if err := os.Symlink("/etc", filepath.Join(flat, "c")); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(flat, "home/u"), 0o755)

	merged, err := layerDigest([]string{upper, lower})
	if err != nil {
		t.Fatal(err)
	}
	want, err := layerDigest([]string{flat})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(merged, want) {
		t.Errorf("merged layers digest %x, the same tree flat %x", merged, want)
	}
	put(lower, "tmp/t2", "more volatile")
	if again, _ := layerDigest([]string{upper, lower}); !bytes.Equal(again, merged) {
		t.Error("a change under tmp/ changed the digest")
	}
	put(upper, "b/z", "changed")
	if changed, _ := layerDigest([]string{upper, lower}); bytes.Equal(changed, merged) {
		t.Error("a changed file did not change the digest")
	}
	// A FIFO does not block the walk; a link to a directory is not followed.
	if err := unix.Mkfifo(filepath.Join(upper, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := layerDigest([]string{upper, lower}); err != nil {
		t.Fatal(err)
	}
}
