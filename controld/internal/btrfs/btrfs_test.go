//go:build linux

package btrfs

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// scratch mounts a fresh btrfs with quotas enabled on a loop file (root and
// btrfs-progs, which deploy/host-setup.sh installs, are needed).
func scratch(t *testing.T) string {
	t.Helper()
	if os.Getenv("FORKFLEET_INTEGRATION") != "1" {
		t.Skip("set FORKFLEET_INTEGRATION=1 to run against a real btrfs (root)")
	}
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "img"), filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o755)
	for _, c := range [][]string{
		{"truncate", "-s", "512M", img},
		{"mkfs.btrfs", "-q", "-f", "-m", "single", img},
		{"mount", "-o", "loop,nodiscard", img, mnt},
		{"btrfs", "quota", "enable", mnt},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", c, err, out)
		}
		if c[0] == "mount" {
			t.Cleanup(func() { exec.Command("umount", mnt).Run() })
		}
	}
	return mnt
}

func TestSubvolumeLimit(t *testing.T) {
	mnt := scratch(t)
	if ok, err := IsBtrfs(mnt); !ok || err != nil {
		t.Fatalf("IsBtrfs = %v %v", ok, err)
	}
	if ok, err := QuotaEnabled(mnt); !ok || err != nil {
		t.Fatalf("QuotaEnabled = %v %v", ok, err)
	}
	if ok, _ := IsBtrfs(os.TempDir()); ok {
		t.Skip("the temp dir is on btrfs too: cannot tell the difference")
	}
	start := time.Now()
	if err := CreateSubvolume(mnt, "sb-1"); err != nil {
		t.Fatal(err)
	}
	sv := filepath.Join(mnt, "sb-1")
	if err := SetLimit(sv, 32<<20); err != nil {
		t.Fatal(err)
	}
	t.Logf("subvolume and limit in %v", time.Since(start))
	if !IsSubvolume(sv) || IsSubvolume(mnt+"/nope") {
		t.Fatal("IsSubvolume")
	}
	if err := CreateSubvolume(mnt, "../x"); err == nil {
		t.Fatal("a name with a slash was accepted")
	}
	// Root writes past the limit and the kernel says no.
	f, err := os.Create(filepath.Join(sv, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	var n int64
	for ; n < 64<<20; n += 1 << 20 {
		if _, err = f.Write(buf); err != nil {
			break
		}
		if n%(8<<20) == 0 {
			f.Sync()
		}
	}
	f.Close()
	if !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("wrote %d bytes into a 32 MiB subvolume: %v", n, err)
	}
	// Before the next commit the writes show as reservations...
	u, err := SubvolumeUsage(sv)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("at EDQUOT before a commit: %+v", u)
	if u.Limit != 32<<20 || u.Used() < 30<<20 || u.Used() > 33<<20 {
		t.Fatalf("usage %+v after filling", u)
	}
	// ... after it as referenced bytes.
	unix.Sync()
	if u, err = SubvolumeUsage(sv); err != nil {
		t.Fatal(err)
	}
	t.Logf("at EDQUOT after a commit: %+v", u)
	if u.Limit != 32<<20 || u.Used() < 30<<20 || u.Used() > 33<<20 {
		t.Fatalf("usage %+v after filling", u)
	}
	if err := DeleteSubvolume(mnt, "sb-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sv); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("deleted subvolume still there: %v", err)
	}
	if err := DeleteSubvolume(mnt, "sb-1"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("deleting it again: %v", err)
	}
}
