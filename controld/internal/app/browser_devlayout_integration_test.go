package app_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/aci/pagetest"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// TestRealStackBrowserDevLayout checkpoints the web desktop with a page
// open and checks how its /dev was dumped (containerdrt devlayout.go): a
// sandbox whose /dev is runc's is dumped with /dev as an external mount
// (checkpoint.json dev_layout "bind", no tmpfs-dev tar in the images) and
// every replica binds a tmpfs controld makes. Chromium 156 keeps its shared
// memory in memfds ("/memfd:shared-memory-region", which CRIU dumps as
// memfds) and one deleted file in /tmp, not in /dev/shm, so its /dev stays
// the template's and the checkpoint binds it. A deleted file held open on
// /dev/shm beside it (a process launched in the sandbox: a CRIU ghost file
// on the bound /dev) keeps the layout and comes back in each replica's own
// /dev. An eager and a lazy replica are verified (marker, memory, network,
// pixels), hold the source's deleted files (and memfds), list the
// source's /dev and take new files in /dev/shm, and Chromium renders
// (frames change; the page's counter advances with the replica's own typed
// text) and answers CDP. Namespace forkfleet-browser-it, shared with
// TestRealStackBrowser.
func TestRealStackBrowserDevLayout(t *testing.T) {
	s := newWebStackIn(t, "forkfleet-browser-it")
	ctx := s.ctx

	cr, err := s.sbc.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{Image: s.image, WaitReady: true})
	if err != nil {
		t.Fatal(err)
	}
	src := cr.Sandbox.Id
	s.deleteSandboxAtEnd(src)
	sess, err := aci.Dial(ctx, cr.Endpoint.Url, cr.Endpoint.Token)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sess.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pagetest.Open(ctx, sess, pagetest.CounterPath, pagetest.Counter); err != nil {
		t.Fatal(err)
	}
	waitTitle(t, ctx, sess, "counter page", func(title string) bool { return counterTitle.MatchString(title) })
	// A deleted file held open on /dev/shm: dumped as a ghost file of the
	// bound /dev.
	if _, err := sess.Launch(ctx, &aciv1.LaunchRequest{Argv: []string{"/bin/sh", "-c",
		"exec 3<>/dev/shm/ghost && echo held-open >&3 && rm /dev/shm/ghost && exec sleep 100000"}}); err != nil {
		t.Fatal(err)
	}
	sess.Close()
	// Until the shell has exec'd sleep: the replicas' holder is compared
	// with the source's by name.
	srcHeld := heldDeleted(t, src)
	for deadline := time.Now().Add(10 * time.Second); !slices.Contains(srcHeld.shm, "sleep /dev/shm/ghost"); {
		if time.Now().After(deadline) {
			t.Fatal("the launched process holds no deleted /dev/shm file")
		}
		time.Sleep(50 * time.Millisecond)
		srcHeld = heldDeleted(t, src)
	}

	srcPID := sandboxInit(t, src)
	srcDev := devNames(t, srcPID)
	t.Logf("source /dev %q; deleted files held: memfds in %d processes, /dev/shm %q, elsewhere %q", srcDev, srcHeld.memfds, srcHeld.shm, srcHeld.other)
	if srcHeld.memfds == 0 {
		t.Errorf("Chromium holds no memfd: its shared memory is elsewhere now (%q), see whether /dev/shm still dumps as \"bind\"", srcHeld.other)
	}

	ck := checkpointBrowser(t, s, src)
	meta := devLayoutOf(t, s, ck.Id)
	t.Logf("checkpoint %s: dev_layout %q, entries %q, tmpfs-dev tar %v, ghost images %d, memory %d MiB",
		ck.Id, meta.layout, meta.entries, meta.tarred, meta.ghosts, ck.MemoryBytes>>20)
	if meta.layout != "bind" || meta.tarred {
		t.Fatalf("browser checkpoint: dev_layout %q, tarred %v: want \"bind\" and no tar (a /dev/shm empty by name is runc's /dev)", meta.layout, meta.tarred)
	}
	if want := len(srcHeld.shm) + len(srcHeld.other); meta.ghosts < want {
		t.Fatalf("the checkpoint holds %d ghost files, want one per deleted file held (%d)", meta.ghosts, want)
	}

	before := counterOf(t, ctx, s, cr.Endpoint)
	for i, mode := range []controldv1.RestoreMode{controldv1.RestoreMode_RESTORE_MODE_EAGER, controldv1.RestoreMode_RESTORE_MODE_LAZY} {
		id, ep := forkBrowserOne(t, s, ck.Id, mode)
		checkBrowserReplicaDev(t, s, id, ep, srcDev, srcHeld)
		n, text := titleState(t, ctx, s, ep)
		if n < before || text != "" {
			t.Fatalf("%s replica starts at counter %d with %q; the source showed %d before the checkpoint, and no text", mode, n, text, before)
		}
		checkReplicaRuns(t, ctx, s, i, id, ep, n, "")
	}
}

