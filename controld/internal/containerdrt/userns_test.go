//go:build linux

package containerdrt

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	criucore "github.com/checkpoint-restore/go-criu/v7/crit/images/criu-core"
	criuinventory "github.com/checkpoint-restore/go-criu/v7/crit/images/inventory"
	criunetdev "github.com/checkpoint-restore/go-criu/v7/crit/images/netdev"
	criupstree "github.com/checkpoint-restore/go-criu/v7/crit/images/pstree"
	criuuserns "github.com/checkpoint-restore/go-criu/v7/crit/images/userns"
	"github.com/checkpoint-restore/go-criu/v7/magic"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/forkfleet/forkfleet/api/errdefs"
	"github.com/forkfleet/forkfleet/controld/internal/userns"
)

func TestWithUserNamespace(t *testing.T) {
	rng := &userns.Range{UID: 1 << 30, GID: 1<<30 + userns.Size}
	s := &oci.Spec{Linux: &specs.Linux{
		Namespaces:  []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.UserNamespace, Path: "/proc/1/ns/user"}},
		UIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: 0, Size: 1 << 31}},
	}}
	if err := withUserNamespace(rng)(context.Background(), nil, nil, s); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(s.Linux.Namespaces, []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.UserNamespace}}) {
		t.Errorf("namespaces %+v: a user namespace of its own, none joined", s.Linux.Namespaces)
	}
	got, err := rangeOfSpec(s)
	if err != nil || *got != *rng {
		t.Errorf("range of the spec %+v, %v, want %+v", got, err, rng)
	}
	if err := withUserNamespace(nil)(context.Background(), nil, nil, s); err != nil {
		t.Fatal(err)
	}
	if len(s.Linux.Namespaces) != 1 || s.Linux.UIDMappings != nil || s.Linux.GIDMappings != nil {
		t.Errorf("without a range: %+v", s.Linux)
	}
	if got, err := rangeOfSpec(s); got != nil || err != nil {
		t.Errorf("range of a spec without one: %+v, %v", got, err)
	}
	s.Linux.UIDMappings = []specs.LinuxIDMapping{{ContainerID: 0, HostID: 0, Size: 1 << 31}}
	if _, err := rangeOfSpec(s); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("a mapping that is not a sandbox's range: %v", err)
	}
}

// A namespaced file capability names its root's host uid: copied into a
// committed layer, the sandbox's own.
func TestLayerCopierXattrValue(t *testing.T) {
	rng := &userns.Range{UID: 1 << 30, GID: 1 << 30}
	v3 := make([]byte, 24)
	binary.LittleEndian.PutUint32(v3, 0x03000000)
	binary.LittleEndian.PutUint32(v3[4:], 1<<13) // cap_net_raw permitted
	binary.LittleEndian.PutUint32(v3[20:], 1<<30)
	lc := &layerCopier{owner: rng}
	if got := binary.LittleEndian.Uint32(lc.xattrValue("security.capability", v3)[20:]); got != 0 {
		t.Errorf("root %d, want the sandbox's 0", got)
	}
	if binary.LittleEndian.Uint32(v3[20:]) != 1<<30 {
		t.Error("the source's value was changed in place")
	}
	v2 := append([]byte(nil), v3[:20]...)
	binary.LittleEndian.PutUint32(v2, 0x02000000)
	for _, c := range []struct {
		name string
		val  []byte
		lc   *layerCopier
	}{{"security.capability", v2, lc}, {"trusted.overlay.opaque", []byte("y"), lc}, {"security.capability", v3, &layerCopier{}}} {
		if got := c.lc.xattrValue(c.name, c.val); !slices.Equal(got, c.val) {
			t.Errorf("%s %x: changed to %x", c.name, c.val, got)
		}
	}
}

