//go:build linux

package containerdrt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/oci"
	cerrdefs "github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/network"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

func testRuntimeConfig(t *testing.T) *Runtime {
	cfg := Config{Address: "/nonexistent.sock", StateDir: t.TempDir(), CheckpointRoot: "/var/lib/ck", NetHook: "/usr/local/bin/forkfleet-nethook"}
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		t.Fatal(err)
	}
	return &Runtime{cfg: cfg, criuConfig: filepath.Join(cfg.StateDir, "criu.conf")}
}

func TestConfigValidate(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no address":         {NetHook: "/h"},
		"relative state":     {Address: "/a", NetHook: "/h", StateDir: "state"},
		"bad namespace":      {Address: "/a", NetHook: "/h", Namespace: "no spaces"},
		"relative ckpt":      {Address: "/a", NetHook: "/h", CheckpointRoot: "ck"},
		"multiline options":  {Address: "/a", NetHook: "/h", CRIUOptions: []string{"tcp-close\nshell-job"}},
		"negative /dev size": {Address: "/a", NetHook: "/h", DevShmBytes: -1},
		"no network hook":    {Address: "/a"},
		"relative hook":      {Address: "/a", NetHook: "forkfleet-nethook"},
	} {
		cfg.setDefaults()
		if err := cfg.validate(); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
}

func TestValidateBootSpec(t *testing.T) {
	good := runtime.BootSpec{ID: "sb-1", Image: "img", MemoryBytes: 64 << 20, Env: map[string]string{"A": "b"}}
	if err := validateBootSpec(good); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*runtime.BootSpec){
		"bad id":        func(s *runtime.BootSpec) { s.ID = "no/slash" },
		"empty id":      func(s *runtime.BootSpec) { s.ID = "" },
		"negative cpu":  func(s *runtime.BootSpec) { s.CPUMillis = -1 },
		"tiny memory":   func(s *runtime.BootSpec) { s.MemoryBytes = 1 << 20 },
		"reserved env":  func(s *runtime.BootSpec) { s.Env = map[string]string{"FORKFLEET_ACI_TOKEN": "x"} },
		"bad env name":  func(s *runtime.BootSpec) { s.Env = map[string]string{"A=B": "x"} },
		"huge label":    func(s *runtime.BootSpec) { s.Labels = map[string]string{"k": strings.Repeat("v", 5000)} },
		"empty label k": func(s *runtime.BootSpec) { s.Labels = map[string]string{"": "v"} },
	} {
		s := good
		mut(&s)
		if err := validateBootSpec(s); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
}

func TestEnv(t *testing.T) {
	spec := runtime.BootSpec{ID: "sb", ACIToken: "a", AdminToken: "b", Width: 1920, Height: 1080,
		Env: map[string]string{"Z": "1", "PATH": "/custom"}}
	env := mergeEnv([]string{"PATH=/usr/bin", "HOME=/root"}, sandboxEnv(spec))
	want := []string{"HOME=/root", "FORKFLEET_ACI_TOKEN=a", "FORKFLEET_ADMIN_TOKEN=b", "FORKFLEET_SANDBOX_ID=sb",
		"FORKFLEET_SCREEN=1920x1080x24", "PATH=/custom", "Z=1"}
	if !slices.Equal(env, want) {
		t.Errorf("env\n got %q\nwant %q", env, want)
	}
	// A disk-tier fork strips the source's identity and variables; the
	// image's own variables stay (PATH was overridden by the caller, so it
	// goes too and the fork's own spec decides).
	stripped := stripSandboxEnv(env, strings.Split(userEnvKeys(spec.Env), ","))
	if !slices.Equal(stripped, []string{"HOME=/root"}) {
		t.Errorf("stripped %q", stripped)
	}
	// Root for the agent only when asked; a disk-tier fork's own spec
	// decides again.
	spec.RunAsRoot = true
	env = sandboxEnv(spec)
	if !slices.Contains(env, "FORKFLEET_RUN_AS_ROOT=1") {
		t.Errorf("run as root: env %q", env)
	}
	if stripped := stripSandboxEnv(env, nil); slices.ContainsFunc(stripped, func(kv string) bool { return strings.HasPrefix(kv, "FORKFLEET_") }) {
		t.Errorf("stripped %q", stripped)
	}
}

