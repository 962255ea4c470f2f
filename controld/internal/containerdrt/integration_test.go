//go:build linux

package containerdrt

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
	cerrdefs "github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/guestsock"
	"github.com/forkfleet/forkfleet/controld/internal/ocilayout"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/testenv"
)

// Integration tests run against a real containerd + runc + CRIU:
//
//	FORKFLEET_INTEGRATION=1 go test ./internal/containerdrt/ -run Integration -v
//
// The machine, namespaces and images come from testenv: the tiny-image tests
// use their own namespace and cgroup parent, the desktop tests the desktop
// image in another namespace of their own.

const (
	testNamespace    = "forkfleet-test-containerdrt"
	testCgroupParent = "/forkfleet-test-containerdrt"
	testImage        = "localhost/forkfleet/containerdrt-testinit:latest"
)

func integration(t *testing.T) {
	t.Helper()
	testenv.RealStack(t)
}

// newTestRuntime is a runtime in namespace whose sandboxes run as
// controld's do by default (user namespaces of their own); opts change its
// configuration.
func newTestRuntime(t *testing.T, namespace string, opts ...func(*Config)) *Runtime {
	t.Helper()
	state := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := Config{
		Address:        testenv.Address(),
		Namespace:      testenv.Namespace(namespace),
		StateDir:       state,
		CheckpointRoot: filepath.Join(state, "checkpoints"),
		CgroupParent:   testenv.CgroupParent(testCgroupParent),
		NetHook:        testenv.NetHook(t),
		UserNamespaces: testenv.UserNamespaces(t),
	}
	for _, o := range opts {
		o(&cfg)
	}
	r, err := New(ctx, cfg)
	if err != nil {
		t.Fatalf("New: %v (is containerd up at %s?)", err, testenv.Address())
	}
	// Checked after Close removed the precreated sandboxes.
	testenv.NoLeakedShims(t, cfg.Namespace)
	t.Cleanup(func() { r.Close() })
	return r
}

// testImages remembers the namespaces the test image was imported into.
var testImages sync.Map // namespace -> func() error

// importTestImage builds testdata/testinit statically and imports a
// one-layer image with it as entrypoint into r's namespace.
func importTestImage(t *testing.T, r *Runtime) {
	t.Helper()
	once, _ := testImages.LoadOrStore(r.cfg.Namespace, sync.OnceValue(func() error { return buildAndImport(r) }))
	if err := once.(func() error)(); err != nil {
		t.Fatalf("test image: %v", err)
	}
}

func buildAndImport(r *Runtime) error {
	ctx := r.ctx(context.Background())
	work, err := os.MkdirTemp("", "containerdrt-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	root := filepath.Join(work, "root")
	for _, d := range []string{"run", "tmp", "var/lib", "var/log", "etc/forkfleet", "proc", "sys", "dev"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(root, "tmp"), 0o1777); err != nil {
		return err
	}
	// The go on PATH: runtime.GOROOT() is empty in -trimpath test binaries.
	gobin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("go toolchain for the test image: %w", err)
	}
	cmd := exec.Command(gobin, "build", "-o", filepath.Join(root, "testinit"), "./testdata/testinit")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build testinit: %v\n%s", err, out)
	}
	layout := filepath.Join(work, "layout")
	w, err := ocilayout.Create(layout)
	if err != nil {
		return err
	}
	layer, err := w.LayerFromTree(ctx, []ocilayout.TarEntry{{Source: root, Dest: "/"}}, ocilayout.TarOptions{})
	if err != nil {
		return err
	}
	desc, err := w.WriteImage(ctx, ocilayout.Image{
		Config: ocispec.Image{
			Platform: ocispec.Platform{OS: "linux", Architecture: goruntime.GOARCH},
			Config: ocispec.ImageConfig{
				Entrypoint: []string{"/testinit"},
				Env:        []string{"PATH=/"},
			},
		},
		Layers: []ocilayout.Layer{layer},
	})
	if err != nil {
		return err
	}
	if err := w.Tag(desc, testImage, nil); err != nil {
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(tarDir(pw, layout)) }()
	if _, err := r.client.Import(ctx, pr); err != nil {
		return fmt.Errorf("import: %w", err)
	}
	_, err = r.image(ctx, testImage)
	return err
}

