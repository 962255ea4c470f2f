package containerdrt

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// devListing describes a sandbox's /dev as its own root sees it: each
// entry's name, type and mode, owner relative to the sandbox's root, and
// link target (read by the test through /proc, trusted here).
func devListing(t *testing.T, pid uint32) []string {
	t.Helper()
	p := "/proc/" + strconv.FormatUint(uint64(pid), 10)
	root, err := sandboxRoot(p + "/uid_map")
	if err != nil {
		t.Fatal(err)
	}
	dir := p + "/root/dev"
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dir, e.Name()), &st); err != nil {
			t.Fatal(err)
		}
		owner := int64(st.Uid) - int64(root)
		if st.Mode&unix.S_IFMT == unix.S_IFCHR || e.Name() == "mqueue" {
			// The host's node, bound; the IPC namespace's mqueue, whose
			// root a restore's CRIU makes as the host's root (tar or not).
			owner = 0
		}
		s := fmt.Sprintf("%s %o %d", e.Name(), st.Mode, owner)
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			target, _ := os.Readlink(filepath.Join(dir, e.Name()))
			s += " -> " + target
		}
		out = append(out, s)
	}
	return out
}

// tarredDev says the checkpoint's images hold a tar of a tmpfs mounted at
// /dev (CRIU's tmpfs-dev-N.tar.gz.img, N the mount's id).
func tarredDev(t *testing.T, dir string) bool {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, criuImageDir, "tmpfs-dev-*.tar.gz.img"))
	if err != nil {
		t.Fatal(err)
	}
	return len(m) > 0
}

