//go:build linux

package containerdrt

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"testing"

	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/network"
	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

func hasMount(s *oci.Spec, dest string) bool {
	return slices.ContainsFunc(s.Mounts, func(m specs.Mount) bool { return m.Destination == dest })
}

// A new sandbox keeps /run on its writable layer, says so in its spec, and
// a fork built from that spec (withSandbox again) does not get a tmpfs back;
// a spec without the annotation (an older checkpoint's) keeps its tmpfs.
func TestRunLayout(t *testing.T) {
	r := testRuntimeConfig(t)
	ctx := context.Background()
	spec := runtime.BootSpec{ID: "sb-1"}
	s := &oci.Spec{Mounts: []specs.Mount{
		{Destination: "/dev", Type: "tmpfs"},
		{Destination: "/run", Type: "tmpfs", Options: []string{"nosuid", "size=65536k"}},
	}}
	for _, o := range []oci.SpecOpts{withRunOnRootfs, r.withSandbox(spec, network.Sandbox{})} {
		if err := o(ctx, nil, nil, s); err != nil {
			t.Fatal(err)
		}
	}
	if hasMount(s, "/run") || s.Annotations[runLayoutAnnotation] != runLayoutRootfs {
		t.Fatalf("new sandbox: mounts %+v annotations %v", s.Mounts, s.Annotations)
	}
	if !hasMount(s, "/dev") {
		t.Fatal("/dev dropped")
	}
	if err := r.withSandbox(runtime.BootSpec{ID: "fork-1"}, network.Sandbox{})(ctx, nil, nil, s); err != nil {
		t.Fatal(err)
	}
	if hasMount(s, "/run") {
		t.Fatalf("fork of a rootfs-/run spec got a /run mount: %+v", s.Mounts)
	}

	old := &oci.Spec{Mounts: []specs.Mount{{Destination: "/run", Type: "tmpfs", Options: []string{"size=65536k"}}}}
	if err := r.withSandbox(runtime.BootSpec{ID: "fork-2"}, network.Sandbox{})(ctx, nil, nil, old); err != nil {
		t.Fatal(err)
	}
	if !hasMount(old, "/run") || old.Annotations[runLayoutAnnotation] != "" {
		t.Fatalf("older spec: mounts %+v annotations %v", old.Mounts, old.Annotations)
	}
}

// Every limit of the boot spec lands in the OCI spec, and a fork's spec
// built from its source's gets the fork's own limits, not the source's.
func TestSpecLimits(t *testing.T) {
	r := testRuntimeConfig(t)
	ctx := context.Background()
	spec := runtime.BootSpec{ID: "sb-1", MemoryBytes: 256 << 20, CPUWeight: 100, CPUMillis: 1500, PidsMax: 512}
	s := &oci.Spec{}
	if err := r.withSandbox(spec, network.Sandbox{})(ctx, nil, nil, s); err != nil {
		t.Fatal(err)
	}
	res := s.Linux.Resources
	if m := res.Memory; m == nil || *m.Limit != 256<<20 || *m.Swap != 256<<20 {
		t.Fatalf("memory %+v: want limit = memory+swap = 256 MiB", m)
	}
	if c := res.CPU; c == nil || *c.Shares != 1024 || *c.Quota != 150_000 || *c.Period != cpuPeriod {
		t.Fatalf("cpu %+v", c)
	}
	if p := res.Pids; p == nil || *p.Limit != 512 {
		t.Fatalf("pids %+v", p)
	}
	fork := runtime.BootSpec{ID: "fork-1", MemoryBytes: 128 << 20, CPUWeight: 1, PidsMax: 64}
	if err := r.withSandbox(fork, network.Sandbox{})(ctx, nil, nil, s); err != nil {
		t.Fatal(err)
	}
	res = s.Linux.Resources
	if *res.Memory.Limit != 128<<20 || *res.CPU.Shares != 10 || res.CPU.Quota != nil || *res.Pids.Limit != 64 {
		t.Fatalf("fork kept the source's limits: memory %+v cpu %+v pids %+v", res.Memory, res.CPU, res.Pids)
	}
	for w, want := range map[uint32]uint64{1: 10, 100: 1024, 10000: 102400} {
		if got := cpuShares(w); got != want {
			t.Errorf("cpuShares(%d) = %d, want %d", w, got, want)
		}
	}
	// A fork starting boosted gets the startup weight's shares, also
	// without a weight of its own.
	boosted := runtime.BootSpec{ID: "fork-2", StartupCPUWeight: 800}
	if err := r.withSandbox(boosted, network.Sandbox{})(ctx, nil, nil, s); err != nil {
		t.Fatal(err)
	}
	if c := s.Linux.Resources.CPU; c == nil || *c.Shares != 8192 {
		t.Fatalf("startup weight 800: cpu %+v, want 8192 shares", c)
	}
	if err := validateBootSpec(runtime.BootSpec{ID: "sb-2", StartupCPUWeight: maxCPUWeight + 1}); err == nil {
		t.Fatal("startup weight above the range accepted")
	}
}

