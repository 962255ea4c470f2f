//go:build linux

package containerdrt

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/forkfleet/forkfleet/api/exectest"
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
	key := r.freezerKey
	if filepath.Dir(key) != filepath.Join(hier, parent) || !strings.HasPrefix(filepath.Base(key), freezerKeyName+".") {
		t.Errorf("freezer key %q, want %s/%s.<pid>.<n>", key, filepath.Join(hier, parent), freezerKeyName)
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

// v1FreezerRoot is the host's cgroup root; the test is skipped without a
// cgroup v1 freezer there.
func v1FreezerRoot(t *testing.T) string {
	t.Helper()
	root := "/sys/fs/cgroup"
	hier := filepath.Join(root, "freezer")
	if _, err := os.Stat(hier); err != nil || isCgroupV2(root) {
		t.Skipf("no cgroup v1 freezer at %s", hier)
	}
	return root
}

// Runtimes sharing a cgroup parent (a test's controld beside the host's,
// both under /forkfleet) each hold a key of their own: one's Close leaves
// the other's key frozen.
func TestIntegrationFreezerKeyPerRuntime(t *testing.T) {
	integration(t)
	root := v1FreezerRoot(t)
	parent := testenv.CgroupParent(testCgroupParent)
	a, err := holdFreezerKey(root, parent)
	if err != nil {
		t.Fatal(err)
	}
	b, err := holdFreezerKey(root, parent)
	if err != nil {
		releaseFreezerKey(a)
		t.Fatal(err)
	}
	defer releaseFreezerKey(b)
	if a == b {
		t.Fatalf("two runtimes share the freezer key %s", a)
	}
	if err := releaseFreezerKey(a); err != nil {
		t.Fatal(err)
	}
	st, err := os.ReadFile(filepath.Join(b, "freezer.state"))
	if err != nil || strings.TrimSpace(string(st)) != freezerFrozen {
		t.Fatalf("the other runtime's key after one released its own: %q %v, want %s", st, err, freezerFrozen)
	}
	if err := releaseFreezerKey(b); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(b); !os.IsNotExist(err) {
		t.Errorf("freezer key still there after its release: %v", err)
	}
}

func TestMain(m *testing.M) {
	exectest.Main()
	os.Exit(m.Run())
}

// A sandbox whose process execs from a thread other than its leader
// freezes: without thawing in between, the exec's thread waits for the
// frozen others to exit and the cgroup stays FREEZING for good (it did in
// round 1 of a freeze-thaw loop, and failed a fresh-clone CI run's import
// with "stuck in FREEZING").
func TestIntegrationFreezeThroughExecFromAThread(t *testing.T) {
	integration(t)
	root := v1FreezerRoot(t)
	retries := prometheus.NewCounter(prometheus.CounterOpts{Name: "freeze_retries_total"})
	r := &Runtime{cfg: Config{CgroupRoot: root, CgroupParent: testenv.CgroupParent(testCgroupParent)}, freezeRetries: retries}
	id := "exec-from-thread-" + randomHex(4)
	dir := filepath.Dir(r.freezerStateFile(id))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exectest.Command(-1)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.WriteFile(r.freezerStateFile(id), []byte(freezerThawed), 0)
		cmd.Process.Kill()
		cmd.Wait()
		os.Remove(dir)
	})
	if err := os.WriteFile(r.procsFile(id), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	const rounds = 300
	for i := range rounds {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := r.setFreezer(ctx, id, freezerFrozen)
		if err == nil {
			err = r.setFreezer(ctx, id, freezerThawed)
		}
		cancel()
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		time.Sleep(time.Duration(i%7) * 300 * time.Microsecond)
	}
	if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the exec helper died: %v", err)
	}
	t.Logf("%d rounds, %v thaw-and-freeze retries", rounds, testutil.ToFloat64(retries))
}