func TestWithSandboxSpec(t *testing.T) {
	r := testRuntimeConfig(t)
	ctx := context.Background()
	s := &oci.Spec{
		Process: &specs.Process{},
		Linux: &specs.Linux{
			CgroupsPath: "/forkfleet/source",
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace, Path: "/proc/1/ns/net"},
			},
			Resources: &specs.LinuxResources{Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}},
		},
		Mounts: []specs.Mount{
			{Destination: "/dev/shm", Type: "tmpfs", Options: []string{"nosuid", "size=65536k"}},
			{Destination: "/run", Type: "tmpfs", Options: []string{"nosuid", "size=65536k"}},
		},
	}
	spec := runtime.BootSpec{ID: "fork-1", CPUMillis: 500, MemoryBytes: 128 << 20, Network: runtime.NetworkSpec{Mode: network.ModeEgress}}
	nsb := network.Sandbox{NetNS: "/run/forkfleet/net/ns/fork-1", ResolvConf: "/run/forkfleet/net/resolv.conf",
		HookArgs: []string{"-pin", "/run/forkfleet/net/ns/fork-1", "-router", "/run/forkfleet/net/ns/fork-1.rt"}}
	if err := r.withSandbox(spec, nsb)(ctx, nil, nil, s); err != nil {
		t.Fatal(err)
	}
	if s.Linux.CgroupsPath != "/forkfleet/fork-1" {
		t.Errorf("cgroups path %q: a fork must not share its source's cgroup", s.Linux.CgroupsPath)
	}
	if *s.Linux.Resources.Memory.Limit != 128<<20 || *s.Linux.Resources.CPU.Quota != 50000 || *s.Linux.Resources.CPU.Period != 100000 {
		t.Errorf("resources %+v %+v", s.Linux.Resources.Memory, s.Linux.Resources.CPU)
	}
	if len(s.Linux.Resources.Devices) != 1 {
		t.Errorf("device rules lost: %+v", s.Linux.Resources.Devices)
	}
	var netns []specs.LinuxNamespace
	for _, ns := range s.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace {
			netns = append(netns, ns)
		}
	}
	if len(netns) != 1 || netns[0].Path != "" {
		t.Errorf("network namespaces %+v, want one of the fork's own, made by runc (no path)", netns)
	}
	if h := s.Hooks; h == nil || len(h.CreateRuntime) != 1 || len(h.Prestart)+len(h.CreateContainer)+len(h.StartContainer)+len(h.Poststart)+len(h.Poststop) != 0 ||
		h.CreateRuntime[0].Path != r.cfg.NetHook || !slices.Equal(h.CreateRuntime[0].Args, append([]string{NetHookName}, nsb.HookArgs...)) {
		t.Errorf("hooks %+v, want only the network hook with %v", h, nsb.HookArgs)
	}
	if !hasMount(s, resolvConfPath) || s.Annotations[networkAnnotation] != "egress" {
		t.Errorf("egress sandbox: no resolver mount or mode annotation: %+v %v", s.Mounts, s.Annotations)
	}
	if err := r.withSandbox(runtime.BootSpec{ID: "fork-2"}, network.Sandbox{NetNS: "/x"})(ctx, nil, nil, s); err != nil {
		t.Fatal(err)
	}
	if hasMount(s, resolvConfPath) || s.Annotations[networkAnnotation] != "none" {
		t.Errorf("mode none kept the egress resolver mount or annotation: %+v %v", s.Mounts, s.Annotations)
	}
	for _, m := range s.Mounts {
		if m.Destination == "/run" && !slices.Contains(m.Options, fmt.Sprintf("size=%d", DefaultRunTmpfsBytes)) {
			t.Errorf("/run options %v", m.Options)
		}
		if slices.Contains(m.Options, "size=65536k") {
			t.Errorf("%s kept its old size: %v", m.Destination, m.Options)
		}
	}
	if s.Annotations[criuConfigAnnotation] != r.criuConfig || s.Hostname != DefaultHostname {
		t.Errorf("annotations %v hostname %q", s.Annotations, s.Hostname)
	}

	// Masked directories become read-only binds of the empty directory (no
	// tmpfs for CRIU to tar), empty ones in /proc are not masked; files stay
	// masked by runc.
	r.emptyDir = "/state/empty"
	r.maskDirs = map[string]bool{"/sys/firmware": true}
	r.unmaskDirs = map[string]bool{"/proc/acpi": true} // empty on this kernel
	s3 := &oci.Spec{Linux: &specs.Linux{MaskedPaths: []string{"/proc/kcore", "/proc/acpi", "/sys/firmware"}}}
	if err := r.withSandbox(spec, network.Sandbox{})(ctx, nil, nil, s3); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s3.Linux.MaskedPaths, []string{"/proc/kcore"}) {
		t.Errorf("masked paths %v", s3.Linux.MaskedPaths)
	}
	i := slices.IndexFunc(s3.Mounts, func(m specs.Mount) bool { return m.Destination == "/sys/firmware" })
	if i < 0 || s3.Mounts[i].Type != "bind" || s3.Mounts[i].Source != "/state/empty" || !slices.Contains(s3.Mounts[i].Options, "ro") {
		t.Fatalf("mounts %+v", s3.Mounts)
	}
	// A spec saved by a runtime with another state dir gets this one's.
	s3.Mounts[i].Source = "/elsewhere/empty"
	if err := r.withSandbox(spec, network.Sandbox{})(ctx, nil, nil, s3); err != nil {
		t.Fatal(err)
	}
	if n := len(slices.DeleteFunc(slices.Clone(s3.Mounts), func(m specs.Mount) bool { return m.Destination != "/sys/firmware" })); n != 1 || s3.Mounts[i].Source != "/state/empty" {
		t.Errorf("after re-applying: %d /sys/firmware mounts, source %q", n, s3.Mounts[i].Source)
	}
	r.emptyDir, r.maskDirs, r.unmaskDirs = "", nil, nil

	// No tmpfs on /dev/shm (it lives in /dev's, sized for it); /run is
	// added when missing.
	r.cfg.DevShmBytes = 32 << 20
	s2 := &oci.Spec{Mounts: []specs.Mount{
		{Destination: "/dev", Type: "tmpfs", Options: []string{"nosuid", "size=65536k"}},
		{Destination: "/dev/shm", Type: "tmpfs"},
	}}
	if err := r.withSandbox(spec, network.Sandbox{})(ctx, nil, nil, s2); err != nil {
		t.Fatal(err)
	}
	if len(s2.Mounts) != 2 || s2.Mounts[0].Destination != "/dev" || s2.Mounts[1].Destination != "/run" ||
		!slices.Equal(s2.Mounts[0].Options, []string{"nosuid", "size=33554432"}) {
		t.Errorf("mounts %+v", s2.Mounts)
	}
}

