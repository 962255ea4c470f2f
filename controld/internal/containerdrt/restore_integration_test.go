//go:build linux

package containerdrt

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// mountPoints returns the mount points of a sandbox's init process.
func mountPoints(t *testing.T, pid uint32) map[string]string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.FormatUint(uint64(pid), 10) + "/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{} // mount point -> fs type
	for _, l := range strings.Split(string(b), "\n") {
		// id parent major:minor root mountpoint options ... - fstype source super
		pre, post, ok := strings.Cut(l, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 1 {
			continue
		}
		out[f[4]] = g[0]
	}
	return out
}

// TestIntegrationRunOnRootfs checks that a new sandbox has no tmpfs /run
// (one tmpfs fewer for CRIU to tar on every dump and restore), that guestd's
// socket there works, and that memory and disk forks keep the layout.
func TestIntegrationRunOnRootfs(t *testing.T) {
	integration(t)
	r := newTestRuntime(t, testNamespace)
	importTestImage(t, r)

	src := bootT(t, r, testSpec(uniqueID("runfs")))
	if fsType, ok := mountPoints(t, src.PID)["/run"]; ok {
		t.Fatalf("/run is a %s mount in a new sandbox, want it on the writable layer", fsType)
	}
	mustCall(t, src, "set run-on-rootfs")
	res := checkpointT(t, r, src.ID, runtime.TierMemory, false)
	meta, err := readMeta(res.Ref.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if meta.RunLayout != runLayoutRootfs {
		t.Fatalf("checkpoint run layout %q, want %q", meta.RunLayout, runLayoutRootfs)
	}
	f := restoreT(t, r, testSpec(uniqueID("runfsf")), res.Ref)
	if got := mustCall(t, f, "get"); got != "run-on-rootfs" {
		t.Errorf("fork value %q", got)
	}
	if fsType, ok := mountPoints(t, f.PID)["/run"]; ok {
		t.Errorf("/run is a %s mount in a fork", fsType)
	}
	disk := checkpointT(t, r, src.ID, runtime.TierDisk, false)
	d := restoreT(t, r, testSpec(uniqueID("runfsd")), disk.Ref)
	if fsType, ok := mountPoints(t, d.PID)["/run"]; ok {
		t.Errorf("/run is a %s mount in a disk-tier fork", fsType)
	}
}

// TestIntegrationPrecreatedRestoreDiscard checks that a precreated fork (a
// shim holding restore options, no process yet) is discarded at once and
// completely, by Discard and by Delete, and that Restore of a precreated
// fork with another spec replaces it.
func TestIntegrationPrecreatedRestoreDiscard(t *testing.T) {
	integration(t)
	r := newTestRuntime(t, testNamespace)
	importTestImage(t, r)
	ctx := context.Background()

	src := bootT(t, r, testSpec(uniqueID("pdsrc")))
	mustCall(t, src, "set precreated-discard")
	res := checkpointT(t, r, src.ID, runtime.TierMemory, false)

	for _, how := range []string{"discard", "delete"} {
		f := testSpec(uniqueID("pd" + how))
		if err := r.PrecreateRestore(ctx, f, res.Ref); err != nil {
			t.Fatal(err)
		}
		if got, _ := r.Get(ctx, f.ID); got.Status != runtime.StatusCreated || got.PID != 0 {
			t.Errorf("precreated fork: status %v pid %d, want created without a process", got.Status, got.PID)
		}
		start := time.Now()
		var err error
		if how == "discard" {
			err = r.Discard(ctx, f.ID)
		} else {
			err = r.Delete(ctx, f.ID)
		}
		if err != nil {
			t.Fatalf("%s: %v", how, err)
		}
		// No process means no exit to wait for: this must not take the
		// cleanup timeout.
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%s of a precreated fork took %v", how, d)
		}
		assertGone(t, r, f.ID)
		if err := r.Discard(ctx, f.ID); !errors.Is(err, errdefs.ErrNotFound) {
			t.Errorf("second discard: %v", err)
		}
	}

	// A Restore whose spec differs from the precreated one replaces it.
	f := testSpec(uniqueID("pdmis"))
	if err := r.PrecreateRestore(ctx, f, res.Ref); err != nil {
		t.Fatal(err)
	}
	f.ACIToken = "aci-other"
	inst := restoreT(t, r, f, res.Ref)
	if got := mustCall(t, inst, "get"); got != "precreated-discard" {
		t.Errorf("fork value %q", got)
	}
}

