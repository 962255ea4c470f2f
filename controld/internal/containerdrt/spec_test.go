//go:build linux

package containerdrt

import (
	"context"
	"slices"
	"testing"

	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

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
}