func tarDir(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(fi, "")
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// dialSandbox connects to a sandbox's guest socket the way controld does.
func dialSandbox(sock guestsock.Addr, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return guestsock.Dial(ctx, sock)
}

// call sends one command to a sandbox's testinit and returns the reply.
func call(sock guestsock.Addr, cmd string, timeout time.Duration) (string, error) {
	c, err := dialSandbox(sock, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := fmt.Fprintln(c, cmd); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimSuffix(line, "\n"), nil
}

func mustCall(t *testing.T, inst runtime.Instance, cmd string) string {
	t.Helper()
	reply, err := call(inst.ACISocket, cmd, 5*time.Second)
	if err != nil {
		t.Fatalf("%s: %q: %v", inst.ID, cmd, err)
	}
	return reply
}

// waitSocket waits until the sandbox's guest socket accepts a connection.
func waitSocket(t *testing.T, inst runtime.Instance, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		c, err := dialSandbox(inst.ACISocket, time.Second)
		if err == nil {
			c.Close()
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			t.Fatalf("%s: guest socket %s not answering after %v: %v", inst.ID, inst.ACISocket, timeout, err)
		}
		time.Sleep(time.Millisecond)
	}
}

func testSpec(id string) runtime.BootSpec {
	return runtime.BootSpec{
		ID:          id,
		Image:       testImage,
		CPUMillis:   1000,
		MemoryBytes: 256 << 20,
		Env:         map[string]string{"TEST_VAR": "v-" + id},
		ACIToken:    "aci-" + id,
		AdminToken:  "admin-" + id,
		Labels:      map[string]string{"owner": "test", "sandbox": id},
	}
}

func uniqueID(prefix string) string {
	return fmt.Sprintf("%s-%s", prefix, randomHex(4))
}

func bootT(t *testing.T, r *Runtime, spec runtime.BootSpec) runtime.Instance {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	inst, err := r.Boot(ctx, spec)
	if err != nil {
		t.Fatalf("Boot %s: %v", spec.ID, err)
	}
	boot := time.Since(start)
	ready := waitSocket(t, inst, 10*time.Second)
	t.Logf("boot %s: Boot %v, socket answering %v later (total %v)", spec.ID, boot, ready, boot+ready)
	t.Cleanup(func() { deleteQuiet(r, spec.ID) })
	return inst
}

func deleteQuiet(r *Runtime, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r.Delete(ctx, id)
}

// assertGone checks Delete left nothing of the sandbox behind.
func assertGone(t *testing.T, r *Runtime, id string) {
	t.Helper()
	ctx := r.ctx(context.Background())
	if _, err := r.client.ContainerService().Get(ctx, id); !cerrdefs.IsNotFound(err) {
		t.Errorf("%s: container still there (err %v)", id, err)
	}
	if _, err := r.client.TaskService().Get(ctx, taskGetRequest(id)); !cerrdefs.IsNotFound(errgrpc.ToNative(err)) {
		t.Errorf("%s: task still there (err %v)", id, err)
	}
	if _, err := r.sn.Stat(ctx, id); !cerrdefs.IsNotFound(err) {
		t.Errorf("%s: snapshot still there (err %v)", id, err)
	}
	if left := r.cgroupsExist(id); len(left) > 0 {
		t.Errorf("%s: cgroups left: %v", id, left)
	}
	if _, err := os.Stat(r.logPath(id)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s: log file left (err %v)", id, err)
	}
}

func leaseCount(t *testing.T, r *Runtime) int {
	t.Helper()
	ls, err := r.client.LeasesService().List(r.ctx(context.Background()))
	if err != nil {
		t.Fatalf("leases: %v", err)
	}
	return len(ls)
}

func TestIntegrationBootListFreezeDelete(t *testing.T) {
	integration(t)
	r := newTestRuntime(t, testNamespace)
	importTestImage(t, r)
	ctx := context.Background()
	leasesBefore := leaseCount(t, r)

	spec := testSpec(uniqueID("boot"))
	inst := bootT(t, r, spec)
	if inst.PID == 0 || inst.Status != runtime.StatusRunning {
		t.Fatalf("instance %+v", inst)
	}
	if got := mustCall(t, inst, "env FORKFLEET_SANDBOX_ID"); got != spec.ID {
		t.Errorf("FORKFLEET_SANDBOX_ID = %q, want %q", got, spec.ID)
	}
	if got := mustCall(t, inst, "env FORKFLEET_ACI_TOKEN"); got != spec.ACIToken {
		t.Errorf("FORKFLEET_ACI_TOKEN = %q", got)
	}
	if got := mustCall(t, inst, "env FORKFLEET_SCREEN"); got != "1280x800x24" {
		t.Errorf("FORKFLEET_SCREEN = %q", got)
	}
	if got := mustCall(t, inst, "env TEST_VAR"); got != "v-"+spec.ID {
		t.Errorf("TEST_VAR = %q", got)
	}
	// Limits landed in the sandbox's own cgroup.
	memLimit, err := os.ReadFile(filepath.Join(r.cfg.CgroupRoot, "memory", r.cgroupsPath(spec.ID), "memory.limit_in_bytes"))
	if err != nil || strings.TrimSpace(string(memLimit)) != fmt.Sprint(256<<20) {
		t.Errorf("memory limit %q (%v)", memLimit, err)
	}
	// Only lo in the network namespace.
	netdev, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/dev", inst.PID))
	if err != nil {
		t.Fatal(err)
	}
	if ifs := strings.Count(string(netdev), ":"); ifs != 1 || !strings.Contains(string(netdev), "lo:") {
		t.Errorf("network interfaces in the sandbox:\n%s", netdev)
	}

	list, err := r.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var found *runtime.Instance
	for i := range list {
		if list[i].ID == spec.ID {
			found = &list[i]
		}
	}
	if found == nil || found.Status != runtime.StatusRunning || found.PID != inst.PID ||
		found.Labels["owner"] != "test" || found.ACISocket != inst.ACISocket || found.TaskStartedAt.IsZero() {
		t.Fatalf("List: %+v", found)
	}

	start := time.Now()
	if err := r.Freeze(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	t.Logf("freeze %v", time.Since(start))
	if err := r.Freeze(ctx, spec.ID); err != nil {
		t.Fatalf("second Freeze: %v", err)
	}
	if got, _ := r.Get(ctx, spec.ID); got.Status != runtime.StatusFrozen {
		t.Errorf("status after Freeze = %v", got.Status)
	}
	if _, err := call(inst.ACISocket, "get", 200*time.Millisecond); err == nil {
		t.Error("a frozen sandbox answered")
	}
	start = time.Now()
	if err := r.Thaw(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	t.Logf("thaw %v", time.Since(start))
	if err := r.Thaw(ctx, spec.ID); err != nil {
		t.Fatalf("second Thaw: %v", err)
	}
	if got := mustCall(t, inst, "get"); got != "initial" {
		t.Errorf("get after thaw = %q", got)
	}

	// Delete a frozen sandbox: the kill must not hang on the freezer.
	if err := r.Freeze(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if err := r.Delete(ctx, spec.ID); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	t.Logf("delete %v", time.Since(start))
	assertGone(t, r, spec.ID)
	if err := r.Delete(ctx, spec.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second Delete: %v, want ErrNotFound", err)
	}
	if err := r.Freeze(ctx, "no-such-sandbox"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Freeze unknown: %v, want ErrNotFound", err)
	}
	if n := leaseCount(t, r); n != leasesBefore {
		t.Errorf("leases: %d before, %d after", leasesBefore, n)
	}

	// Boot errors leave nothing behind: an unknown image, a taken id.
	bad := testSpec(uniqueID("bad"))
	bad.Image = "localhost/forkfleet/no-such-image:latest"
	if _, err := r.Boot(ctx, bad); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Boot with unknown image: %v, want ErrNotFound", err)
	}
	assertGone(t, r, bad.ID)
	dup := testSpec(uniqueID("dup"))
	bootT(t, r, dup)
	if _, err := r.Boot(ctx, dup); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("Boot of a taken id: %v, want ErrAlreadyExists", err)
	}
	if _, err := r.Get(ctx, dup.ID); err != nil {
		t.Errorf("the first sandbox with a taken id was harmed: %v", err)
	}
}

func checkpointT(t *testing.T, r *Runtime, id string, tier runtime.CheckpointTier, stop bool) runtime.CheckpointResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := filepath.Join(r.cfg.CheckpointRoot, uniqueID("ckpt"))
	var hooks []string
	res, err := r.Checkpoint(ctx, id, runtime.CheckpointSpec{
		Dir:  dir,
		Tier: tier,
		Stop: stop,
		BeforeFreeze: func(context.Context) error {
			hooks = append(hooks, "before")
			return nil
		},
		AfterFreeze: func(context.Context) error {
			st, err := r.freezerState(id)
			if err != nil || st != freezerFrozen {
				return fmt.Errorf("AfterFreeze: freezer %q (%v)", st, err)
			}
			hooks = append(hooks, "after")
			return nil
		},
	})
	if err != nil {
		t.Fatalf("Checkpoint %s: %v", id, err)
	}
	if strings.Join(hooks, ",") != "before,after" {
		t.Errorf("hooks ran %v", hooks)
	}
	t.Logf("checkpoint %s tier %d: frozen %v (dump %v), layer copy %v, total %v; memory %d B, layer %d B",
		id, tier, res.Frozen, res.Dump, res.Layer, res.Total, res.MemoryBytes, res.LayerBytes)
	t.Cleanup(func() { r.DeleteCheckpoint(context.Background(), res.Ref) })
	return res
}

func restoreT(t *testing.T, r *Runtime, spec runtime.BootSpec, ref runtime.CheckpointRef) runtime.Instance {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	inst, err := r.Restore(ctx, spec, ref)
	if err != nil {
		t.Fatalf("Restore %s: %v", spec.ID, err)
	}
	d := time.Since(start)
	ready := waitSocket(t, inst, 10*time.Second)
	t.Logf("restore %s: Restore %v, socket answering %v later", spec.ID, d, ready)
	t.Cleanup(func() { deleteQuiet(r, spec.ID) })
	return inst
}

func TestIntegrationCheckpointFork(t *testing.T) {
	integration(t)
	r := newTestRuntime(t, testNamespace)
	importTestImage(t, r)
	ctx := context.Background()

	src := bootT(t, r, testSpec(uniqueID("src")))
	memValue := "mem-" + randomHex(8)
	if got := mustCall(t, src, "set "+memValue); got != "ok" {
		t.Fatal(got)
	}
	fileValue := "file-" + randomHex(8)
	if got := mustCall(t, src, "write /var/lib/state/value "+fileValue); got != "ok" {
		t.Fatal(got)
	}
	// A bigger file, written before the checkpoint, exercises the copier.
	if got := mustCall(t, src, "write /var/lib/state/big "+strings.Repeat("x", 1<<20)); got != "ok" {
		t.Fatal(got)
	}

	res := checkpointT(t, r, src.ID, runtime.TierMemory, false)
	if res.MemoryBytes == 0 || res.LayerBytes < 1<<20 || res.Ref.Snapshot == "" || res.Ref.Tier != runtime.TierMemory {
		t.Errorf("result %+v", res)
	}
	// The source keeps running, thawed, with its state.
	if got, _ := r.Get(ctx, src.ID); got.Status != runtime.StatusRunning {
		t.Errorf("source status after checkpoint = %v", got.Status)
	}
	if got := mustCall(t, src, "get"); got != memValue {
		t.Errorf("source value after checkpoint = %q", got)
	}
	mustCall(t, src, "set changed-after-checkpoint")

	// Fork 2 concurrently.
	var wg sync.WaitGroup
	forks := make([]runtime.Instance, 2)
	errs := make([]error, 2)
	start := time.Now()
	for i := range forks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			spec := testSpec(uniqueID(fmt.Sprintf("fork%d", i)))
			t.Cleanup(func() { deleteQuiet(r, spec.ID) })
			forks[i], errs[i] = r.Restore(ctx, spec, res.Ref)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("fork %d: %v", i, err)
		}
	}
	for _, f := range forks {
		waitSocket(t, f, 10*time.Second)
	}
	t.Logf("fork N=2 wall (restored and answering): %v", time.Since(start))
	for _, f := range forks {
		if got := mustCall(t, f, "get"); got != memValue {
			t.Errorf("%s: memory value %q, want %q", f.ID, got, memValue)
		}
		if got := mustCall(t, f, "read /var/lib/state/value"); got != fileValue {
			t.Errorf("%s: file value %q, want %q", f.ID, got, fileValue)
		}
		if f.PID == src.PID {
			t.Errorf("%s shares the source's pid", f.ID)
		}
		if cg := r.cgroupsExist(f.ID); len(cg) == 0 {
			t.Errorf("%s has no cgroup of its own", f.ID)
		}
		// A fork writes its own layer.
		mustCall(t, f, "write /var/lib/state/value fork-"+f.ID)
	}
	if got := mustCall(t, src, "read /var/lib/state/value"); got != fileValue {
		t.Errorf("a fork's write reached the source: %q", got)
	}

	// A fork can itself be checkpointed and forked (its layer stacks on the
	// checkpoint's).
	mustCall(t, forks[1], "set grandchild-value")
	res2 := checkpointT(t, r, forks[1].ID, runtime.TierMemory, false)
	grand := restoreT(t, r, testSpec(uniqueID("grand")), res2.Ref)
	if got := mustCall(t, grand, "get"); got != "grandchild-value" {
		t.Errorf("fork of a fork: memory %q", got)
	}
	if got := mustCall(t, grand, "read /var/lib/state/value"); got != "fork-"+forks[1].ID {
		t.Errorf("fork of a fork: file %q", got)
	}
	mustCall(t, forks[1], "set "+memValue)

	// Deleting a fork leaves the source and the other fork running.
	if err := r.Delete(ctx, forks[0].ID); err != nil {
		t.Fatal(err)
	}
	assertGone(t, r, forks[0].ID)
	if got := mustCall(t, src, "get"); got != "changed-after-checkpoint" {
		t.Errorf("source after deleting a fork: %q", got)
	}
	if got := mustCall(t, forks[1], "get"); got != memValue {
		t.Errorf("second fork after deleting the first: %q", got)
	}

	// Fork after the source is gone.
	if err := r.Delete(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	assertGone(t, r, src.ID)
	late := restoreT(t, r, testSpec(uniqueID("late")), res.Ref)
	if got := mustCall(t, late, "get"); got != memValue {
		t.Errorf("fork after source deletion: %q", got)
	}

	// N=4 fan-out wall.
	start = time.Now()
	fan := make([]runtime.Instance, 4)
	errs = make([]error, 4)
	for i := range fan {
		wg.Add(1)
		go func() {
			defer wg.Done()
			spec := testSpec(uniqueID(fmt.Sprintf("fan%d", i)))
			t.Cleanup(func() { deleteQuiet(r, spec.ID) })
			fan[i], errs[i] = r.Restore(ctx, spec, res.Ref)
			if errs[i] == nil {
				_, errs[i] = waitDial(fan[i].ACISocket, 10*time.Second)
			}
		}()
	}
	wg.Wait()
	t.Logf("fork N=4 wall (restored and answering): %v", time.Since(start))
	for i, err := range errs {
		if err != nil {
			t.Fatalf("fan-out fork %d: %v", i, err)
		}
		if got := mustCall(t, fan[i], "get"); got != memValue {
			t.Errorf("fan-out fork %d: %q", i, got)
		}
	}

	// DeleteCheckpoint with forks alive: the directory goes, the forks live.
	if err := r.DeleteCheckpoint(ctx, res.Ref); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(res.Ref.Dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("checkpoint dir left: %v", err)
	}
	if got := mustCall(t, late, "read /var/lib/state/value"); got != fileValue {
		t.Errorf("fork after DeleteCheckpoint: %q", got)
	}
	if err := r.DeleteCheckpoint(ctx, res.Ref); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second DeleteCheckpoint: %v, want ErrNotFound", err)
	}
	if _, err := r.Restore(ctx, testSpec(uniqueID("gone")), res.Ref); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Restore from a deleted checkpoint: %v, want ErrNotFound", err)
	}
}

