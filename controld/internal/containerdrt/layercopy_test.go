//go:build linux

package containerdrt

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/api/errdefs"
)

// hostSecret is a host directory the copier must never read from or write
// into: a file holding a secret no copy may carry.
func hostSecret(t *testing.T) (dir string, secret []byte) {
	t.Helper()
	dir = t.TempDir()
	secret = []byte("host-secret-" + randomHex(16))
	if err := os.WriteFile(filepath.Join(dir, "x"), secret, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, secret
}

// assertNoHostBytes fails when any regular file under dst holds secret, or
// the host file is gone or changed.
func assertNoHostBytes(t *testing.T, dst, hostDir string, secret []byte) {
	t.Helper()
	filepath.WalkDir(dst, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if b, _ := os.ReadFile(p); bytes.Contains(b, secret) {
			t.Errorf("%s carries the host's bytes", p)
		}
		return nil
	})
	if b, err := os.ReadFile(filepath.Join(hostDir, "x")); err != nil || !bytes.Equal(b, secret) {
		t.Errorf("host file touched: %q, %v", b, err)
	}
}

// TestLayerCopyTypeChangeToSymlink: a directory copied by the first pass
// is a symlink to a host directory by the second. The copy must not
// descend into it, and removing what the directory held must not remove
// the host's files through the symlink now in the copy.
func TestLayerCopyTypeChangeToSymlink(t *testing.T) {
	hostDir, secret := hostSecret(t)
	src, dst := t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "a", "x"), []byte("sandbox"), 0o644); err != nil {
		t.Fatal(err)
	}
	lc := newLayerCopier(src, dst)
	if err := lc.First(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(src, "a")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(hostDir, filepath.Join(src, "a")); err != nil {
		t.Fatal(err)
	}
	if err := lc.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if target, err := os.Readlink(filepath.Join(dst, "a")); err != nil || target != hostDir {
		t.Errorf("copy of a: %q, %v; want the symlink", target, err)
	}
	assertNoHostBytes(t, dst, hostDir, secret)

	// And back: a symlink in the copy becomes a directory again.
	os.Remove(filepath.Join(src, "a"))
	if err := os.MkdirAll(filepath.Join(src, "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "a", "x"), []byte("sandbox2"), 0o644); err != nil {
		t.Fatal(err)
	}
	lc2 := newLayerCopier(src, dst)
	lc2.seen, lc2.links = lc.seen, lc.links
	if err := lc2.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "a", "x")); err != nil || string(b) != "sandbox2" {
		t.Errorf("a/x in the copy: %q, %v", b, err)
	}
	assertNoHostBytes(t, dst, hostDir, secret)
}

// swapper exchanges a directory and a symlink to a host directory in src
// as fast as it can (renameat2 RENAME_EXCHANGE), as root in a sandbox can,
// until stopped.
func swapper(t *testing.T, src string) (stop func()) {
	t.Helper()
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		a, b := filepath.Join(src, "d"), filepath.Join(src, "l")
		for {
			select {
			case <-done:
				return
			default:
			}
			unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE)
		}
	}()
	return func() { close(done); <-stopped }
}

// TestLayerCopyRacedSwaps: copies race a directory swapped for a symlink to
// a host directory; none carries a host byte, and the host directory is
// never touched (TestIntegrationLayerCopyRace does 1,000 against a real
// sandbox).
func TestLayerCopyRacedSwaps(t *testing.T) {
	hostDir, secret := hostSecret(t)
	n := 200
	for i := range n {
		src, dst := t.TempDir(), t.TempDir()
		if err := os.MkdirAll(filepath.Join(src, "d"), 0o755); err != nil {
			t.Fatal(err)
		}
		for j := range 8 {
			if err := os.WriteFile(filepath.Join(src, "d", "f"+strconv.Itoa(j)), []byte("sandbox"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Symlink(hostDir, filepath.Join(src, "l")); err != nil {
			t.Fatal(err)
		}
		lc := newLayerCopier(src, dst)
		stop := swapper(t, src)
		err := lc.First(context.Background())
		stop() // frozen from here
		if err != nil {
			t.Fatalf("copy %d: first pass: %v", i, err)
		}
		if err := lc.Sync(context.Background()); err != nil {
			t.Fatalf("copy %d: second pass: %v", i, err)
		}
		assertNoHostBytes(t, dst, hostDir, secret)
		if t.Failed() {
			t.Fatalf("copy %d of %d carried or touched host bytes", i, n)
		}
		os.RemoveAll(src)
		os.RemoveAll(dst)
	}
}

// TestLayerCopyDepthBound: a layer nested deeper than the copier's bound
// fails the copy with FailedPrecondition instead of exhausting descriptors.
func TestLayerCopyDepthBound(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, strings.Repeat("d/", maxLayerDepth+2)), 0o755); err != nil {
		t.Fatal(err)
	}
	err := newLayerCopier(src, dst).First(context.Background())
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("copy of a %d-deep layer: %v, want FailedPrecondition", maxLayerDepth+2, err)
	}
}
