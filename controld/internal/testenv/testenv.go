// Package testenv is the one place controld's real-stack tests learn their
// environment: whether to run at all, which containerd, which namespace, and
// the images they boot. Every test that needs an image in its own namespace
// brings it there through Image, so `make test` works on a machine where
// nothing was imported by hand.
//
// Tests opt in with FORKFLEET_INTEGRATION=1 (make test sets it) and then
// fail loudly, never skip, when the machine cannot run them. Two checkouts
// testing on one host at once set FORKFLEET_TEST_SUFFIX to keep their
// containerd namespaces and cgroups apart.
package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	cerrdefs "github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"

	"github.com/forkfleet/forkfleet/api/desktoptest"
	"github.com/forkfleet/forkfleet/api/registrytest"
	"github.com/forkfleet/forkfleet/controld/internal/imageimport"
	"github.com/forkfleet/forkfleet/controld/internal/userns"
)

// Environment variables the real-stack tests read.
const (
	EnvIntegration = "FORKFLEET_INTEGRATION"
	EnvAddress     = "FORKFLEET_CONTAINERD_ADDRESS"
	EnvSuffix      = "FORKFLEET_TEST_SUFFIX"
)

// DefaultAddress is the project's containerd (deploy/host-setup.sh).
const DefaultAddress = "/run/forkfleet/containerd/containerd.sock"

// The images the tests boot: built and cached as OCI layouts by `make image`.
const (
	Desktop    = "desktop"
	DesktopWeb = "desktop-web"
)

// ImageCache is where images/*/build.sh keep each image's OCI layout by
// default; FORKFLEET_IMAGE_CACHE moves it, for the tests as for build.sh (a
// checkout testing its own guestd builds its images there).
const ImageCache = "/var/cache/forkfleet/images"

// EnvImageCache overrides ImageCache.
const EnvImageCache = "FORKFLEET_IMAGE_CACHE"

// Enabled reports whether the real-stack tests were asked for.
func Enabled() bool { return os.Getenv(EnvIntegration) == "1" }

// RealStack skips t unless FORKFLEET_INTEGRATION=1, and fails it when the
// machine cannot run real-stack tests: not root, or no containerd.
func RealStack(t testing.TB) {
	t.Helper()
	if !Enabled() {
		t.Skip("set " + EnvIntegration + "=1 to run against containerd, runc and CRIU")
	}
	if os.Geteuid() != 0 {
		t.Fatal(EnvIntegration + "=1 needs root (containerd, cgroups, CRIU)")
	}
	if _, err := os.Stat(Address()); err != nil {
		t.Fatalf("%s=1 but containerd is not at %s (make test sets it up): %v", EnvIntegration, Address(), err)
	}
	if err := hostDevices(); err != nil {
		t.Fatalf("the host is damaged before this test: %v", err)
	}
	t.Cleanup(func() {
		if err := hostDevices(); err != nil {
			t.Errorf("the host is damaged after this test: %v", err)
		}
	})
}