// waitX waits until the sandbox's X server (display :0) completes an X11
// connection setup.
func waitX(inst runtime.Instance, timeout time.Duration) error {
	sock := inst.ACISocket
	sock.Path = "/tmp/.X11-unix/X0"
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		last = xHandshake(sock)
		if last == nil {
			return nil
		}
		time.Sleep(2 * time.Millisecond)
	}
	return fmt.Errorf("X server at %s: %w", sock, last)
}

func xHandshake(sock guestsock.Addr) error {
	c, err := dialSandbox(sock, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	// Little-endian setup request, protocol 11.0, no authorization.
	if _, err := c.Write([]byte{'l', 0, 11, 0, 0, 0, 0, 0, 0, 0, 0, 0}); err != nil {
		return err
	}
	reply := make([]byte, 8)
	if _, err := io.ReadFull(c, reply); err != nil {
		return err
	}
	if reply[0] != 1 {
		return fmt.Errorf("X setup refused (status %d)", reply[0])
	}
	return nil
}

// sandboxProcs lists the command names of a sandbox's processes (sorted).
func sandboxProcs(t *testing.T, r *Runtime, id string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(r.cfg.CgroupRoot, "pids", r.cgroupsPath(id), "cgroup.procs"))
	if err != nil {
		t.Errorf("%s: processes: %v", id, err)
		return nil
	}
	var names []string
	for _, pid := range strings.Fields(string(b)) {
		comm, err := os.ReadFile("/proc/" + pid + "/comm")
		if err == nil {
			names = append(names, strings.TrimSpace(string(comm)))
		}
	}
	slices.Sort(names)
	return names
}

