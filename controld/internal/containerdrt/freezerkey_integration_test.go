//go:build linux

package containerdrt

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/controld/internal/testenv"
)

// A runtime holds an empty cgroup of its cgroup parent frozen from New to
// Close (freezerkey.go), without freezing the parent, and removes it at
// Close.
func TestIntegrationFreezerKey(t *testing.T) {
	integration(t)
	state := t.TempDir()
	parent := testenv.CgroupParent(testCgroupParent)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := New(ctx, Config{
		Address:        testenv.Address(),
		Namespace:      testenv.Namespace(testNamespace),
		StateDir:       state,
		CheckpointRoot: filepath.Join(state, "checkpoints"),
		CgroupParent:   parent,
		NetHook:        testenv.NetHook(t),
		UserNamespaces: testenv.UserNamespaces(t),
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	hier := filepath.Join(r.cfg.CgroupRoot, "freezer")
	if _, err := os.Stat(hier); err != nil || isCgroupV2(r.cfg.CgroupRoot) {
		r.Close()
		t.Skipf("no cgroup v1 freezer at %s", hier)
	}
	key := filepath.Join(hier, parent, freezerKeyName)
	if r.freezerKey != key {
		t.Errorf("freezer key %q, want %q", r.freezerKey, key)
	}
	read := func(dir string) string {
		b, err := os.ReadFile(filepath.Join(dir, "freezer.state"))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	if st := read(key); st != freezerFrozen {
		t.Errorf("freezer key is %s, want %s", st, freezerFrozen)
	}
	if st := read(filepath.Join(hier, parent)); st != freezerThawed {
		t.Errorf("cgroup parent is %s, want %s", st, freezerThawed)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := os.Stat(key); !os.IsNotExist(err) {
		t.Errorf("freezer key still there after Close: %v", err)
	}
}