func TestLabels(t *testing.T) {
	spec := runtime.BootSpec{ID: "x", Image: "img", Labels: map[string]string{"owner": "me"}, Env: map[string]string{"B": "", "A": ""}}
	l := sandboxLabels(spec)
	if l[labelSandbox] != "true" || l[labelImage] != "img" || l[labelEnvKeys] != "A,B" || l[labelScreen] != "1280x800x24" {
		t.Errorf("labels %v", l)
	}
	if u := userLabels(l); len(u) != 1 || u["owner"] != "me" {
		t.Errorf("user labels %v", u)
	}
}

func TestFingerprint(t *testing.T) {
	a := runtime.BootSpec{ID: "x", Image: "img", Env: map[string]string{"A": "1", "B": "2"}}
	b := runtime.BootSpec{ID: "x", Image: "img", Env: map[string]string{"B": "2", "A": "1"}}
	if bootFingerprint(a) != bootFingerprint(b) {
		t.Error("fingerprint depends on map order")
	}
	b.ACIToken = "t"
	if bootFingerprint(a) == bootFingerprint(b) {
		t.Error("fingerprint ignores the token")
	}
	if bootFingerprint(a) == restoreFingerprint(a, runtime.CheckpointRef{}) {
		t.Error("boot and restore fingerprints collide")
	}
}

