package netnsfile

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func TestNewRunRemove(t *testing.T) {
	if os.Getenv("FORKFLEET_INTEGRATION") != "1" {
		t.Skip("set FORKFLEET_INTEGRATION=1 to run root tests")
	}
	if os.Geteuid() != 0 {
		t.Fatal("FORKFLEET_INTEGRATION=1 needs root (a network namespace of its own)")
	}
	path := t.TempDir() + "/ns"
	if err := New(path); err != nil {
		t.Fatal(err)
	}
	if err := New(path); err == nil {
		t.Fatal("New over an existing path succeeded")
	}
	own := nsInode(t, "/proc/thread-self/ns/net")
	var inside uint64
	if err := Run(path, func() error {
		inside = nsInode(t, "/proc/thread-self/ns/net")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if inside != nsInode(t, path) || inside == own {
		t.Fatalf("fn ran in namespace %d; bound %d, the test's %d", inside, nsInode(t, path), own)
	}
	if err := Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Fatalf("after Remove: %v", err)
	}
	if err := Remove(path); err != nil {
		t.Fatalf("Remove of a missing path: %v", err)
	}
	if err := Run(path, func() error { return nil }); err == nil {
		t.Fatal("Run in a removed namespace succeeded")
	}
}

func nsInode(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}