func checkpointBrowser(t *testing.T, s *bootStack, id string) *controldv1.Checkpoint {
	t.Helper()
	ckr, err := s.ckc.CreateCheckpoint(s.ctx, &controldv1.CreateCheckpointRequest{SandboxId: id})
	if err != nil {
		t.Fatalf("checkpoint of %s: %v", id, err)
	}
	s.deleteCheckpointAtEnd(ckr.Checkpoint.Id)
	return ckr.Checkpoint
}

// forkBrowserOne forks one replica in mode and fails unless every proof
// passed.
func forkBrowserOne(t *testing.T, s *bootStack, ck string, mode controldv1.RestoreMode) (string, *controldv1.Endpoint) {
	t.Helper()
	t0 := time.Now()
	fork, err := s.ckc.ForkCheckpoint(s.ctx, &controldv1.ForkCheckpointRequest{CheckpointId: ck, Count: 1, RestoreMode: mode})
	if err != nil {
		t.Fatalf("%s fork: %v", mode, err)
	}
	r := fork.Replicas[0]
	if r.ErrorCode != 0 {
		t.Fatalf("%s replica: %s", mode, r.ErrorMessage)
	}
	s.deleteSandboxAtEnd(r.Sandbox.Id)
	var levels []string
	for _, v := range r.Verification {
		if !v.Ok {
			t.Fatalf("%s replica: %s: %s", mode, v.Level, v.Detail)
		}
		levels = append(levels, v.Level.String())
	}
	t.Logf("%s replica %s verified (%s) in %v", mode, r.Sandbox.Id, strings.Join(levels, ", "), time.Since(t0).Round(time.Millisecond))
	return r.Sandbox.Id, r.Endpoint
}

// checkBrowserReplicaDev checks a browser replica's /dev: a tmpfs mount
// listing the source's names, the source's deleted files held again (the
// /dev/shm ghost with its content), new files possible in /dev/shm, and
// frames that change (the page animates).
func checkBrowserReplicaDev(t *testing.T, s *bootStack, id string, ep *controldv1.Endpoint, srcDev []string, src held) {
	t.Helper()
	pid := sandboxInit(t, id)
	if got := devNames(t, pid); !slices.Equal(got, srcDev) {
		t.Errorf("%s /dev %q, the source's %q", id, got, srcDev)
	}
	if fs := mountType(t, pid, "/dev"); fs != "tmpfs" {
		t.Errorf("%s /dev is a %q mount", id, fs)
	}
	// Memfds are Chromium's to open and close (the processes holding one
	// vary by one or two as it runs); the deleted files are the source's.
	got := heldDeleted(t, id)
	t.Logf("%s holds memfds in %d processes (the source %d)", id, got.memfds, src.memfds)
	if got.memfds == 0 || !slices.Equal(got.shm, src.shm) || !slices.Equal(got.other, src.other) {
		t.Errorf("%s holds memfds in %d processes, /dev/shm %q, elsewhere %q; the source %d, %q, %q", id, got.memfds, got.shm, got.other, src.memfds, src.shm, src.other)
	}
	if got.ghostContent != "held-open\n" {
		t.Errorf("%s: the deleted /dev/shm file holds %q", id, got.ghostContent)
	}
	rs, err := aci.Dial(s.ctx, ep.Url, ep.Token)
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	r, err := rs.Exec(s.ctx, &aciv1.ExecRequest{TimeoutMs: 10_000, Argv: []string{"/bin/sh", "-c",
		"echo replica > /dev/shm/t && cat /dev/shm/t && rm /dev/shm/t && ls -A /dev/shm | wc -l"}})
	if err != nil || r.ExitCode != 0 || string(r.Stdout) != "replica\n0\n" {
		t.Fatalf("%s: a file in /dev/shm: %v exit %d %q %q", id, err, r.GetExitCode(), r.GetStdout(), r.GetStderr())
	}
	// Chromium renders: the counter page draws every 50 ms.
	shot := func() []byte {
		sh, err := rs.Screenshot(s.ctx, &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG})
		if err != nil {
			t.Fatal(err)
		}
		return sh.GetData()
	}
	a := shot()
	deadline := time.Now().Add(10 * time.Second)
	for {
		time.Sleep(200 * time.Millisecond)
		b := shot()
		if len(a) > 4096 && !bytes.Equal(a, b) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the page draws nothing new in 10 s (%d B PNG)", id, len(b))
		}
		a = b
	}
}

