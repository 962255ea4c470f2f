//go:build linux

package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/platforms"
	"github.com/forkfleet/forkfleet/controld/internal/imageimport"
)

// testContainerd connects to FORKFLEET_CONTAINERD_ADDRESS, or, when that is
// unset, starts a private containerd (root, state and socket under a temp
// dir) from FORKFLEET_CONTAINERD_BIN, /var/cache/forkfleet/containerd-v2.4.2/bin
// or PATH. With FORKFLEET_INTEGRATION=1 any failure to get one fails the test.
func testContainerd(t *testing.T) (*containerd.Client, string) {
	t.Helper()
	if os.Getenv("FORKFLEET_INTEGRATION") != "1" {
		t.Skip("set FORKFLEET_INTEGRATION=1 to run against a real containerd")
	}
	addr := os.Getenv("FORKFLEET_CONTAINERD_ADDRESS")
	if addr == "" {
		addr = startScratchContainerd(t)
	}
	c, err := containerd.New(addr, containerd.WithTimeout(10*time.Second))
	if err != nil {
		t.Fatalf("connect to containerd at %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Version(ctx); err != nil {
		t.Fatalf("containerd at %s does not answer: %v", addr, err)
	}
	return c, addr
}

func startScratchContainerd(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("a scratch containerd needs root")
	}
	bin := os.Getenv("FORKFLEET_CONTAINERD_BIN")
	if bin == "" {
		bin = "/var/cache/forkfleet/containerd-v2.4.2/bin"
	}
	exe := filepath.Join(bin, "containerd")
	if _, err := os.Stat(exe); err != nil {
		p, lerr := exec.LookPath("containerd")
		if lerr != nil {
			t.Fatalf("no containerd binary in %s or PATH", bin)
		}
		exe = p
	}
	// Short path: unix socket paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("/tmp", "ffimg-ctd-")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "c.sock")
	cfg := fmt.Sprintf(`version = 3
root = %q
state = %q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime", "io.containerd.podsandbox.controller.v1.podsandbox"]
[grpc]
  address = %q
[ttrpc]
  address = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, sock+".ttrpc")
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "--config", filepath.Join(dir, "config.toml"))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(exe)+":"+os.Getenv("PATH"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start containerd: %v", err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		logf.Close()
		os.RemoveAll(dir)
	})
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			return sock
		}
	}
	b, _ := os.ReadFile(filepath.Join(dir, "containerd.log"))
	t.Fatalf("scratch containerd did not create %s:\n%s", sock, b)
	return ""
}

func TestImportIntegration(t *testing.T) {
	c, _ := testContainerd(t)
	ns := fmt.Sprintf("forkfleet-imgtest-%d", os.Getpid())
	ctx := namespaces.WithNamespace(context.Background(), ns)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()

	out := filepath.Join(t.TempDir(), "layout")
	bo, err := parseBuild(buildArgs(tinyBase(t), tinyBin(t, fmt.Sprint("guestd ", time.Now().UnixNano())), out))
	if err != nil {
		t.Fatal(err)
	}
	built, err := buildImage(ctx, bo)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Leave the shared containerd as we found it.
		cctx := namespaces.WithNamespace(context.Background(), ns)
		c.ImageService().Delete(cctx, bo.name, images.SynchronousDelete())
		c.NamespaceService().Delete(cctx, ns)
	})

	opts := imageimport.Options{Namespace: ns, Snapshotter: defaultSnapshotter, Unpack: true, Layout: out}
	res, err := imageimport.Import(ctx, c, opts)
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	if len(res) != 1 || !strings.HasPrefix(res[0].Action, "imported+unpacked") || res[0].Manifest != built.manifest.Digest.String() {
		t.Fatalf("first import: %+v", res)
	}
	t.Logf("first import: %s", res[0])

	img, err := c.GetImage(ctx, bo.name)
	if err != nil {
		t.Fatalf("image not in containerd: %v", err)
	}
	if img.Target().Digest != built.manifest.Digest {
		t.Fatalf("image target %s, built %s", img.Target().Digest, built.manifest.Digest)
	}
	if _, ok := img.Labels()[imageimport.GCExpireLabel]; ok {
		t.Fatalf("image has %s: %v", imageimport.GCExpireLabel, img.Labels())
	}

	// Force a synchronous garbage collection: the image and its snapshot
	// must survive it (an index-name import would not).
	tmp := images.Image{Name: bo.name + "-gc-probe", Target: img.Target()}
	if _, err := c.ImageService().Create(ctx, tmp); err != nil {
		t.Fatal(err)
	}
	if err := c.ImageService().Delete(ctx, tmp.Name, images.SynchronousDelete()); err != nil {
		t.Fatal(err)
	}
	if ok, _, _, missing, err := images.Check(ctx, c.ContentStore(), img.Target(), platforms.Default()); err != nil || !ok {
		t.Fatalf("content collected after GC: ok=%v missing=%v err=%v", ok, missing, err)
	}
	if unpacked, err := img.IsUnpacked(ctx, defaultSnapshotter); err != nil || !unpacked {
		t.Fatalf("not unpacked in %s after GC: %v %v", defaultSnapshotter, unpacked, err)
	}

	// Mount the unpacked snapshot and read a file from each layer.
	diffs, err := img.RootFS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	checkSnapshotFiles(t, ctx, c, diffs, map[string]string{
		"etc/forkfleet/guestd.json": `{"display":":0"}`,
	}, "usr/local/bin/guestd")

	// Same layout again: skipped without touching containerd's content.
	res, err = imageimport.Import(ctx, c, opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || !strings.HasPrefix(res[0].Action, "skipped") {
		t.Fatalf("second import not skipped: %+v", res)
	}
	t.Logf("second import: %s", res[0])
}
