//go:build linux

package containerdrt

import (
	"context"
	"slices"
	"testing"

	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/forkfleet/forkfleet/controld/internal/fleet"
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
	spec := fleet.BootSpec{ID: "sb-1"}
	s := &oci.Spec{Mounts: []specs.Mount{
		{Destination: "/dev", Type: "tmpfs"},
		{Destination: "/run", Type: "tmpfs", Options: []string{"nosuid", "size=65536k"}},
	}}
	for _, o := range []oci.SpecOpts{withRunOnRootfs, r.withSandbox(spec)} {
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
	if err := r.withSandbox(fleet.BootSpec{ID: "fork-1"})(ctx, nil, nil, s); err != nil {
		t.Fatal(err)
	}
	if hasMount(s, "/run") {
		t.Fatalf("fork of a rootfs-/run spec got a /run mount: %+v", s.Mounts)
	}

	old := &oci.Spec{Mounts: []specs.Mount{{Destination: "/run", Type: "tmpfs", Options: []string{"size=65536k"}}}}
	if err := r.withSandbox(fleet.BootSpec{ID: "fork-2"})(ctx, nil, nil, old); err != nil {
		t.Fatal(err)
	}
	if !hasMount(old, "/run") || old.Annotations[runLayoutAnnotation] != "" {
		t.Fatalf("older spec: mounts %+v annotations %v", old.Mounts, old.Annotations)
	}
}
