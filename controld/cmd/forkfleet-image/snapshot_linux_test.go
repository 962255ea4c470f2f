//go:build linux

package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
)

// checkSnapshotFiles mounts a view of the image's top snapshot read-only and
// checks file contents and existence.
func checkSnapshotFiles(t *testing.T, ctx context.Context, c *containerd.Client, diffs []digest.Digest, want map[string]string, exist ...string) {
	t.Helper()
	sn := c.SnapshotService(defaultSnapshotter)
	key := "forkfleet-imgtest-view-" + t.Name()
	mounts, err := sn.View(ctx, key, identity.ChainID(diffs).String())
	if err != nil {
		t.Fatalf("view snapshot: %v", err)
	}
	defer sn.Remove(ctx, key)
	dir := t.TempDir()
	if err := mount.All(mounts, dir); err != nil {
		t.Fatalf("mount view: %v", err)
	}
	defer mount.UnmountAll(dir, 0)
	for p, content := range want {
		b, err := os.ReadFile(filepath.Join(dir, p))
		if err != nil || string(b) != content {
			t.Errorf("%s: %q, %v; want %q", p, b, err, content)
		}
	}
	for _, p := range exist {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Errorf("%s missing from the unpacked image: %v", p, err)
		}
	}
}
