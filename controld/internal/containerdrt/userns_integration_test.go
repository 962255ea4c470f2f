//go:build linux

package containerdrt

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/userns"
)

// hostIDs reads what the host sees of a sandbox's init: its uids and gids
// (real, effective, saved, filesystem) in /proc/<pid>/status, and its
// user namespace's uid_map.
func hostIDs(t *testing.T, pid uint32) (uids, gids []string, uidMap string) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Uid:"); ok {
			uids = strings.Fields(v)
		}
		if v, ok := strings.CutPrefix(line, "Gid:"); ok {
			gids = strings.Fields(v)
		}
	}
	m, err := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", pid))
	if err != nil {
		t.Fatal(err)
	}
	return uids, gids, strings.Join(strings.Fields(string(m)), " ")
}

// sandboxRange is the range a sandbox's container holds, checked against
// what the host sees of its init: root in the sandbox is the range's first
// uid on the host, in every id the kernel keeps, never uid 0.
func sandboxRange(t *testing.T, r *Runtime, inst runtime.Instance) userns.Range {
	t.Helper()
	c, err := r.client.LoadContainer(r.ctx(context.Background()), inst.ID)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(r.ctx(context.Background()))
	if err != nil {
		t.Fatal(err)
	}
	rng, err := rangeOfContainer(info)
	if err != nil || rng == nil {
		t.Fatalf("%s: range %v, %v: not in a user namespace", inst.ID, rng, err)
	}
	if !r.cfg.UserNamespaces.Contains(*rng) || rng.UID == 0 || rng.GID == 0 {
		t.Fatalf("%s: range %+v is not one of the pool's", inst.ID, rng)
	}
	uids, gids, uidMap := hostIDs(t, inst.PID)
	wantU, wantG := fmt.Sprint(rng.UID), fmt.Sprint(rng.GID)
	for i := range 4 {
		if i >= len(uids) || i >= len(gids) || uids[i] != wantU || gids[i] != wantG {
			t.Fatalf("%s: init (pid %d, root inside) has host uids %v gids %v, want all %s/%s", inst.ID, inst.PID, uids, gids, wantU, wantG)
		}
	}
	if want := fmt.Sprintf("0 %d %d", rng.UID, userns.Size); uidMap != want {
		t.Errorf("%s: uid_map %q, want %q", inst.ID, uidMap, want)
	}
	return *rng
}

// hostOwner is the owner the host sees of a file in a sandbox's root (the
// test trusts its own sandbox's links; controld never does this).
func hostOwner(t *testing.T, inst runtime.Instance, path string) (uint32, uint32) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(fmt.Sprintf("/proc/%d/root%s", inst.PID, path), &st); err != nil {
		t.Fatalf("%s: %s: %v", inst.ID, path, err)
	}
	return st.Uid, st.Gid
}