// sandboxInit is the host pid of the sandbox's init (guestd): the process
// of its cgroup that is pid 1 in its namespace.
func sandboxInit(t *testing.T, id string) uint32 {
	t.Helper()
	for _, pid := range sandboxPIDs(t, id) {
		b, err := os.ReadFile("/proc/" + pid + "/status")
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 3 && f[0] == "NSpid:" && f[len(f)-1] == "1" {
				n, _ := strconv.ParseUint(pid, 10, 32)
				return uint32(n)
			}
		}
	}
	t.Fatalf("%s: no init found in its cgroup", id)
	return 0
}

func sandboxPIDs(t *testing.T, id string) []string {
	t.Helper()
	for _, pat := range []string{"/sys/fs/cgroup/freezer/*/" + id + "/cgroup.procs", "/sys/fs/cgroup/*/" + id + "/cgroup.procs"} {
		if m, _ := filepath.Glob(pat); len(m) == 1 {
			b, err := os.ReadFile(m[0])
			if err != nil {
				t.Fatal(err)
			}
			return strings.Fields(string(b))
		}
	}
	t.Fatalf("%s: cgroup not found", id)
	return nil
}

// held is what a sandbox's processes hold of deleted files: memfds (the
// processes holding one, by fd or mapping), the deleted files
// under /dev/shm and elsewhere ("<comm> <path>", sorted, once per process),
// and what the /dev/shm ghost's first holder reads from it.
type held struct {
	memfds       int
	shm, other   []string
	ghostContent string
}

func heldDeleted(t *testing.T, id string) held {
	t.Helper()
	var h held
	memfds, shm, other := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, pid := range sandboxPIDs(t, id) {
		b, _ := os.ReadFile("/proc/" + pid + "/comm")
		comm := strings.TrimSpace(string(b))
		add := func(target, fd string) {
			path, deleted := strings.CutSuffix(target, " (deleted)")
			switch {
			case strings.HasPrefix(path, "/memfd:"):
				memfds[pid] = true
			case !deleted, strings.HasPrefix(path, "/SYSV"), path == "/dev/zero":
				// Not a file: SysV and shared anonymous memory.
			case strings.HasPrefix(path, "/dev/shm/"):
				shm[comm+" "+path] = true
				if fd != "" && h.ghostContent == "" {
					c, _ := os.ReadFile("/proc/" + pid + "/fd/" + fd)
					h.ghostContent = string(c)
				}
			default:
				other[comm+" "+path] = true
			}
		}
		fds, _ := os.ReadDir("/proc/" + pid + "/fd")
		for _, fd := range fds {
			if target, err := os.Readlink("/proc/" + pid + "/fd/" + fd.Name()); err == nil && strings.HasPrefix(target, "/") {
				add(target, fd.Name())
			}
		}
		mapped, _ := os.ReadFile("/proc/" + pid + "/maps")
		for _, l := range strings.Split(string(mapped), "\n") {
			if f := strings.Fields(l); len(f) >= 6 && strings.HasPrefix(f[5], "/") {
				add(strings.Join(f[5:], " "), "")
			}
		}
	}
	h.memfds = len(memfds)
	h.shm, h.other = slices.Sorted(maps.Keys(shm)), slices.Sorted(maps.Keys(other))
	return h
}

// devNames lists the sandbox's /dev: name, type and mode of each entry,
// and the names in /dev/shm.
func devNames(t *testing.T, pid uint32) []string {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/root/dev", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s %v", e.Name(), info.Mode()))
	}
	shm, err := os.ReadDir(dir + "/shm")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range shm {
		out = append(out, "shm/"+e.Name())
	}
	return out
}

// mountType is the filesystem type mounted at path in the process's mount
// namespace.
func mountType(t *testing.T, pid uint32, path string) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	fsType := ""
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 10 || f[4] != path {
			continue
		}
		for i := 6; i+1 < len(f); i++ {
			if f[i] == "-" {
				fsType = f[i+1] // the last mount at path is the one seen
			}
		}
	}
	return fsType
}

type devLayout struct {
	layout  string
	entries []string
	tarred  bool
	ghosts  int
}

// devLayoutOf reads a checkpoint's dev layout from its checkpoint.json and
// its CRIU images (the tmpfs-dev tar, ghost file images).
func devLayoutOf(t *testing.T, s *bootStack, ck string) devLayout {
	t.Helper()
	dir := filepath.Join(s.cfg.CheckpointDir, ck)
	b, err := os.ReadFile(filepath.Join(dir, "checkpoint.json"))
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		DevLayout  string   `json:"dev_layout"`
		DevEntries []string `json:"dev_entries"`
	}
	if err := json.Unmarshal(b, &meta); err != nil {
		t.Fatal(err)
	}
	tars, _ := filepath.Glob(filepath.Join(dir, "criu", "tmpfs-dev-*.tar.gz.img"))
	ghosts, _ := filepath.Glob(filepath.Join(dir, "criu", "ghost-file-*.img"))
	return devLayout{layout: meta.DevLayout, entries: meta.DevEntries, tarred: len(tars) > 0, ghosts: len(ghosts)}
}