// TestIntegrationRestoreBaseOnce: a checkpoint's metadata, image and CRIU
// images' layout are read once for all its forks (restoreBase), not per
// replica, and forgotten when the checkpoint is deleted.
func TestIntegrationRestoreBaseOnce(t *testing.T) {
	integration(t)
	r := newTestRuntime(t, testNamespace)
	importTestImage(t, r)
	ctx := context.Background()

	src := bootT(t, r, testSpec(uniqueID("rbsrc")))
	mustCall(t, src, "set restore-base")
	res := checkpointT(t, r, src.ID, runtime.TierMemory, false)
	first := restoreT(t, r, testSpec(uniqueID("rbf1")), res.Ref)
	if got := mustCall(t, first, "get"); got != "restore-base" {
		t.Fatalf("first fork value %q", got)
	}
	// The checkpoint's directory does not change once committed: a second
	// fork does not read its metadata again (here made unreadable).
	meta := filepath.Join(res.Ref.Dir, metaFile)
	saved, err := os.ReadFile(meta)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(meta, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	second := restoreT(t, r, testSpec(uniqueID("rbf2")), res.Ref)
	if got := mustCall(t, second, "get"); got != "restore-base" {
		t.Fatalf("second fork value %q", got)
	}
	if err := os.WriteFile(meta, saved, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, inst := range []runtime.Instance{first, second} {
		if err := r.Delete(ctx, inst.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.DeleteCheckpoint(ctx, res.Ref); err != nil {
		t.Fatal(err)
	}
	if _, ok := r.restoreBases.Load(res.Ref.Dir); ok {
		t.Fatal("a deleted checkpoint's restore base is kept")
	}
}

// TestIntegrationFailedRestoreLeavesNothing pins what a refused or failed
// Restore leaves: nothing of the replica (container, task, snapshot,
// cgroups, log, network namespace, its view of the CRIU images, its user
// namespace range), and a sandbox holding the id untouched.
func TestIntegrationFailedRestoreLeavesNothing(t *testing.T) {
	integration(t)
	r := newTestRuntime(t, testNamespace)
	importTestImage(t, r)
	ctx := context.Background()

	src := bootT(t, r, testSpec(uniqueID("frsrc")))
	mustCall(t, src, "set failed-restore")
	res := checkpointT(t, r, src.ID, runtime.TierMemory, false)
	reserved := func() int {
		if r.cfg.UserNamespaces == nil {
			return 0
		}
		m, err := r.cfg.UserNamespaces.Reserved()
		if err != nil {
			t.Fatal(err)
		}
		return len(m)
	}
	ranges := reserved()
	leftNothing := func(what, id string, ref runtime.CheckpointRef) {
		t.Helper()
		assertGone(t, r, id)
		if _, err := os.Stat(r.net.NetNS(id)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: network namespace left (%v)", what, err)
		}
		if _, err := os.Stat(forkImagesDir(ref.Dir, id)); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: the replica's view of the images left (%v)", what, err)
		}
		if n := reserved(); n != ranges {
			t.Errorf("%s: %d user namespace ranges reserved, %d before", what, n, ranges)
		}
	}

	// Refused before anything is made.
	other := res.Ref
	other.Snapshot = "not-its-layer"
	id := uniqueID("frlayer")
	if _, err := r.Restore(ctx, testSpec(id), other); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("restore naming another layer: %v, want ErrFailedPrecondition", err)
	}
	leftNothing("another layer", id, res.Ref)

	// Refused once its range and image view are made: the id's network is
	// the running sandbox's, which keeps it and runs on.
	if _, err := r.Restore(ctx, testSpec(src.ID), res.Ref); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("restore into a running sandbox's id: %v, want ErrAlreadyExists", err)
	}
	if _, err := os.Stat(forkImagesDir(res.Ref.Dir, src.ID)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("taken id: the replica's view of the images left (%v)", err)
	}
	if n := reserved(); n != ranges {
		t.Errorf("taken id: %d user namespace ranges reserved, %d before", n, ranges)
	}
	if _, err := os.Stat(r.net.NetNS(src.ID)); err != nil {
		t.Errorf("taken id: the running sandbox's network namespace: %v", err)
	}
	if got := mustCall(t, src, "get"); got != "failed-restore" {
		t.Errorf("the sandbox holding the id after a restore into it: %q", got)
	}

	// Failed at the container, its network made: the checkpoint's layer
	// is gone.
	gone := checkpointT(t, r, src.ID, runtime.TierMemory, false)
	if err := r.sn.Remove(r.ctx(ctx), gone.Ref.Snapshot); err != nil {
		t.Fatal(err)
	}
	id = uniqueID("frnolayer")
	if _, err := r.Restore(ctx, testSpec(id), gone.Ref); err == nil {
		t.Error("restore of a checkpoint whose layer is gone succeeded")
	} else {
		t.Logf("restore of a checkpoint whose layer is gone: %v", err)
	}
	leftNothing("layer gone", id, gone.Ref)
}