// The layer copy of a user-namespaced sandbox stores the sandbox's own ids.
func TestLayerCopyOwners(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give files host owners")
	}
	rng := &userns.Range{UID: 1 << 30, GID: 1<<30 + userns.Size}
	src, dst := t.TempDir(), t.TempDir()
	for _, f := range []struct {
		path     string
		uid, gid uint32
	}{{"root-file", rng.UID, rng.GID}, {"agent-file", rng.HostUID(1000), rng.HostGID(1000)}, {"foreign", 0, 0}} {
		p := filepath.Join(src, f.path)
		if err := os.WriteFile(p, []byte(f.path), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(p, int(f.uid), int(f.gid)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("root-file", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	os.Lchown(filepath.Join(src, "link"), int(rng.HostUID(1000)), int(rng.HostGID(1000)))
	os.Lchown(src, int(rng.UID), int(rng.GID))
	lc := newLayerCopier(src, dst)
	lc.owner = rng
	if err := lc.First(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := lc.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string][2]uint32{
		".": {0, 0}, "root-file": {0, 0}, "agent-file": {1000, 1000}, "link": {1000, 1000},
		"foreign": {userns.Nobody, userns.Nobody}, // no process of the sandbox can own it
	} {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(dst, path), &st); err != nil {
			t.Fatal(err)
		}
		if st.Uid != want[0] || st.Gid != want[1] {
			t.Errorf("%s: owner %d:%d, want %d:%d", path, st.Uid, st.Gid, want[0], want[1])
		}
	}
}

// writeImages makes a CRIU image directory with what forkImages reads: the
// root task (pid 1) in user namespace taskUserns, CRIU's own in 1.
func writeImages(t *testing.T, dir string, taskUserns uint32, extNetns bool) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	m := magic.LoadMagic().ByName
	write := func(name, kind string, msg proto.Message) {
		if err := writeSingleEntry(filepath.Join(dir, name), m[kind], msg); err != nil {
			t.Fatal(err)
		}
	}
	ids := func(user uint32) *criucore.TaskKobjIdsEntry {
		return &criucore.TaskKobjIdsEntry{VmId: proto.Uint32(1), FilesId: proto.Uint32(1), FsId: proto.Uint32(1), SighandId: proto.Uint32(1), UserNsId: proto.Uint32(user)}
	}
	write("inventory.img", "INVENTORY", &criuinventory.InventoryEntry{ImgVersion: proto.Uint32(2), RootIds: ids(1)})
	write("pstree.img", "PSTREE", &criupstree.PstreeEntry{Pid: proto.Uint32(1), Ppid: proto.Uint32(0), Pgid: proto.Uint32(1), Sid: proto.Uint32(1)})
	write("ids-1.img", "IDS", ids(taskUserns))
	ns := &criunetdev.NetnsEntry{}
	if extNetns {
		ns.ExtKey = proto.String("extRootNetNS")
	}
	write("netns-12.img", "NETNS", ns)
	if taskUserns != 1 {
		ext := []*criuuserns.UidGidExtent{{First: proto.Uint32(0), LowerFirst: proto.Uint32(7 << 20), Count: proto.Uint32(userns.Size)}}
		write("userns-13.img", "USERNS", &criuuserns.UsernsEntry{UidMap: ext, GidMap: ext})
	}
	if err := os.WriteFile(filepath.Join(dir, "pages-1.img"), []byte("pages"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := shareImages(dir); err != nil {
		t.Fatal(err)
	}
}

func TestForkImages(t *testing.T) {
	// controld's unit runs it with umask 0077: modes must not depend on it.
	defer unix.Umask(unix.Umask(0o077))
	ck := t.TempDir()
	writeImages(t, filepath.Join(ck, criuImageDir), 9, false)
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(ck, criuImageDir, "pages-1.img"), &st); err != nil || st.Mode&0o777 != 0o644 {
		t.Fatalf("image mode %o (%v), want 0644: readable by the fork's root", st.Mode&0o777, err)
	}
	if err := unix.Stat(filepath.Join(ck, criuImageDir), &st); err != nil || st.Mode&0o777 != 0o711 {
		t.Fatalf("image directory mode %o (%v), want 0711", st.Mode&0o777, err)
	}

	// Without a range the checkpoint's own images, once they are a
	// sandbox's of a host without user namespaces: these are not.
	if _, err := forkImages(ck, "f0", nil); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("a user-namespaced dump restored without a user namespace: %v", err)
	}

	rng := &userns.Range{UID: 1 << 30, GID: 1<<30 + userns.Size}
	dir, err := forkImages(ck, "f1", rng)
	if err != nil {
		t.Fatal(err)
	}
	if dir != forkImagesDir(ck, "f1") {
		t.Fatalf("fork images in %s", dir)
	}
	for name, want := range map[string]uint32{".": 0o711, "userns-13.img": 0o644} {
		if err := unix.Stat(filepath.Join(dir, name), &st); err != nil || st.Mode&0o777 != want {
			t.Errorf("fork images: %s mode %o (%v), want %o", name, st.Mode&0o777, err, want)
		}
	}
	var a, b unix.Stat_t
	unix.Stat(filepath.Join(ck, criuImageDir, "pages-1.img"), &a)
	unix.Stat(filepath.Join(dir, "pages-1.img"), &b)
	if a.Ino != b.Ino {
		t.Error("pages are copied, not linked")
	}
	var e criuuserns.UsernsEntry
	if err := readSingleEntry(filepath.Join(dir, "userns-13.img"), magic.LoadMagic().ByName["USERNS"], &e); err != nil {
		t.Fatal(err)
	}
	if len(e.UidMap) != 1 || e.UidMap[0].GetFirst() != 0 || e.UidMap[0].GetLowerFirst() != rng.UID || e.UidMap[0].GetCount() != userns.Size ||
		len(e.GidMap) != 1 || e.GidMap[0].GetLowerFirst() != rng.GID {
		t.Errorf("fork's user namespace %v, want 0 -> %+v", &e, rng)
	}
	if err := readSingleEntry(filepath.Join(ck, criuImageDir, "userns-13.img"), magic.LoadMagic().ByName["USERNS"], &e); err != nil || e.UidMap[0].GetLowerFirst() != 7<<20 {
		t.Errorf("the checkpoint's own userns image changed: %v, %v", &e, err)
	}

	// Dumps this host cannot restore in a sandbox's user namespace.
	for name, mk := range map[string]func(string){
		"host's user namespace": func(d string) { writeImages(t, d, 1, false) },
		"joined network":        func(d string) { writeImages(t, d, 9, true) },
		"no images":             func(d string) {},
	} {
		ck := t.TempDir()
		mk(filepath.Join(ck, criuImageDir))
		if _, err := forkImages(ck, "f", rng); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("%s: %v, want FailedPrecondition", name, err)
		}
		if _, err := os.Stat(forkImagesDir(ck, "f")); !os.IsNotExist(err) {
			t.Errorf("%s: fork images left behind (%v)", name, err)
		}
	}
	// A host without user namespaces restores a dump in the host's.
	ck2 := t.TempDir()
	writeImages(t, filepath.Join(ck2, criuImageDir), 1, false)
	if dir, err := forkImages(ck2, "f", nil); err != nil || dir != filepath.Join(ck2, criuImageDir) {
		t.Errorf("a host-namespace dump on a host without user namespaces: %s, %v", dir, err)
	}
}