func TestConvertErr(t *testing.T) {
	for _, c := range []struct {
		in   error
		want error
	}{
		{fmt.Errorf("x: %w", cerrdefs.ErrNotFound), errdefs.ErrNotFound},
		{status.Error(codes.NotFound, "container x: not found"), errdefs.ErrNotFound},
		{status.Error(codes.AlreadyExists, "exists"), errdefs.ErrAlreadyExists},
		{status.Error(codes.Unavailable, "connection refused"), errdefs.ErrUnavailable},
		{cerrdefs.ErrFailedPrecondition, errdefs.ErrFailedPrecondition},
		{errors.New("boom"), errdefs.ErrInternal},
	} {
		if got := convertErr(c.in); !errors.Is(got, c.want) {
			t.Errorf("convertErr(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	if convertErr(nil) != nil {
		t.Error("nil")
	}
	if got := convertErr(context.Canceled); got != context.Canceled {
		t.Errorf("canceled: %v", got)
	}
}

func TestUpperDir(t *testing.T) {
	up, err := upperDir([]mount.Mount{{Type: "overlay", Options: []string{"workdir=/w", "upperdir=/u", "lowerdir=/l"}}})
	if err != nil || up != "/u" {
		t.Errorf("overlay: %q %v", up, err)
	}
	up, err = upperDir([]mount.Mount{{Type: "bind", Source: "/fs", Options: []string{"rw", "rbind"}}})
	if err != nil || up != "/fs" {
		t.Errorf("bind: %q %v", up, err)
	}
	if _, err := upperDir([]mount.Mount{{Type: "overlay", Options: []string{"lowerdir=/a:/b"}}}); err == nil {
		t.Error("read-only overlay accepted")
	}
	if _, err := upperDir(nil); err == nil {
		t.Error("no mounts accepted")
	}
}

func TestValidateCheckpointDir(t *testing.T) {
	r := testRuntimeConfig(t)
	for _, d := range []string{"", "rel", "/var/lib/ck", "/var/lib/ck/../x", "/etc/x", "/var/lib/ck/a/"} {
		if err := r.validateCheckpointDir("dir", d); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%q: %v", d, err)
		}
	}
	if err := r.validateCheckpointDir("dir", "/var/lib/ck/a/b"); err != nil {
		t.Error(err)
	}
}

// TestLayerCopier mirrors a tree in two passes with changes in between, as
// Checkpoint does around the freeze.
func TestLayerCopier(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	write := func(rel, content string) {
		t.Helper()
		p := filepath.Join(src, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	write("etc/keep", "keep")
	write("root/.cache/log", "line1\n")
	write("tmp/gone", "bye")
	write("big", strings.Repeat("z", 3<<20))
	if err := os.Symlink("etc/keep", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(src, "etc/keep"), filepath.Join(src, "hard")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(src, "fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	// A unix socket file is skipped.
	sock, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(sock)
	if err := unix.Bind(sock, &unix.SockaddrUnix{Name: filepath.Join(src, "sock")}); err != nil {
		t.Fatal(err)
	}
	root := os.Geteuid() == 0
	if root {
		// An overlay whiteout and an opaque directory.
		if err := unix.Mknod(filepath.Join(src, "etc/deleted"), unix.S_IFCHR, 0); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(filepath.Join(src, "opaque"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Setxattr(filepath.Join(src, "opaque"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
			t.Fatal(err)
		}
	}

	lc := newLayerCopier(src, dst)
	if err := lc.First(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Changes while "running": append to an open log, delete, create.
	f, err := os.OpenFile(filepath.Join(src, "root/.cache/log"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("line2\n")
	f.Close()
	os.Remove(filepath.Join(src, "tmp/gone"))
	write("tmp/new", "new")
	if err := os.Chmod(filepath.Join(src, "etc"), 0o700); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	if err := lc.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}

	checkSame := func(rel string) {
		t.Helper()
		var a, b unix.Stat_t
		if err := unix.Lstat(filepath.Join(src, rel), &a); err != nil {
			t.Fatal(err)
		}
		if err := unix.Lstat(filepath.Join(dst, rel), &b); err != nil {
			t.Errorf("%s missing in copy: %v", rel, err)
			return
		}
		if a.Mode != b.Mode || a.Uid != b.Uid || a.Size != b.Size || a.Rdev != b.Rdev || a.Mtim != b.Mtim {
			t.Errorf("%s differs: mode %o/%o size %d/%d mtime %v/%v", rel, a.Mode, b.Mode, a.Size, b.Size, a.Mtim, b.Mtim)
		}
		if a.Mode&unix.S_IFMT == unix.S_IFREG {
			x, _ := os.ReadFile(filepath.Join(src, rel))
			y, _ := os.ReadFile(filepath.Join(dst, rel))
			if !bytes.Equal(x, y) {
				t.Errorf("%s content differs", rel)
			}
		}
	}
	for _, rel := range []string{"etc", "etc/keep", "root/.cache/log", "tmp/new", "big", "link", "hard", "fifo", "tmp"} {
		checkSame(rel)
	}
	if _, err := os.Lstat(filepath.Join(dst, "tmp/gone")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("deleted file still in copy: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(dst, "sock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket copied: %v", err)
	}
	var a, b unix.Stat_t
	unix.Lstat(filepath.Join(dst, "etc/keep"), &a)
	unix.Lstat(filepath.Join(dst, "hard"), &b)
	if a.Ino != b.Ino {
		t.Error("hard link not kept")
	}
	if root {
		checkSame("etc/deleted")
		v := make([]byte, 8)
		n, err := unix.Lgetxattr(filepath.Join(dst, "opaque"), "trusted.overlay.opaque", v)
		if err != nil || string(v[:n]) != "y" {
			t.Errorf("opaque xattr: %q %v", v[:n], err)
		}
	}
	if got, want := lc.Bytes(), int64(3<<20+len("keep")+len("line1\nline2\n")+len("new")); got != want {
		t.Errorf("Bytes = %d, want %d", got, want)
	}
}

func TestUndumpable(t *testing.T) {
	for _, tc := range []struct{ log, want string }{
		{"Error (criu/files-reg.c:1100): Can't dump ghost file /tmp/x of 16777216 size, increase limit", `deleted file "/tmp/x" (16777216 bytes)`},
		{"Error (criu/sk-unix.c:900): unix: Unix socket 0x1 without peer 0x2", "unix socket"},
		// The harmless first error line must not hide the watch CRIU gave up on.
		{"(00.001) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted\n" +
			"(00.3) Warn  (criu/fsnotify.c:336): fsnotify: \tHandle 0x2b:0x1e0a cannot be opened\n" +
			"(00.4) Warn  (criu/fsnotify.c:336): fsnotify: \tHandle 0x2b:0x1e0b cannot be opened\n" +
			"(00.4) Error (criu/fsnotify.c:339): fsnotify: \tCan't dump that handle\n", "inotify watch on inode 0x1e0b of device 0x2b"},
		{"Error (compel/src/lib/infect.c:262): Unseizable non-zombie 13323 found, state S, err -1/10", "process 13323 (host pid, state S), which CRIU cannot stop: another process traces it"},
		{"(00.02) Error (criu/seize.c:335): zombie 27165 (comm ) found while seizing\n" +
			"(10.02) Error (criu/seize.c:335): zombie 27165 (comm ) found while seizing", "process 27165 (host pid), which CRIU could not seize before its freeze timeout: another process traces it"},
		{"Error (compel/src/lib/infect.c:262): Unseizable non-zombie 13323 found, state R, err -1/3", "process 13323 (host pid, state R), which CRIU cannot stop"},
		// Uninterruptible sleep is a moment's state, not the sandbox's:
		// retried, then UNAVAILABLE (TestUninterruptibleDump).
		{"Error (compel/src/lib/infect.c:262): Unseizable non-zombie 13323 found, state D, err -1/10", ""},
		{"Error (criu/cr-dump.c:1): Dumping FAILED.", ""},
		{"", ""},
	} {
		got := undumpable(tc.log)
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("undumpable(%q) = %q, want something naming %q", tc.log, got, tc.want)
		}
	}
}

func TestUninterruptibleDump(t *testing.T) {
	log := "(00.001) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted\n" +
		"(00.2) Error (compel/src/lib/infect.c:262): Unseizable non-zombie 4242 found, state D, err -1/10\n"
	pid, ok := uninterruptible(log)
	if !ok || pid != "4242" {
		t.Fatalf("uninterruptible = %q, %v; want 4242", pid, ok)
	}
	if _, ok := uninterruptible("Unseizable non-zombie 4242 found, state S, err -1/10"); ok {
		t.Error("state S taken for uninterruptible sleep")
	}
	var err error = &uninterruptibleError{sandbox: "sb", pid: pid}
	err = fmt.Errorf("checkpoint: %w", err)
	if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("%v is not UNAVAILABLE", err)
	}
	if !retryableDump(err) {
		t.Errorf("%v is not retried", err)
	}
	if retryableDump(fmt.Errorf("dump: %w", errdefs.ErrUnavailable)) {
		t.Error("any UNAVAILABLE is retried, not only a process in uninterruptible sleep")
	}
}

func TestEmptyProcDirs(t *testing.T) {
	dir := t.TempDir()
	empty, full := filepath.Join(dir, "empty"), filepath.Join(dir, "full")
	for _, d := range []string{empty, full} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(full, "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	got := emptyProcDirs([]string{empty, full, filepath.Join(dir, "missing")})
	if len(got) != 1 || !got[empty] {
		t.Errorf("emptyProcDirs = %v, want only %s", got, empty)
	}
}
