//go:build linux

package containerdrt

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/core/images"
	cerrdefs "github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/api/registrytest"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
	"github.com/forkfleet/forkfleet/controld/internal/testenv"
)

func TestPlainHTTPAllowed(t *testing.T) {
	allowed := []string{"registry.lab:5000"}
	for host, want := range map[string]bool{
		"localhost":         true,
		"localhost:5000":    true,
		"127.0.0.1:5000":    true,
		"127.8.9.10":        true,
		"[::1]:5000":        true,
		"registry.lab:5000": true,
		"registry.lab":      false, // another port is another registry
		"10.0.0.1:5000":     false,
		"localhost.evil.io": false,
		"ghcr.io":           false,
	} {
		if got := plainHTTPAllowed(host, allowed); got != want {
			t.Errorf("plainHTTPAllowed(%q) = %v, want %v", host, got, want)
		}
	}
}

func TestRegistryErrPlainHTTP(t *testing.T) {
	err := registryErr("registry.lab:5000/ck:1", errors.New(`Head "https://registry.lab:5000/v2/ck/manifests/1": http: server gave HTTP response to HTTPS client`))
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "PLAIN_HTTP_REFUSED") && !strings.Contains(err.Error(), "plain HTTP") {
		t.Fatalf("got %v", err)
	}
	if r := errdefs.Reason(err); r != "PLAIN_HTTP_REFUSED" {
		t.Errorf("reason %q", r)
	}
}

func TestKernelCanRestore(t *testing.T) {
	for _, c := range []struct {
		source, here string
		ok           bool
	}{
		{"6.18.44-fc-v1045", "6.18.44-fc-v1045", true},
		{"6.18.2", "6.19.0", true},
		{"6.12.1", "7.0.0-rc1", true},
		{"6.19.0", "6.18.44", false},
		{"7.1", "6.18.44", false},
		{"", "6.1.0", true}, // nothing recorded
		{"bogus", "6.1.0", false},
	} {
		err := kernelCanRestore(c.source, c.here)
		if (err == nil) != c.ok {
			t.Errorf("kernelCanRestore(%q, %q) = %v, want ok=%v", c.source, c.here, err, c.ok)
		}
	}
}