// SetCPUWeight writes the sandbox's own cgroup file: cpu.shares on cgroup
// v1, cpu.weight (runc's conversion of the shares) on v2.
func TestSetCPUWeight(t *testing.T) {
	ctx := context.Background()
	for _, v2 := range []bool{false, true} {
		root := t.TempDir()
		r := &Runtime{cfg: Config{CgroupRoot: root, CgroupParent: "/forkfleet"}, cgroupV2: v2}
		file := filepath.Join(root, "cpu", "forkfleet", "sb-1", "cpu.shares")
		if v2 {
			file = filepath.Join(root, "forkfleet", "sb-1", "cpu.weight")
		}
		if err := r.SetCPUWeight(ctx, "sb-1", 50); !errors.Is(err, errdefs.ErrNotFound) {
			t.Fatalf("v2=%v: no cgroup: %v, want not found", v2, err)
		}
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			t.Fatal(err)
		}
		for w, want := range map[uint32]string{50: "512", 0: "1024"} {
			if v2 {
				want = map[uint32]string{50: "20", 0: "39"}[w]
			}
			// A plain file stands for the cgroup's, which a write replaces.
			if err := os.WriteFile(file, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := r.SetCPUWeight(ctx, "sb-1", w); err != nil {
				t.Fatal(err)
			}
			if b, _ := os.ReadFile(file); string(b) != want {
				t.Errorf("v2=%v weight %d: wrote %q, want %q", v2, w, b, want)
			}
		}
		if err := r.SetCPUWeight(ctx, "sb-1", maxCPUWeight+1); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("weight above the range: %v", err)
		}
	}
}

// A sandbox's seccomp profile admits the host's native ABI only: the
// default profile's rules, none of its 32-bit architectures.
func TestSeccompNativeOnly(t *testing.T) {
	if nativeSeccompArch == "" {
		t.Skipf("no native seccomp architecture known for %s", goruntime.GOARCH)
	}
	ctx := context.Background()
	s := &oci.Spec{Linux: &specs.Linux{}, Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{}}}
	if err := seccomp.WithDefaultProfile()(ctx, nil, nil, s); err != nil {
		t.Fatal(err)
	}
	if len(s.Linux.Seccomp.Architectures) < 2 {
		t.Fatalf("containerd's default profile: architectures %v, want the native one and its compat ABIs", s.Linux.Seccomp.Architectures)
	}
	rules := slices.Clone(s.Linux.Seccomp.Syscalls)
	if err := withNativeSyscallsOnly(ctx, nil, nil, s); err != nil {
		t.Fatal(err)
	}
	if got := s.Linux.Seccomp.Architectures; !slices.Equal(got, []specs.Arch{nativeSeccompArch}) {
		t.Fatalf("architectures %v, want [%s]", got, nativeSeccompArch)
	}
	if len(s.Linux.Seccomp.Syscalls) != len(rules) || s.Linux.Seccomp.DefaultAction != specs.ActErrno {
		t.Fatalf("rules changed: %d of %d, default %s", len(s.Linux.Seccomp.Syscalls), len(rules), s.Linux.Seccomp.DefaultAction)
	}
	none := &oci.Spec{Linux: &specs.Linux{}}
	if err := withNativeSyscallsOnly(ctx, nil, nil, none); err != nil || none.Linux.Seccomp != nil {
		t.Fatalf("a spec without seccomp: %v, %+v", err, none.Linux.Seccomp)
	}
}