// TestIntegrationDevLayout checks the replica's own /dev (devlayout.go): a
// sandbox whose /dev is runc's is dumped without its tar, and its replicas
// (and theirs) get the same /dev, bound from a tmpfs controld made and
// unmounted from the host after the restore, with a deleted file open on
// /dev (a CRIU ghost) brought back; a sandbox that put anything else in
// /dev (links out of the sandbox, a hard link, a fifo, a huge sparse file,
// many files) keeps CRIU's tar, and its replicas get all of it back.
func TestIntegrationDevLayout(t *testing.T) {
	integration(t)
	r := newTestRuntime(t, testNamespace)
	importTestImage(t, r)

	src := bootT(t, r, testSpec(uniqueID("dev")))
	want := devListing(t, src.PID)
	t.Logf("source /dev: %q", want)
	if names, err := standardDev(src.PID); err != nil {
		t.Fatalf("a new sandbox's /dev is not the template's: %v", err)
	} else {
		t.Logf("template entries: %q", names)
	}
	// A deleted file held open on /dev: CRIU restores it as a ghost file.
	if got := mustCall(t, src, "write /dev/ghost held-open"); got != "ok" {
		t.Fatal(got)
	}
	if got := mustCall(t, src, "unlink /dev/ghost"); got != "ok" {
		t.Fatal(got)
	}
	res := checkpointT(t, r, src.ID, runtime.TierMemory, false)
	meta, err := readMeta(res.Ref.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if meta.DevLayout != devLayoutBind || tarredDev(t, res.Ref.Dir) {
		t.Fatalf("checkpoint dev layout %q (entries %q, tarred %v), want %q and no tar", meta.DevLayout, meta.DevEntries, tarredDev(t, res.Ref.Dir), devLayoutBind)
	}
	checkReplica := func(f runtime.Instance) {
		t.Helper()
		if got := devListing(t, f.PID); !slices.Equal(got, want) {
			t.Errorf("%s /dev:\n got %q\nwant %q", f.ID, got, want)
		}
		if fsType := mountPoints(t, f.PID)["/dev"]; fsType != "tmpfs" {
			t.Errorf("%s /dev is a %q mount", f.ID, fsType)
		}
		if got := mustCall(t, f, "readfd /dev/ghost"); got != "held-open" {
			t.Errorf("%s: the deleted file open on /dev holds %q", f.ID, got)
		}
		if got := mustCall(t, f, "read /dev/null"); got != "" {
			t.Errorf("%s: /dev/null reads %q", f.ID, got)
		}
		if got := mustCall(t, f, "write /dev/x y"); got != "ok" {
			t.Errorf("%s: write in /dev: %s", f.ID, got)
		}
		if got := mustCall(t, f, "unlink /dev/x"); got != "ok" {
			t.Errorf("%s: unlink in /dev: %s", f.ID, got)
		}
		if _, err := os.Lstat(filepath.Dir(r.devDir(f.ID))); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: its /dev is still on the host (%v)", f.ID, err)
		}
	}
	f := restoreT(t, r, testSpec(uniqueID("devf")), res.Ref)
	checkReplica(f)

	// A replica's checkpoint (its /dev a bind in its spec) is dumped the
	// same way once its /dev is the template's again.
	res2 := checkpointT(t, r, f.ID, runtime.TierMemory, false)
	if meta2, err := readMeta(res2.Ref.Dir); err != nil || meta2.DevLayout != devLayoutBind || tarredDev(t, res2.Ref.Dir) {
		t.Fatalf("replica's checkpoint: dev layout %q (%v), tarred %v", meta2.DevLayout, err, tarredDev(t, res2.Ref.Dir))
	}
	checkReplica(restoreT(t, r, testSpec(uniqueID("devff")), res2.Ref))

	// A replica that shaped its /dev: tarred by CRIU, all of it restored.
	hostile := func(t *testing.T, inst runtime.Instance) []string {
		dev := "/proc/" + strconv.FormatUint(uint64(inst.PID), 10) + "/root/dev"
		if got := mustCall(t, inst, "write /dev/shm/kept kept-content"); got != "ok" {
			t.Fatal(got)
		}
		shm := filepath.Join(dev, "shm")
		// As the sandbox's root does (host root is nobody in its /dev).
		p := "/proc/" + strconv.FormatUint(uint64(inst.PID), 10)
		uid, err := sandboxRoot(p + "/uid_map")
		if err != nil {
			t.Fatal(err)
		}
		gid, err := sandboxRoot(p + "/gid_map")
		if err != nil {
			t.Fatal(err)
		}
		goruntime.LockOSThread()
		defer goruntime.UnlockOSThread()
		unix.Setfsgid(int(gid))
		unix.Setfsuid(int(uid))
		defer func() { unix.Setfsuid(0); unix.Setfsgid(0) }()
		steps := []error{
			os.Symlink("/etc/shadow", filepath.Join(shm, "shadow")),
			os.Symlink("../../../../../../", filepath.Join(shm, "up")),
			os.Link(filepath.Join(shm, "kept"), filepath.Join(shm, "hard")),
			unix.Mkfifo(filepath.Join(shm, "fifo"), 0o666),
			os.Mkdir(filepath.Join(shm, "many"), 0o755),
		}
		for i := 0; i < 3000; i++ {
			steps = append(steps, os.WriteFile(filepath.Join(shm, "many", strconv.Itoa(i)), nil, 0o644))
		}
		huge, err := os.Create(filepath.Join(shm, "huge"))
		steps = append(steps, err)
		if err == nil {
			steps = append(steps, huge.Truncate(64<<30), huge.Close())
		}
		if err := errors.Join(steps...); err != nil {
			t.Fatal(err)
		}
		return devListing(t, inst.PID)
	}
	check := func(t *testing.T, inst runtime.Instance, want []string) {
		t.Helper()
		dev := "/proc/" + strconv.FormatUint(uint64(inst.PID), 10) + "/root/dev"
		if got := devListing(t, inst.PID); !slices.Equal(got, want) {
			t.Errorf("%s /dev:\n got %q\nwant %q", inst.ID, got, want)
		}
		if got := mustCall(t, inst, "read /dev/shm/kept"); got != "kept-content" {
			t.Errorf("%s: /dev/shm/kept holds %q", inst.ID, got)
		}
		shm := filepath.Join(dev, "shm")
		if l, _ := os.Readlink(filepath.Join(shm, "shadow")); l != "/etc/shadow" {
			t.Errorf("%s: link target %q", inst.ID, l)
		}
		var a, b unix.Stat_t
		if unix.Lstat(filepath.Join(shm, "kept"), &a) != nil || unix.Lstat(filepath.Join(shm, "hard"), &b) != nil || a.Ino != b.Ino {
			t.Errorf("%s: the hard link is not one", inst.ID)
		}
		if unix.Lstat(filepath.Join(shm, "fifo"), &a) != nil || a.Mode&unix.S_IFMT != unix.S_IFIFO {
			t.Errorf("%s: the fifo is not one", inst.ID)
		}
		if unix.Lstat(filepath.Join(shm, "huge"), &a) != nil || a.Size != 64<<30 {
			t.Errorf("%s: the huge file's size is %d", inst.ID, a.Size)
		}
		if es, err := os.ReadDir(filepath.Join(shm, "many")); err != nil || len(es) != 3000 {
			t.Errorf("%s: %d of 3000 files (%v)", inst.ID, len(es), err)
		}
	}
	for _, tc := range []struct {
		name string
		from runtime.Instance
	}{{"source", bootT(t, r, testSpec(uniqueID("devh")))}, {"replica", restoreT(t, r, testSpec(uniqueID("devfh")), res.Ref)}} {
		t.Run(tc.name, func(t *testing.T) {
			want := hostile(t, tc.from)
			res := checkpointT(t, r, tc.from.ID, runtime.TierMemory, false)
			meta, err := readMeta(res.Ref.Dir)
			if err != nil {
				t.Fatal(err)
			}
			if meta.DevLayout != "" || !tarredDev(t, res.Ref.Dir) {
				t.Fatalf("dev layout %q, tarred %v: want CRIU's tar", meta.DevLayout, tarredDev(t, res.Ref.Dir))
			}
			check(t, restoreT(t, r, testSpec(uniqueID("devhf")), res.Ref), want)
		})
	}
}
