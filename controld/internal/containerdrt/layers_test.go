//go:build linux

package containerdrt

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/containerd/containerd/v2/core/mount"
)

// The task's rootfs is the snapshot's overlay with only its upper and work
// directories moved to the sandbox's layer.
func TestWithLayer(t *testing.T) {
	ms := []mount.Mount{{Type: "overlay", Source: "overlay", Options: []string{
		"index=off", "workdir=/sn/7/work", "upperdir=/sn/7/fs", "lowerdir=/sn/3/fs:/sn/2/fs",
	}}}
	got, err := withLayer(ms, "/layers/ns/sb-1")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"index=off", "workdir=/layers/ns/sb-1/work", "upperdir=/layers/ns/sb-1/upper", "lowerdir=/sn/3/fs:/sn/2/fs"}
	if len(got) != 1 || !slices.Equal(got[0].Options, want) || got[0].Type != "overlay" {
		t.Fatalf("withLayer = %+v", got)
	}
	if ms[0].Options[1] != "workdir=/sn/7/work" {
		t.Fatal("withLayer changed the snapshot's mounts")
	}
	for _, bad := range [][]mount.Mount{
		{{Type: "bind", Source: "/sn/1/fs", Options: []string{"rbind", "rw"}}},
		{{Type: "overlay", Options: []string{"lowerdir=/a:/b"}}}, // read-only view
		{},
	} {
		if _, err := withLayer(bad, "/l"); err == nil {
			t.Errorf("withLayer(%+v) accepted", bad)
		}
	}
}

// Every sandbox's rootfs is mounted volatile, on its layer or on the
// snapshot's own upper directory, without changing the snapshot's mounts.
func TestRootfsMountsVolatile(t *testing.T) {
	opts := []string{"index=off", "workdir=/sn/7/work", "upperdir=/sn/7/fs", "lowerdir=/sn/3/fs:/sn/2/fs"}
	ms := []mount.Mount{{Type: "overlay", Source: "overlay", Options: slices.Clip(slices.Clone(opts))}}
	got, err := rootfsMounts(ms, "")
	if err != nil {
		t.Fatal(err)
	}
	if want := append(slices.Clone(opts), "volatile"); len(got) != 1 || !slices.Equal(got[0].Options, want) {
		t.Fatalf("rootfsMounts = %+v, want options %v", got, want)
	}
	got, err = rootfsMounts(ms, "/layers/ns/sb-1")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"index=off", "workdir=/layers/ns/sb-1/work", "upperdir=/layers/ns/sb-1/upper", "lowerdir=/sn/3/fs:/sn/2/fs", "volatile"}; !slices.Equal(got[0].Options, want) {
		t.Fatalf("rootfsMounts on a layer = %v, want %v", got[0].Options, want)
	}
	if !slices.Equal(ms[0].Options, opts) {
		t.Fatalf("rootfsMounts changed the snapshot's mounts: %v", ms[0].Options)
	}
	if _, err := rootfsMounts([]mount.Mount{{Type: "bind", Source: "/sn/1/fs"}}, ""); err == nil {
		t.Fatal("a bind rootfs was accepted")
	}
}

// A container label naming a layer outside this runtime's is refused: the
// checkpoint's copy reads what it names.
func TestLayerOfRefusesForeignPaths(t *testing.T) {
	r := &Runtime{cfg: Config{LayersDir: "/layers", Namespace: "ns"}}
	if dir, err := r.layerOf("sb-1", map[string]string{labelLayer: "/layers/ns/sb-1"}); err != nil || dir != "/layers/ns/sb-1" {
		t.Fatalf("own layer: %q %v", dir, err)
	}
	if dir, err := r.layerOf("sb-1", nil); err != nil || dir != "" {
		t.Fatalf("no layer: %q %v", dir, err)
	}
	for _, l := range []string{"/etc", "/layers/ns/sb-2", "/layers/ns/sb-1/../../x"} {
		if _, err := r.layerOf("sb-1", map[string]string{labelLayer: l}); err == nil {
			t.Errorf("layer %q accepted", l)
		}
	}
}

// copyData copies within a filesystem and across two (the layers' btrfs and
// containerd's root), where copy_file_range refuses: /dev/shm stands in for
// the other filesystem here.
func TestCopyDataAcrossFilesystems(t *testing.T) {
	data := make([]byte, 3<<20+17)
	for i := range data {
		data[i] = byte(i * 7)
	}
	shm, err := os.MkdirTemp("/dev/shm", "copydata-")
	if err != nil {
		t.Skipf("no /dev/shm: %v", err)
	}
	defer os.RemoveAll(shm)
	dst := t.TempDir()
	lc := newLayerCopier("", "")
	for _, srcDir := range []string{dst, shm} {
		src := filepath.Join(srcDir, "src")
		if err := os.WriteFile(src, data, 0o600); err != nil {
			t.Fatal(err)
		}
		in, err := os.Open(src)
		if err != nil {
			t.Fatal(err)
		}
		out, err := os.Create(filepath.Join(dst, "out"))
		if err != nil {
			t.Fatal(err)
		}
		err = lc.copyData(out, in)
		in.Close()
		out.Close()
		if err != nil {
			t.Fatalf("from %s: %v", srcDir, err)
		}
		got, _ := os.ReadFile(filepath.Join(dst, "out"))
		if !bytes.Equal(got, data) {
			t.Fatalf("from %s: copied %d bytes, not the %d written", srcDir, len(got), len(data))
		}
	}
}