// hostDevices checks the host's device nodes that every process writes to
// or reads from. Once, during a session of real-stack tests and benchmarks,
// the host's /dev/null became a regular file, and every later runc start and
// CRIU restore failed; checking around each real-stack test names the test
// that broke it instead of those that come after.
func hostDevices() error {
	for _, d := range []struct {
		path         string
		major, minor uint32
	}{{"/dev/null", 1, 3}, {"/dev/zero", 1, 5}, {"/dev/full", 1, 7}, {"/dev/random", 1, 8}, {"/dev/urandom", 1, 9}} {
		var st unix.Stat_t
		if err := unix.Lstat(d.path, &st); err != nil {
			return fmt.Errorf("%s: %w", d.path, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != d.major || unix.Minor(st.Rdev) != d.minor {
			return fmt.Errorf("%s is not the character device %d:%d (mode %#o, rdev %d:%d)", d.path, d.major, d.minor,
				st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev))
		}
	}
	return nil
}

// Address is the containerd socket the tests use.
func Address() string {
	if a := os.Getenv(EnvAddress); a != "" {
		return a
	}
	return DefaultAddress
}

// Namespace is the containerd namespace a test named base runs in: never
// the namespace a running controld reconciles, and distinct per checkout
// when FORKFLEET_TEST_SUFFIX is set.
func Namespace(base string) string { return suffixed(base, "-") }

// CgroupParent is the cgroup parent of a test's sandboxes, distinct per
// checkout like Namespace.
func CgroupParent(base string) string { return suffixed(base, "-") }

func suffixed(base, sep string) string {
	if s := os.Getenv(EnvSuffix); s != "" {
		return base + sep + s
	}
	return base
}

// ImageRef is the reference an image named name (Desktop, DesktopWeb) has
// in containerd.
func ImageRef(name string) string { return "localhost/forkfleet/" + name + ":latest" }

// Layout is where the OCI layout of image name is cached.
func Layout(name string) string {
	dir := ImageCache
	if d := os.Getenv(EnvImageCache); d != "" {
		dir = d
	}
	return filepath.Join(dir, name+"-oci")
}

// Image brings image name into namespace ns of c from its cached layout
// (nothing is done when ns already holds that manifest) and returns its
// reference. A missing layout fails the test with what to run.
func Image(t testing.TB, ctx context.Context, c *client.Client, ns, name string) string {
	t.Helper()
	ref, err := ImportImage(ctx, c, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// ImportImage is Image for callers that are not a test (a benchmark in a
// test binary, a helper run once for several tests).
func ImportImage(ctx context.Context, c *client.Client, ns, name string) (string, error) {
	layout := Layout(name)
	if _, err := os.Stat(filepath.Join(layout, "index.json")); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("image %s: no OCI layout at %s: build it with `make image` (make test does)", name, layout)
		}
		return "", fmt.Errorf("image %s: %w", name, err)
	}
	if _, err := imageimport.Import(ctx, c, imageimport.Options{
		Namespace: ns, Snapshotter: "overlayfs", Unpack: true, Layout: layout,
	}); err != nil {
		return "", fmt.Errorf("import image %s into namespace %s from %s: %w", name, ns, layout, err)
	}
	ref := ImageRef(name)
	if _, err := c.GetImage(namespaces.WithNamespace(ctx, ns), ref); err != nil {
		return "", fmt.Errorf("image %s: layout %s does not name %s: %w", name, layout, ref, err)
	}
	return ref, nil
}

// UserNamespaces is the pool of user namespace ranges the tests' sandboxes
// run in, as controld's do by default: the subordinate ids
// deploy/host-setup.sh reserves, shared with every runtime on the host.
// With enabled false (a config's userns.enabled), none: sandboxes run in
// the host's user namespace.
func UserNamespaces(t testing.TB, enabled ...bool) *userns.Pool {
	t.Helper()
	if len(enabled) > 0 && !enabled[0] {
		return nil
	}
	p, err := userns.Load(userns.Config{})
	if err != nil {
		t.Fatalf("user namespace ranges (make test runs deploy/host-setup.sh, which reserves them): %v", err)
	}
	return p
}

// LayersDir is where the tests' sandboxes keep their writable layers (a
// btrfs with quotas): the host's, which deploy/host-setup.sh mounts (its
// host.env names it); each test namespace gets its own directory there.
func LayersDir() string {
	if d := os.Getenv("FORKFLEET_LAYERS_DIR"); d != "" {
		return d
	}
	return "/var/lib/forkfleet/layers"
}

// LogWriter builds forkfleet-log, the logging binary the runtime hands the
// shim for every sandbox with a log budget (controld always sets one), into
// a directory of t's and returns its path (containerdrt.Config.LogWriter).
// Built per test: the go build cache makes it a link of a small binary.
func LogWriter(t testing.TB) string { return helper(t, "forkfleet-log") }

// NetHook builds forkfleet-nethook, the hook runc runs for every sandbox's
// network, as LogWriter does (containerdrt.Config.NetHook).
func NetHook(t testing.TB) string { return helper(t, "forkfleet-nethook") }

func helper(t testing.TB, name string) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), name)
	if err := BuildHelpers(filepath.Dir(out), name); err != nil {
		t.Fatal(err)
	}
	return out
}

// Helpers are the binaries controld finds beside its own.
var Helpers = []string{"forkfleet-log", "forkfleet-nethook"}

// BuildHelpers builds the named helper binaries (controld/cmd/<name>) into
// dir, all of Helpers when none is named.
func BuildHelpers(dir string, names ...string) error {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("the go tool is not on PATH to build controld's helpers: %w", err)
	}
	if len(names) == 0 {
		names = Helpers
	}
	for _, name := range names {
		cmd := exec.Command(goBin, "build", "-o", filepath.Join(dir, name), "github.com/forkfleet/forkfleet/controld/cmd/"+name)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build %s: %v\n%s", name, err, b)
		}
	}
	return nil
}