// waitProcs waits until the sandbox runs every process in want and returns
// its process names; it fails the test on timeout.
func waitProcs(t *testing.T, r *Runtime, id string, want []string, timeout time.Duration) []string {
	t.Helper()
	start := time.Now()
	for {
		procs := sandboxProcs(t, r, id)
		missing := slices.DeleteFunc(slices.Clone(want), func(w string) bool { return slices.Contains(procs, w) })
		if len(missing) == 0 {
			t.Logf("%s: %v running %v after the check began", id, want, time.Since(start))
			return procs
		}
		if time.Since(start) > timeout {
			t.Fatalf("%s runs no %v after %v: %v", id, missing, timeout, procs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitDial(sock guestsock.Addr, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	for {
		c, err := dialSandbox(sock, time.Second)
		if err == nil {
			c.Close()
			return time.Since(start), nil
		}
		if time.Since(start) > timeout {
			return 0, err
		}
		time.Sleep(time.Millisecond)
	}
}

func TestIntegrationDiskTierAndStop(t *testing.T) {
	integration(t)
	r := newTestRuntime(t, testNamespace)
	importTestImage(t, r)
	ctx := context.Background()

	src := bootT(t, r, testSpec(uniqueID("disk")))
	mustCall(t, src, "set in-memory-only")
	fileValue := "disk-" + randomHex(8)
	mustCall(t, src, "write /var/lib/state/value "+fileValue)

	res := checkpointT(t, r, src.ID, runtime.TierDisk, true)
	// controld writes a checkpoint to a temporary directory and renames it.
	moved := filepath.Join(r.cfg.CheckpointRoot, uniqueID("moved"))
	if err := os.Rename(res.Ref.Dir, moved); err != nil {
		t.Fatal(err)
	}
	res.Ref.Dir = moved
	t.Cleanup(func() {
		if err := r.DeleteCheckpoint(context.Background(), res.Ref); err != nil {
			t.Errorf("DeleteCheckpoint of a moved checkpoint: %v", err)
		}
		if _, err := r.sn.Stat(r.ctx(context.Background()), res.Ref.Snapshot); !cerrdefs.IsNotFound(err) {
			t.Errorf("layer of a moved checkpoint still there after DeleteCheckpoint and fork deletion: %v", err)
		}
	})
	if res.MemoryBytes != 0 || res.Dump != 0 {
		t.Errorf("disk tier dumped memory: %+v", res)
	}
	// Stop: the source is stopped, not reported as an exit, not deleted.
	got, err := r.Get(ctx, src.ID)
	if err != nil || got.Status != runtime.StatusStopped {
		t.Errorf("source after Stop: %+v, %v", got, err)
	}
	spec := testSpec(uniqueID("diskfork"))
	fork := restoreT(t, r, spec, res.Ref)
	if got := mustCall(t, fork, "get"); got != "initial" {
		t.Errorf("disk-tier fork memory = %q, want a fresh process", got)
	}
	if got := mustCall(t, fork, "read /var/lib/state/value"); got != fileValue {
		t.Errorf("disk-tier fork file = %q", got)
	}
	if got := mustCall(t, fork, "env FORKFLEET_SANDBOX_ID"); got != spec.ID {
		t.Errorf("disk-tier fork identity = %q", got)
	}
	if got := mustCall(t, fork, "env TEST_VAR"); got != "v-"+spec.ID {
		t.Errorf("disk-tier fork TEST_VAR = %q", got)
	}
	// A memory-tier ref to a disk checkpoint is refused.
	bad := res.Ref
	bad.Tier = runtime.TierMemory
	if _, err := r.Restore(ctx, testSpec(uniqueID("x")), bad); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Restore with the wrong tier: %v", err)
	}
	if err := r.Delete(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	assertGone(t, r, src.ID)
}

func TestIntegrationCheckpointFailureLeavesSourceRunning(t *testing.T) {
	integration(t)
	r := newTestRuntime(t, testNamespace)
	importTestImage(t, r)
	ctx := context.Background()
	src := bootT(t, r, testSpec(uniqueID("fail")))
	mustCall(t, src, "set still-here")

	snapsBefore := countSnapshots(t, r)
	// An open connection from outside into the sandbox's unix socket makes
	// the dump impossible (CRIU cannot dump an external stream peer).
	held, err := dialSandbox(src.ACISocket, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond) // let testinit accept it
	if n, err := waitUnixSettled(ctx, src.PID, r.procsFile(src.ID), 20*time.Millisecond); err != nil || n != 1 {
		t.Errorf("unsettled unix connections with one held: %d (%v), want 1", n, err)
	}
	dir := filepath.Join(r.cfg.CheckpointRoot, uniqueID("failed"))
	_, err = r.Checkpoint(ctx, src.ID, runtime.CheckpointSpec{Dir: dir, Tier: runtime.TierMemory})
	held.Close()
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Checkpoint with an external unix connection: %v, want ErrFailedPrecondition", err)
	}
	t.Logf("expected failure: %v", err)
	if st, err := r.freezerState(src.ID); err != nil || st != freezerThawed {
		t.Errorf("source freezer after a failed checkpoint: %q (%v)", st, err)
	}
	if got := mustCall(t, src, "get"); got != "still-here" {
		t.Errorf("source after failed checkpoint: %q", got)
	}
	if n, err := waitUnixSettled(ctx, src.PID, r.procsFile(src.ID), time.Second); err != nil || n != 0 {
		t.Errorf("unsettled unix connections after closing: %d (%v), want 0", n, err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("failed checkpoint left its dir: %v", err)
	}
	if n := countSnapshots(t, r); n > snapsBefore { // fewer: an earlier test's layer collected meanwhile
		t.Errorf("snapshots: %d before, %d after a failed checkpoint", snapsBefore, n)
	}

	// A connection made while frozen waits in the listener's queue, where
	// CRIU refuses it (a closed in-flight socket). With one attempt the
	// dump fails inside CRIU; the source must stay running and thawed.
	connectWhileFrozen := func(context.Context) error {
		c, err := dialSandbox(src.ACISocket, 5*time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	}
	r.cfg.DumpAttempts = 1
	_, err = r.Checkpoint(ctx, src.ID, runtime.CheckpointSpec{Dir: dir, Tier: runtime.TierMemory, AfterFreeze: connectWhileFrozen})
	r.cfg.DumpAttempts = 3
	if err == nil || !strings.Contains(err.Error(), "criu dump") {
		t.Fatalf("Checkpoint with a connection queued during the freeze: %v, want a CRIU failure", err)
	}
	t.Logf("expected dump failure: %.700s", err)
	if st, err := r.freezerState(src.ID); err != nil || st != freezerThawed {
		t.Errorf("source freezer after a failed dump: %q (%v)", st, err)
	}
	if got := mustCall(t, src, "get"); got != "still-here" {
		t.Errorf("source after failed dump: %q", got)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("failed dump left its dir: %v", err)
	}
	if n := countSnapshots(t, r); n > snapsBefore { // fewer: an earlier test's layer collected meanwhile
		t.Errorf("snapshots: %d before, %d after a failed dump", snapsBefore, n)
	}

	// With retries the same race is absorbed: thaw, let the sandbox accept
	// and close it, dump again.
	res, err := r.Checkpoint(ctx, src.ID, runtime.CheckpointSpec{Dir: dir, Tier: runtime.TierMemory, AfterFreeze: connectWhileFrozen})
	if err != nil {
		t.Fatalf("Checkpoint with a retried dump: %v", err)
	}
	t.Logf("checkpoint after a retried dump: frozen %v (last dump %v), total %v", res.Frozen, res.Dump, res.Total)
	if err := r.DeleteCheckpoint(ctx, res.Ref); err != nil {
		t.Fatal(err)
	}

	// A failing hook aborts too, and thaws, on either side of the freeze;
	// nothing of the attempt is left.
	failedHook := func(what string, spec runtime.CheckpointSpec) {
		t.Helper()
		spec.Dir, spec.Tier = dir, runtime.TierMemory
		_, err := r.Checkpoint(ctx, src.ID, spec)
		if err == nil || !strings.Contains(err.Error(), "hook says no") || !strings.Contains(err.Error(), what) {
			t.Errorf("Checkpoint with failing %s hook: %v", what, err)
		}
		if st, err := r.freezerState(src.ID); err != nil || st != freezerThawed {
			t.Errorf("source freezer after a failed %s hook: %q (%v)", what, st, err)
		}
		if got := mustCall(t, src, "get"); got != "still-here" {
			t.Errorf("source after failed %s hook: %q", what, got)
		}
		if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("failed %s hook left the checkpoint dir: %v", what, err)
		}
		if n := countSnapshots(t, r); n > snapsBefore {
			t.Errorf("snapshots: %d before, %d after a failed %s hook", snapsBefore, n, what)
		}
		// The dump's CRIU, started before the freeze, ended with the
		// attempt that did not use it.
		if got := criuChildren(t); len(got) != 0 {
			t.Errorf("CRIU processes left by a failed %s hook: %v", what, got)
		}
	}
	failedHook("after freeze", runtime.CheckpointSpec{AfterFreeze: func(context.Context) error { return errors.New("hook says no") }})
	failedHook("before freeze", runtime.CheckpointSpec{BeforeFreeze: func(context.Context) error { return errors.New("hook says no") }})

	// The BeforeFreeze hook runs beside the first steps: when one of them
	// fails, the hook is cancelled and has returned before Checkpoint does.
	hookEnded := make(chan struct{})
	_, err = r.Checkpoint(ctx, uniqueID("absent"), runtime.CheckpointSpec{Dir: dir, Tier: runtime.TierMemory,
		BeforeFreeze: func(ctx context.Context) error {
			defer close(hookEnded)
			<-ctx.Done()
			return ctx.Err()
		}})
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Checkpoint of an unknown sandbox: %v, want ErrNotFound", err)
	}
	select {
	case <-hookEnded:
	default:
		t.Error("Checkpoint returned before its BeforeFreeze hook did")
	}

	// The checkpoint dir must not exist beforehand, and what is there stays.
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	kept := filepath.Join(dir, "kept")
	if err := os.WriteFile(kept, []byte("someone else's"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Checkpoint(ctx, src.ID, runtime.CheckpointSpec{Dir: dir, Tier: runtime.TierMemory}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("Checkpoint into an existing dir: %v", err)
	}
	if _, err := os.Stat(kept); err != nil {
		t.Errorf("Checkpoint into an existing dir touched it: %v", err)
	}
	if st, err := r.freezerState(src.ID); err != nil || st != freezerThawed {
		t.Errorf("source freezer after a refused dir: %q (%v)", st, err)
	}
	if _, err := r.Checkpoint(ctx, src.ID, runtime.CheckpointSpec{Dir: "/etc/ckpt", Tier: runtime.TierMemory}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Checkpoint outside the checkpoint root: %v", err)
	}
}

// TestIntegrationCheckpointTracedProcess checkpoints a sandbox in which a
// process traces another (a debugger in the sandbox): CRIU cannot seize a
// traced process, and the answer says so as FAILED_PRECONDITION
// CHECKPOINT_UNDUMPABLE, not INTERNAL, with the source left running.
func TestIntegrationCheckpointTracedProcess(t *testing.T) {
	integration(t)
	r := newTestRuntime(t, testNamespace)
	importTestImage(t, r)
	ctx := context.Background()
	src := bootT(t, r, testSpec(uniqueID("traced")))
	mustCall(t, src, "set still-here")
	child := mustCall(t, src, "traced")
	if _, err := strconv.Atoi(child); err != nil {
		t.Fatalf("traced: %q", child)
	}
	dir := filepath.Join(r.cfg.CheckpointRoot, uniqueID("traced"))
	_, err := r.Checkpoint(ctx, src.ID, runtime.CheckpointSpec{Dir: dir, Tier: runtime.TierMemory})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || errdefs.Reason(err) != "CHECKPOINT_UNDUMPABLE" ||
		!strings.Contains(err.Error(), "another process traces it") {
		t.Fatalf("Checkpoint with a traced process: %v, want FAILED_PRECONDITION CHECKPOINT_UNDUMPABLE naming the tracing", err)
	}
	t.Logf("expected failure: %.300s", err)
	if st, err := r.freezerState(src.ID); err != nil || st != freezerThawed {
		t.Errorf("source freezer after a failed checkpoint: %q (%v)", st, err)
	}
	if got := mustCall(t, src, "get"); got != "still-here" {
		t.Errorf("source after failed checkpoint: %q", got)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("failed checkpoint left its dir: %v", err)
	}
}

// TestIntegrationCheckpointRacingConnections checkpoints right after
// connections from outside were closed (as controld closes its guestd
// sessions in BeforeFreeze): the checkpoint waits for the sandbox to close
// its ends instead of failing.
func TestIntegrationCheckpointRacingConnections(t *testing.T) {
	integration(t)
	r := newTestRuntime(t, testNamespace)
	importTestImage(t, r)
	src := bootT(t, r, testSpec(uniqueID("race")))
	for i := range 5 {
		var conns []net.Conn
		for range 4 {
			c, err := dialSandbox(src.ACISocket, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
		}
		res, err := r.Checkpoint(context.Background(), src.ID, runtime.CheckpointSpec{
			Dir:  filepath.Join(r.cfg.CheckpointRoot, uniqueID("race")),
			Tier: runtime.TierMemory,
			BeforeFreeze: func(context.Context) error {
				for _, c := range conns {
					c.Close()
				}
				return nil
			},
		})
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		t.Logf("round %d: frozen %v (dump %v), total %v", i, res.Frozen, res.Dump, res.Total)
		r.DeleteCheckpoint(context.Background(), res.Ref)
	}
}

// countSnapshots counts the namespace's snapshots but the empty checkpoint
// layers the runtime keeps prepared (see layerSlots).
func countSnapshots(t *testing.T, r *Runtime) int {
	t.Helper()
	slots := map[string]bool{}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		r.layers.mu.Lock()
		filling := len(r.layers.filling) > 0 // a refill in flight
		clear(slots)
		for _, l := range r.layers.ready {
			slots[l.key] = true
		}
		r.layers.mu.Unlock()
		if !filling || time.Now().After(deadline) {
			break
		}
	}
	n := 0
	if err := r.sn.Walk(r.ctx(context.Background()), func(_ context.Context, info snapshots.Info) error {
		if !slots[info.Name] {
			n++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestIntegrationExits(t *testing.T) {
	integration(t)
	r := newTestRuntime(t, testNamespace)
	importTestImage(t, r)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exits, err := r.Exits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	deleted := bootT(t, r, testSpec(uniqueID("deleted")))
	dying := bootT(t, r, testSpec(uniqueID("dying")))
	if err := r.Delete(ctx, deleted.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := call(dying.ACISocket, "exit 3", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-exits:
		if e.ID != dying.ID || e.Status != 3 || e.ExitedAt.IsZero() {
			t.Errorf("exit %+v, want %s status 3", e, dying.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no exit reported")
	}
	if got, _ := r.Get(ctx, dying.ID); got.Status != runtime.StatusStopped {
		t.Errorf("status after exit: %v", got.Status)
	}
	cancel()
	for range exits { // the channel closes with ctx
	}
}

func TestIntegrationPrecreate(t *testing.T) {
	integration(t)
	r := newTestRuntime(t, testNamespace)
	importTestImage(t, r)
	ctx := context.Background()

	spec := testSpec(uniqueID("pre"))
	start := time.Now()
	if err := r.Precreate(ctx, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteQuiet(r, spec.ID) })
	t.Logf("precreate %v", time.Since(start))
	if got, _ := r.Get(ctx, spec.ID); got.Status != runtime.StatusCreated {
		t.Errorf("precreated status %v", got.Status)
	}
	if err := r.Precreate(ctx, spec); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("second Precreate: %v", err)
	}
	src := bootT(t, r, spec) // logs the Start-only boot time
	mustCall(t, src, "set precreated-value")
	mustCall(t, src, "write /var/lib/state/value pre")

	res := checkpointT(t, r, src.ID, runtime.TierMemory, false)
	fork := testSpec(uniqueID("prefork"))
	start = time.Now()
	if err := r.PrecreateRestore(ctx, fork, res.Ref); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteQuiet(r, fork.ID) })
	t.Logf("precreate restore %v", time.Since(start))
	f := restoreT(t, r, fork, res.Ref)
	if got := mustCall(t, f, "get"); got != "precreated-value" {
		t.Errorf("precreated fork value %q", got)
	}

	// A precreated sandbox that is deleted instead of booted leaves nothing.
	other := testSpec(uniqueID("predel"))
	if err := r.Precreate(ctx, other); err != nil {
		t.Fatal(err)
	}
	if err := r.Delete(ctx, other.ID); err != nil {
		t.Fatal(err)
	}
	assertGone(t, r, other.ID)
	// Close removes what was precreated and never booted.
	r2 := newTestRuntime(t, testNamespace)
	orphan := testSpec(uniqueID("preclose"))
	if err := r2.Precreate(ctx, orphan); err != nil {
		t.Fatal(err)
	}
	if err := r2.Close(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, r, orphan.ID)
	// Boot with a different spec than precreated discards the precreated one.
	mismatch := testSpec(uniqueID("premis"))
	if err := r.Precreate(ctx, mismatch); err != nil {
		t.Fatal(err)
	}
	mismatch.Env = map[string]string{"TEST_VAR": "changed"}
	inst := bootT(t, r, mismatch)
	if got := mustCall(t, inst, "env TEST_VAR"); got != "changed" {
		t.Errorf("boot after a mismatching precreate got env %q", got)
	}
}

// desktopRuntime returns a runtime on the test's own namespace (never the
// namespace a running controld reconciles) holding the desktop image, and
// that image's reference.
func desktopRuntime(t *testing.T) (*Runtime, context.Context, string) {
	t.Helper()
	r := newTestRuntime(t, "forkfleet-containerdrt-desktop")
	ctx := context.Background()
	return r, ctx, testenv.Image(t, r.ctx(ctx), r.client, r.cfg.Namespace, testenv.Desktop)
}

// TestIntegrationDesktop runs the real desktop image: boot, guestd socket,
// checkpoint, fork.
func TestIntegrationDesktop(t *testing.T) {
	integration(t)
	r, ctx, image := desktopRuntime(t)
	spec := runtime.BootSpec{
		ID: uniqueID("desktop"), Image: image, MemoryBytes: 1 << 30,
		Width: 1280, Height: 800, Depth: 24,
		ACIToken: "aci-" + randomHex(8), AdminToken: "admin-" + randomHex(8),
	}
	// Boot twice: the first run unpacks the image.
	for i := range 2 {
		s := spec
		s.ID = fmt.Sprintf("%s-%d", spec.ID, i)
		bootStart := time.Now()
		inst := bootT(t, r, s)
		if err := waitX(inst, 10*time.Second); err != nil {
			t.Fatalf("%s: %v", s.ID, err)
		}
		t.Logf("boot %s: Xvfb answering %v after Boot began", s.ID, time.Since(bootStart))
		if i == 0 {
			deleteQuiet(r, s.ID)
			continue
		}
		// guestd starts xterm only once openbox manages the screen, which on a
		// cold, loaded machine takes well over a second: wait for the whole
		// session, then let it settle before the checkpoint.
		// xterm's shell (bash) is the last process of the session to appear.
		srcProcs := waitProcs(t, r, inst.ID, []string{"Xvfb", "openbox", "xterm", "bash"}, 30*time.Second)
		// Settled: the same processes in two reads 500 ms apart (bash's
		// startup runs dircolors and the like for a moment).
		for settleBy := time.Now().Add(15 * time.Second); ; {
			time.Sleep(500 * time.Millisecond)
			now := sandboxProcs(t, r, inst.ID)
			if slices.Equal(now, srcProcs) {
				break
			}
			if time.Now().After(settleBy) {
				t.Fatalf("source processes never settled: %v, then %v", srcProcs, now)
			}
			srcProcs = now
		}
		t.Logf("source processes: %v", srcProcs)
		res := checkpointT(t, r, inst.ID, runtime.TierMemory, false)
		if _, err := waitDial(inst.ACISocket, 5*time.Second); err != nil {
			t.Errorf("source guestd after checkpoint: %v", err)
		}
		var wg sync.WaitGroup
		start := time.Now()
		errs := make([]error, 2)
		for j := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				fs := spec
				fs.ID = uniqueID(fmt.Sprintf("dfork%d", j))
				t.Cleanup(func() { deleteQuiet(r, fs.ID) })
				fi, err := r.Restore(ctx, fs, res.Ref)
				if err == nil {
					_, err = waitDial(fi.ACISocket, 10*time.Second)
				}
				if err == nil {
					err = waitX(fi, 10*time.Second)
				}
				if err == nil {
					if procs := sandboxProcs(t, r, fi.ID); !slices.Equal(procs, srcProcs) {
						err = fmt.Errorf("fork runs %v, source ran %v", procs, srcProcs)
					}
				}
				errs[j] = err
			}()
		}
		wg.Wait()
		for j, err := range errs {
			if err != nil {
				t.Errorf("desktop fork %d: %v", j, err)
			}
		}
		t.Logf("desktop fork N=2 wall (guestd socket and Xvfb answering): %v", time.Since(start))
	}
}

// cgroupsExist returns the sandbox's cgroup directories still present in
// any v1 hierarchy.
func (r *Runtime) cgroupsExist(id string) []string {
	entries, err := os.ReadDir(r.cfg.CgroupRoot)
	if err != nil {
		return nil
	}
	var left []string
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(r.cfg.CgroupRoot, e.Name(), r.cgroupsPath(id))
		if _, err := os.Stat(dir); err == nil {
			left = append(left, dir)
		}
	}
	return left
}

// Checkpoints dumped by CRIU directly and through runc hold the same image
// files, and runc restores both (forks are runc restores).
func TestIntegrationDumpPaths(t *testing.T) {
	integration(t)
	r := newTestRuntime(t, testNamespace)
	importTestImage(t, r)
	src := bootT(t, r, testSpec(uniqueID("src")))
	images := map[bool][]string{}
	for _, viaRunc := range []bool{false, true} {
		value := "mem-" + randomHex(8)
		if got := mustCall(t, src, "set "+value); got != "ok" {
			t.Fatal(got)
		}
		r.dumpViaRunc = viaRunc
		res := checkpointT(t, r, src.ID, runtime.TierMemory, false)
		r.dumpViaRunc = false
		ents, err := os.ReadDir(filepath.Join(res.Ref.Dir, criuImageDir))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ents {
			// Pages and per-process images are named by CRIU's ids.
			name := strings.TrimRight(strings.TrimSuffix(e.Name(), ".img"), "-0123456789")
			if strings.HasPrefix(name, "tmpfs-dev-") {
				// /dev's tar: the direct dump binds a template /dev
				// instead (dev layout "bind"); the dump through runc
				// keeps CRIU's tar.
				if !viaRunc {
					t.Errorf("direct dump of runc's /dev tarred it: %s", e.Name())
				}
				continue
			}
			if !slices.Contains(images[viaRunc], name) {
				images[viaRunc] = append(images[viaRunc], name)
			}
		}
		f := restoreT(t, r, testSpec(uniqueID("fork")), res.Ref)
		if got := mustCall(t, f, "get"); got != value {
			t.Errorf("fork of the dump via runc=%v: memory value %q, want %q", viaRunc, got, value)
		}
	}
	slices.Sort(images[false])
	slices.Sort(images[true])
	if !slices.Equal(images[false], images[true]) {
		t.Errorf("image files differ:\n direct %v\n runc   %v", images[false], images[true])
	}
	if !slices.Contains(images[false], "descriptors.json") {
		t.Errorf("direct dump wrote no descriptors.json: %v", images[false])
	}
}

// criuChildren lists the CRIU service processes (criu swrk) this process
// started and has not waited for.
func criuChildren(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		if ppid, err := statPPID(e.Name()); err != nil || ppid != os.Getpid() {
			continue // exited, or not ours
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if slices.Contains(args, "swrk") {
			out = append(out, e.Name()+": "+strings.Join(args, " "))
		}
	}
	return out
}

// A memory checkpoint's CRIU is started before the freeze (its start is
// no part of the frozen window), is the one that dumps, and has exited
// when Checkpoint returns.
func TestIntegrationDumpCRIUStartedBeforeFreeze(t *testing.T) {
	integration(t)
	r := newTestRuntime(t, testNamespace)
	importTestImage(t, r)
	src := bootT(t, r, testSpec(uniqueID("src")))
	value := "mem-" + randomHex(8)
	if got := mustCall(t, src, "set "+value); got != "ok" {
		t.Fatal(got)
	}
	var atFreeze, exes []string
	res, err := r.Checkpoint(context.Background(), src.ID, runtime.CheckpointSpec{
		Dir: filepath.Join(r.cfg.CheckpointRoot, uniqueID("ckpt")), Tier: runtime.TierMemory,
		AfterFreeze: func(context.Context) error {
			atFreeze = criuChildren(t)
			for _, c := range atFreeze {
				exe, _ := os.Readlink(filepath.Join("/proc", strings.SplitN(c, ":", 2)[0], "exe"))
				exes = append(exes, exe)
			}
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.DeleteCheckpoint(context.Background(), res.Ref)
	if len(atFreeze) != 1 {
		t.Errorf("CRIU processes once the sandbox is frozen: %v, want the dump's, started ahead", atFreeze)
	}
	// Started means CRIU itself, not its wrapper waiting for a request
	// (deploy/criu/wrapper.c waits for runc's version probe).
	if wrapper, err := os.ReadFile(r.criuBinary); err == nil && bytes.Contains(wrapper, []byte("forkfleet-criu-wrapper")) {
		for _, exe := range exes {
			if exe == r.criuBinary {
				t.Errorf("at the freeze the dump's CRIU is still its wrapper %s", exe)
			}
		}
	}
	if got := criuChildren(t); len(got) != 0 {
		t.Errorf("CRIU processes after the checkpoint: %v", got)
	}
	f := restoreT(t, r, testSpec(uniqueID("fork")), res.Ref)
	if got := mustCall(t, f, "get"); got != value {
		t.Errorf("fork: memory value %q, want %q", got, value)
	}
}