func TestDockerConfigCreds(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.json")
	auth := base64.StdEncoding.EncodeToString([]byte("alice:s3cr:et"))
	if err := os.WriteFile(path, []byte(`{"auths": {
		"https://index.docker.io/v1/": {"auth": "`+auth+`"},
		"registry.lab:5000": {"username": "bob", "password": "pw"},
		"http://tok.lab/v2/": {"identitytoken": "refresh"},
		"bad.lab": {"auth": "!!"}
	}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	creds := registryCreds(path)
	for host, want := range map[string][2]string{
		"docker.io":         {"alice", "s3cr:et"},
		"registry.lab:5000": {"bob", "pw"},
		"tok.lab":           {"", "refresh"},
		"other.lab":         {"", ""},
	} {
		u, p, err := creds(host)
		if err != nil || u != want[0] || p != want[1] {
			t.Errorf("creds(%q) = %q %q %v, want %q %q", host, u, p, err, want[0], want[1])
		}
	}
	if _, _, err := creds("bad.lab"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("bad auth: %v", err)
	}
	// No file: anonymous.
	if u, p, err := registryCreds(filepath.Join(dir, "none.json"))("ghcr.io"); err != nil || u != "" || p != "" {
		t.Errorf("no file: %q %q %v", u, p, err)
	}
	// A helper name cannot be a path.
	if _, _, err := (&dockerConfig{CredsStore: "../../bin/sh"}).creds("x.lab"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("helper path: %v", err)
	}
}

// TestIntegrationRestorableCheck runs criu's cpuinfo check: this host's own
// CPU passes; a recorded CPU with every feature bit set, or a newer kernel
// series, is refused with FAILED_PRECONDITION naming why.
func TestIntegrationRestorableCheck(t *testing.T) {
	testenv.RealStack(t)
	ctx := context.Background()
	hi, err := thisHostInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	img := func(h hostInfo) *checkpointImage {
		return &checkpointImage{criu: []ocispec.Descriptor{{}}, exported: exportedMeta{Host: &h}}
	}
	if err := checkRestorable(ctx, "here", img(*hi)); err != nil {
		t.Fatalf("this host's own CPU and kernel: %v", err)
	}
	cpu := allCPUFeatures(t, hi.CPUInfo)
	err = checkRestorable(ctx, "alien", img(hostInfo{Kernel: hi.Kernel, CPUInfo: cpu}))
	if errdefs.Reason(err) != "CPU_INCOMPATIBLE" || !strings.Contains(err.Error(), "criu/arch/x86/cpu.c") {
		t.Fatalf("CPU with more features: %v, want CPU_INCOMPATIBLE", err)
	}
	t.Logf("alien CPU: %v", err)
	err = checkRestorable(ctx, "future", img(hostInfo{Kernel: "99.0.0", CPUInfo: hi.CPUInfo}))
	if errdefs.Reason(err) != "KERNEL_INCOMPATIBLE" {
		t.Fatalf("newer kernel: %v, want KERNEL_INCOMPATIBLE", err)
	}
	// A disk-tier image holds no processes: nothing to check.
	if err := checkRestorable(ctx, "disk", &checkpointImage{exported: exportedMeta{Host: &hostInfo{Kernel: "99.0.0"}}}); err != nil {
		t.Fatalf("disk tier: %v", err)
	}
}

// TestIntegrationPullRefusesAlienCPU pushes a memory checkpoint whose
// recorded CPU has features this one lacks to a real registry on loopback:
// the pull refuses it with CPU_INCOMPATIBLE having fetched the manifest and
// metadata only (the CRIU images never reach the content store), and keeps
// no lease behind. An honest one pulls whole, names its image and keeps no
// lease either; pulled again, it fetches nothing.
func TestIntegrationPullRefusesAlienCPU(t *testing.T) {
	r := securityRuntime(t)
	ctx := r.ctx(context.Background())
	reg, err := registrytest.Start(ctx, testenv.Tool(t, "docker-registry"), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	src := bootT(t, r, testSpec(uniqueID("cpu")))
	ck := checkpointT(t, r, src.ID, runtime.TierMemory, false)
	exported := "localhost/forkfleet/cpu-it-ck:" + randomHex(4)
	alien := reg.Addr + "/forkfleet/alien:" + randomHex(4)
	if _, err := r.ExportCheckpoint(ctx, ck.Ref, nil, exported); err != nil {
		t.Fatal(err)
	}
	craftCheckpointImage(t, r, exported, alien, nil, nil, func(m *exportedMeta) {
		m.Host.CPUInfo = allCPUFeatures(t, m.Host.CPUInfo)
	})
	if _, err := r.PushCheckpoint(ctx, alien); err != nil {
		t.Fatalf("push: %v", err)
	}
	honest := reg.Addr + "/forkfleet/honest:" + randomHex(4)
	if _, err := r.ExportCheckpoint(ctx, ck.Ref, nil, honest); err != nil {
		t.Fatal(err)
	}
	if _, err := r.PushCheckpoint(ctx, honest); err != nil {
		t.Fatalf("push: %v", err)
	}
	is, cs := r.client.ImageService(), r.client.ContentStore()
	img, err := is.Get(ctx, alien)
	if err != nil {
		t.Fatal(err)
	}
	man, err := readCheckpointImage(ctx, cs, alien, img.Target)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{exported, alien, honest} {
		if err := is.Delete(ctx, name, images.SynchronousDelete()); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.DeleteCheckpoint(ctx, ck.Ref); err != nil {
		t.Fatal(err)
	}
	leases := leaseCount(t, r)
	_, err = r.PullCheckpoint(ctx, alien, alien)
	if errdefs.Reason(err) != "CPU_INCOMPATIBLE" {
		t.Fatalf("pull of a checkpoint dumped on a CPU with more features: %v, want CPU_INCOMPATIBLE", err)
	}
	if _, err := cs.Info(ctx, man.criu[0].Digest); !cerrdefs.IsNotFound(err) {
		t.Errorf("the refused pull fetched the CRIU images: %v", err)
	}
	if n := leaseCount(t, r); n != leases {
		t.Errorf("%d leases after the refused pull, %d before", n, leases)
	}
	if _, err := is.Get(ctx, alien); !cerrdefs.IsNotFound(err) {
		t.Errorf("the refused pull left an image: %v", err)
	}

	n, err := r.PullCheckpoint(ctx, honest, honest)
	if err != nil || n == 0 {
		t.Fatalf("pull of an honest checkpoint: %d bytes, %v", n, err)
	}
	t.Cleanup(func() { is.Delete(context.WithoutCancel(ctx), honest) })
	if got, err := is.Get(ctx, honest); err != nil {
		t.Errorf("the pull named no image: %v", err)
	} else if _, err := readCheckpointImage(ctx, cs, honest, got.Target); err != nil {
		t.Errorf("the pulled image: %v", err)
	}
	if n := leaseCount(t, r); n != leases {
		t.Errorf("%d leases after the pull, %d before", n, leases)
	}
	if n, err := r.PullCheckpoint(ctx, honest, honest); err != nil || n != 0 {
		t.Errorf("second pull: %d bytes fetched, %v; want 0, nil", n, err)
	}
}

// The scheme each registry is reached with: plain HTTP for loopback and
// the configured hosts only; docker.io through its API host.
func TestRegistryHostsScheme(t *testing.T) {
	r := &Runtime{cfg: Config{Registry: RegistryConfig{PlainHTTP: []string{"registry.lab:5000"}, DockerConfig: filepath.Join(t.TempDir(), "none.json")}}}
	for host, want := range map[string]string{
		"127.0.0.1:5000":    "http://127.0.0.1:5000",
		"localhost:5000":    "http://localhost:5000",
		"registry.lab:5000": "http://registry.lab:5000",
		"registry.lab":      "https://registry.lab",
		"ghcr.io":           "https://ghcr.io",
		"docker.io":         "https://registry-1.docker.io",
	} {
		hs, err := r.registryHosts(host)
		if err != nil || len(hs) != 1 {
			t.Fatalf("registryHosts(%q): %v %v", host, hs, err)
		}
		if got := hs[0].Scheme + "://" + hs[0].Host; got != want || hs[0].Path != "/v2" || hs[0].Authorizer == nil {
			t.Errorf("registryHosts(%q) = %s%s, want %s/v2", host, got, hs[0].Path, want)
		}
	}
}

// A real registry speaking plain HTTP at an address that is not a loopback
// name or address (0.0.0.0, which Linux connects to this host) is refused
// by name, not downgraded; the same registry on 127.0.0.1 answers.
func TestRegistryPlainHTTPRefused(t *testing.T) {
	reg, err := registrytest.Start(context.Background(), testenv.Tool(t, "docker-registry"), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close) // Close is idempotent; the test stops it midway
	_, port, _ := strings.Cut(reg.Addr, ":")
	r := &Runtime{cfg: Config{Namespace: "forkfleet-test", Registry: RegistryConfig{DockerConfig: filepath.Join(t.TempDir(), "none.json")}}}
	ctx := context.Background()
	_, err = r.ResolveCheckpoint(ctx, "0.0.0.0:"+port+"/forkfleet/ck:1")
	if errdefs.Reason(err) != "PLAIN_HTTP_REFUSED" || !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("plain-HTTP registry at 0.0.0.0: %v, want PLAIN_HTTP_REFUSED", err)
	}
	if _, err := r.ResolveCheckpoint(ctx, reg.Addr+"/forkfleet/ck:1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown tag on the loopback registry: %v, want NOT_FOUND", err)
	}
	// A reference pinned by digest resolves without asking (the
	// registry is stopped).
	reg.Close()
	const dg = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	if got, err := r.ResolveCheckpoint(ctx, reg.Addr+"/forkfleet/ck@"+dg); err != nil || got != dg {
		t.Fatalf("pinned reference resolved to %q, %v", got, err)
	}
}

// allCPUFeatures returns a CRIU cpuinfo image (magic, u32 size, one
// cpuinfo_entry) whose x86 entry claims every feature: each capability word
// (x86_cpuinfo_entry field 6, varint) becomes 0xffffffff, and the lengths
// around it are encoded again. Which words criu's check compares depends on
// the CPU (an AMD host has no word of 0 among them), so every word is set.
func allCPUFeatures(t *testing.T, img []byte) []byte {
	t.Helper()
	bad := func(why string) { t.Fatalf("cpuinfo image: %s: % x", why, img) }
	if len(img) < 12 || int(binary.LittleEndian.Uint32(img[8:12])) != len(img)-12 || img[12] != 0x0a {
		bad("not one cpuinfo_entry")
	}
	n, k := protowire.ConsumeVarint(img[13:])
	if k < 0 || 13+k+int(n) > len(img) {
		bad("x86 entry length")
	}
	x86, rest := img[13+k:13+k+int(n)], img[13+k+int(n):]
	var out []byte
	words := 0
	for len(x86) > 0 {
		num, typ, tl := protowire.ConsumeTag(x86)
		if tl < 0 {
			bad("tag")
		}
		vl := protowire.ConsumeFieldValue(num, typ, x86[tl:])
		if vl < 0 {
			bad("field")
		}
		if num == 6 && typ == protowire.VarintType {
			out = protowire.AppendTag(out, num, typ)
			out = protowire.AppendVarint(out, 0xffffffff)
			words++
		} else {
			out = append(out, x86[:tl+vl]...)
		}
		x86 = x86[tl+vl:]
	}
	if words == 0 {
		bad("no capability words")
	}
	entry := protowire.AppendVarint([]byte{0x0a}, uint64(len(out)))
	entry = append(append(entry, out...), rest...)
	res := append(append([]byte(nil), img[:8]...), binary.LittleEndian.AppendUint32(nil, uint32(len(entry)))...)
	return append(res, entry...)
}