// PrometheusBin is where `make test-tools` (deploy/host-setup.sh
// --prometheus) unpacks Debian's prometheus and promtool.
const PrometheusBin = "/var/cache/forkfleet/prometheus/bin"

// RegistryBin is where `make test-tools` (deploy/host-setup.sh --registry)
// unpacks Debian's docker-registry.
var RegistryBin = filepath.Dir(registrytest.Bin)

// Tool returns the path of an operator's tool the tests drive controld with
// (grpcurl, grpc-health-probe, prometheus, promtool, docker-registry; `make
// test-tools` installs them): from PATH, the checkout's .cache/bin,
// PrometheusBin or RegistryBin.
// Missing, it skips t, or fails it under FORKFLEET_INTEGRATION=1 (make test
// installs them first).
func Tool(t testing.TB, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	dirs := []string{PrometheusBin, RegistryBin}
	if wd, err := os.Getwd(); err == nil {
		if root := desktoptest.RepoRoot(wd); root != "" {
			dirs = append(dirs, filepath.Join(root, ".cache", "bin"))
		}
	}
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	if Enabled() {
		t.Fatalf("FORKFLEET_INTEGRATION=1 but %s is not installed (make test-tools)", name)
	}
	t.Skipf("%s not installed (make test-tools)", name)
	return ""
}

// Registry starts a real OCI registry (Debian's docker-registry,
// registrytest) on a free loopback port, its storage in a temporary
// directory, stopped when t ends, and returns its host:port. Missing, it
// skips t, or fails it under FORKFLEET_INTEGRATION=1.
func Registry(t testing.TB) string {
	t.Helper()
	bin := Tool(t, "docker-registry")
	r, err := registrytest.Start(context.Background(), bin, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.Close()
		if t.Failed() {
			if b, err := os.ReadFile(r.Log); err == nil && len(b) > 0 {
				t.Logf("docker-registry log:\n%s", b)
			}
		}
	})
	return r.Addr
}

// Rebuild names to (made or moved) an image that is another build of
// image from: from's manifest with an annotation of its own (build), so
// another digest over the same config and layers, as a rebuild of an
// image with other build metadata. It returns the new manifest.
func Rebuild(t testing.TB, ctx context.Context, c *client.Client, ns, from, to, build string) ocispec.Descriptor {
	t.Helper()
	ctx = namespaces.WithNamespace(ctx, ns)
	// Content nothing references yet goes at the next GC, which any
	// deletion on the host may start: the new manifest is written under a
	// lease, held until the image record names it.
	ctx, done, err := c.WithLease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer done(context.WithoutCancel(ctx))
	is, cs := c.ImageService(), c.ContentStore()
	src, err := is.Get(ctx, from)
	if err != nil {
		t.Fatal(err)
	}
	b, err := content.ReadBlob(ctx, cs, src.Target)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	m["annotations"] = map[string]string{"org.forkfleet.test.build": build}
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	info, err := cs.Info(ctx, src.Target.Digest)
	if err != nil {
		t.Fatal(err)
	}
	d := ocispec.Descriptor{MediaType: src.Target.MediaType, Digest: digest.FromBytes(b), Size: int64(len(b))}
	// The labels are the gc references to the config and layers.
	if err := content.WriteBlob(ctx, cs, d.Digest.String(), bytes.NewReader(b), d, content.WithLabels(info.Labels)); err != nil && !cerrdefs.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	img := images.Image{Name: to, Target: d}
	if _, err := is.Update(ctx, img, "target"); cerrdefs.IsNotFound(err) {
		_, err = is.Create(ctx, img)
	}
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// CollectGarbage runs containerd's garbage collector in namespace ns now
// (a synchronous delete of a throwaway name for image ref).
func CollectGarbage(t testing.TB, ctx context.Context, c *client.Client, ns, ref string) {
	t.Helper()
	ctx = namespaces.WithNamespace(ctx, ns)
	is := c.ImageService()
	img, err := is.Get(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	img.Name = ref + "-gc-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := is.Create(ctx, img); err != nil {
		t.Fatal(err)
	}
	if err := is.Delete(ctx, img.Name, images.SynchronousDelete()); err != nil {
		t.Fatal(err)
	}
}