// TestIntegrationUserNamespace: root in a sandbox is not root on the host
// (its init's uids, the files it writes), each sandbox has a range of its
// own, and checkpoints of both tiers, replicas, precreated fork slots and
// a fan-out of replicas (every restore reading the images as its own
// root: one in eleven failed on their permissions before) still verify.
func TestIntegrationUserNamespace(t *testing.T) {
	integration(t)
	r := newTestRuntime(t, testNamespace)
	if r.cfg.UserNamespaces == nil {
		t.Fatal("the test runtime runs sandboxes in the host's user namespace: controld's default is a user namespace each")
	}
	importTestImage(t, r)

	src := bootT(t, r, testSpec(uniqueID("uns")))
	rng := sandboxRange(t, r, src)
	mustCall(t, src, "set userns-value")
	for _, cmd := range []string{
		"write /var/lib/userns/root-file by-root",
		"write /var/lib/userns/agent-file by-agent",
		"chown /var/lib/userns/agent-file 1000",
	} {
		if got := mustCall(t, src, cmd); got != "ok" {
			t.Fatalf("%s: %s", cmd, got)
		}
	}
	if u, g := hostOwner(t, src, "/var/lib/userns/root-file"); u != rng.UID || g != rng.GID {
		t.Errorf("a file root wrote in the sandbox is owned by %d:%d on the host, want %d:%d", u, g, rng.UID, rng.GID)
	}
	if u, g := hostOwner(t, src, "/var/lib/userns/agent-file"); u != rng.HostUID(1000) || g != rng.HostGID(1000) {
		t.Errorf("uid 1000's file is owned by %d:%d on the host, want %d:%d", u, g, rng.HostUID(1000), rng.HostGID(1000))
	}
	// Files of the image: root's inside, the range's first uid outside.
	if u, _ := hostOwner(t, src, "/etc"); u != rng.UID {
		t.Errorf("the image's /etc is owned by host uid %d, want %d", u, rng.UID)
	}

	// Memory tier: each replica runs in a range of its own, with the
	// source's memory and files (in the replica's ids).
	mem := checkpointT(t, r, src.ID, runtime.TierMemory, false)
	// Shared once Checkpoint returns (after the thaw, not in the frozen
	// window): the directory 0711, every image 0644.
	imgDir := filepath.Join(mem.Ref.Dir, criuImageDir)
	if st, err := os.Stat(imgDir); err != nil {
		t.Error(err)
	} else if st.Mode().Perm() != 0o711 {
		t.Errorf("images directory %s: mode %o, want 0711", imgDir, st.Mode().Perm())
	}
	if ents, err := os.ReadDir(imgDir); err != nil || len(ents) == 0 {
		t.Errorf("images directory %s: %d entries (%v)", imgDir, len(ents), err)
	} else {
		for _, e := range ents {
			if fi, err := e.Info(); err != nil {
				t.Error(err)
			} else if fi.Mode().Perm() != 0o644 {
				t.Errorf("image %s: mode %o, want 0644", e.Name(), fi.Mode().Perm())
			}
		}
	}
	seen := map[userns.Range]string{rng: src.ID}
	verify := func(f runtime.Instance) {
		t.Helper()
		frng := sandboxRange(t, r, f)
		if other, ok := seen[frng]; ok {
			t.Errorf("%s holds the range of %s (%+v)", f.ID, other, frng)
		}
		seen[frng] = f.ID
		if got := mustCall(t, f, "get"); got != "userns-value" {
			t.Errorf("%s: value %q", f.ID, got)
		}
		if got := mustCall(t, f, "read /var/lib/userns/agent-file"); got != "by-agent" {
			t.Errorf("%s: file %q", f.ID, got)
		}
		if u, g := hostOwner(t, f, "/var/lib/userns/root-file"); u != frng.UID || g != frng.GID {
			t.Errorf("%s: root's file is owned by %d:%d on the host, want %d:%d", f.ID, u, g, frng.UID, frng.GID)
		}
		if u, _ := hostOwner(t, f, "/var/lib/userns/agent-file"); u != frng.HostUID(1000) {
			t.Errorf("%s: uid 1000's file is owned by host uid %d, want %d", f.ID, u, frng.HostUID(1000))
		}
		if got := mustCall(t, f, "write /var/lib/userns/fork-file x"); got != "ok" {
			t.Errorf("%s: write: %s", f.ID, got)
		}
		if u, _ := hostOwner(t, f, "/var/lib/userns/fork-file"); u != frng.UID {
			t.Errorf("%s: a file root wrote is owned by host uid %d, want %d", f.ID, u, frng.UID)
		}
	}
	// Twelve restores of one checkpoint, one after another.
	var forks []runtime.Instance
	for range 12 {
		f := restoreT(t, r, testSpec(uniqueID("unsf")), mem.Ref)
		verify(f)
		forks = append(forks, f)
	}
	// Their images: readable by any fork's root, reachable by path by root
	// alone.
	var st unix.Stat_t
	if err := unix.Stat(mem.Ref.Dir, &st); err != nil || st.Mode&0o077 != 0 {
		t.Errorf("checkpoint directory mode %o (%v): other users of the host reach its images", st.Mode&0o777, err)
	}
	if ents, _ := os.ReadDir(mem.Ref.Dir); len(ents) > 0 {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), ".restore-") {
				t.Errorf("a replica's image view is left after its restore: %s", e.Name())
			}
		}
	}
	// A fork slot: precreated, then restored.
	slot := testSpec(uniqueID("unsp"))
	if err := r.PrecreateRestore(context.Background(), slot, mem.Ref); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteQuiet(r, slot.ID) })
	verify(restoreT(t, r, slot, mem.Ref))

	// A replica checkpointed in turn (its range is not its source's).
	grand := checkpointT(t, r, forks[0].ID, runtime.TierMemory, false)
	verify(restoreT(t, r, testSpec(uniqueID("unsg")), grand.Ref))

	// Disk tier: the layer only, booted in the replica's range.
	disk := checkpointT(t, r, src.ID, runtime.TierDisk, false)
	d := restoreT(t, r, testSpec(uniqueID("unsd")), disk.Ref)
	drng := sandboxRange(t, r, d)
	if got := mustCall(t, d, "read /var/lib/userns/agent-file"); got != "by-agent" {
		t.Errorf("disk replica: file %q", got)
	}
	if u, _ := hostOwner(t, d, "/var/lib/userns/agent-file"); u != drng.HostUID(1000) {
		t.Errorf("disk replica: uid 1000's file is owned by host uid %d, want %d", u, drng.HostUID(1000))
	}

	// Deleted sandboxes give their ranges back.
	for _, f := range forks {
		deleteQuiet(r, f.ID)
	}
	reserved, err := r.cfg.UserNamespaces.Reserved()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range forks {
		if _, ok := reserved[r.rangeOwner(f.ID)]; ok {
			t.Errorf("%s: deleted, its range still reserved", f.ID)
		}
	}
	if _, ok := reserved[r.rangeOwner(src.ID)]; !ok {
		t.Errorf("%s: running, its range not reserved (%v)", src.ID, reserved)
	}
}
