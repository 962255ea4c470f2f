//go:build linux

package containerdrt

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
	cerrdefs "github.com/containerd/errdefs"

	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

func TestRuncCheckpointOf(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		id   string
		ok   bool
	}{
		{[]string{"runc", "--root", "/run/containerd/runc/ns", "--log", "l.json", "--log-format", "json", "checkpoint",
			"--image-path", "/ck/.tmp-ck-x/criu", "--work-path", "/w/sb-a-dump-1", "--leave-running", "sb-a"}, "sb-a", true},
		{[]string{"/usr/sbin/runc", "checkpoint", "sb-b"}, "sb-b", true},
		{[]string{"runc", "--root", "/r", "kill", "--all", "sb-a", "9"}, "", false},
		{[]string{"runc", "init"}, "", false},
		{[]string{"runc", "checkpoint"}, "", false},
		{[]string{"criu", "swrk", "3"}, "", false},
		// An id that happens to be "checkpoint" is still the last word.
		{[]string{"runc", "state", "checkpoint"}, "", false},
	} {
		id, ok := runcCheckpointOf(tc.argv, "runc")
		if id != tc.id || ok != tc.ok {
			t.Errorf("runcCheckpointOf(%q) = %q, %v; want %q, %v", tc.argv, id, ok, tc.id, tc.ok)
		}
	}
}

func TestTracedFromOutside(t *testing.T) {
	if tracerPid(os.Getpid()) != 0 {
		t.Skip("the test runs under a tracer")
	}
	procs := filepath.Join(t.TempDir(), "cgroup.procs")
	if err := os.WriteFile(procs, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if tracer, ok := tracedFromOutside(procs); ok {
		t.Errorf("the test process reported traced by %d", tracer)
	}
	if _, ok := tracedFromOutside(filepath.Join(t.TempDir(), "missing")); ok {
		t.Error("a missing cgroup reported traced")
	}
}

func TestIsTransientSnapshot(t *testing.T) {
	for name, want := range map[string]bool{
		"forkfleet-checkpoint-prepare-0123": true,
		"forkfleet-export-view-ab":          true,
		"forkfleet-checkpoint-0123":         false, // a committed checkpoint layer
		"sb-abc":                            false,
	} {
		if got := isTransientSnapshot(name); got != want {
			t.Errorf("isTransientSnapshot(%q) = %v", name, got)
		}
	}
}

// TestIntegrationRecoverCheckpoints leaves what a controld killed during a
// checkpoint leaves in containerd (an uncommitted layer under a lease, and
// a committed, GC-rooted checkpoint layer no record names) next to a kept
// checkpoint's layer, and checks RecoverCheckpoints removes exactly the
// former. Its own namespace: recovery sweeps the whole namespace.
func TestIntegrationRecoverCheckpoints(t *testing.T) {
	integration(t)
	r := newTestRuntime(t, "forkfleet-test-recover")
	ctx := r.ctx(context.Background())

	commitLayer := func(name string) {
		t.Helper()
		key := "recover-test-prep-" + randomHex(8)
		// Leased until the commit roots it (containerd's GC removes a
		// prepared snapshot nothing holds).
		lctx, done, err := r.client.WithLease(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer done(ctx)
		if _, err := r.sn.Prepare(lctx, key, ""); err != nil {
			t.Fatal(err)
		}
		if err := r.sn.Commit(lctx, name, key, snapshots.WithLabels(map[string]string{
			snapshotLabelGCRoot: time.Now().UTC().Format(time.RFC3339), snapshotLabelCheckpoint: "sb-recover-test",
		})); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			r.sn.Update(ctx, snapshots.Info{Name: name, Labels: map[string]string{}}, "labels."+snapshotLabelGCRoot)
			r.sn.Remove(ctx, name)
		})
	}
	kept := "forkfleet-checkpoint-" + randomHex(8)
	orphan := "forkfleet-checkpoint-" + randomHex(8)
	commitLayer(kept)
	commitLayer(orphan)
	// An interrupted Checkpoint: its prepared layer, held by its lease.
	lctx, _, err := r.client.WithLease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	prep := "forkfleet-checkpoint-prepare-" + randomHex(8)
	if _, err := r.sn.Prepare(lctx, prep, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.sn.Remove(ctx, prep) })
	leaseHolds := func() bool {
		ls, err := r.client.LeasesService().List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range ls {
			res, _ := r.client.LeasesService().ListResources(ctx, l)
			for _, rs := range res {
				if rs.ID == prep {
					return true
				}
			}
		}
		return false
	}
	if !leaseHolds() {
		t.Fatal("no lease holds the prepared layer")
	}

	if err := r.RecoverCheckpoints(context.Background(), []runtime.CheckpointRef{{Dir: "/nowhere", Snapshot: kept}}); err != nil {
		t.Fatalf("RecoverCheckpoints: %v", err)
	}
	if info, err := r.sn.Stat(ctx, kept); err != nil || info.Labels[snapshotLabelGCRoot] == "" {
		t.Errorf("kept checkpoint layer: %v %v", info.Labels, err)
	}
	for _, gone := range []string{orphan, prep} {
		if _, err := r.sn.Stat(ctx, gone); !cerrdefs.IsNotFound(err) {
			t.Errorf("%s after recovery: %v, want not found", gone, err)
		}
	}
	if leaseHolds() {
		t.Error("the interrupted checkpoint's lease survived recovery")
	}
}
