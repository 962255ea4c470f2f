package innetns

import (
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

func TestRunJoinsNamespace(t *testing.T) {
	if os.Getenv("FORKFLEET_INTEGRATION") != "1" {
		t.Skip("set FORKFLEET_INTEGRATION=1 to run root tests")
	}
	if os.Geteuid() != 0 {
		t.Fatal("FORKFLEET_INTEGRATION=1 needs root (a network namespace of its own)")
	}
	// A namespace of our own, pinned on a file, as controld pins a sandbox's.
	pin := t.TempDir() + "/ns"
	if err := os.WriteFile(pin, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		// This thread leaves the test's namespace for good; it dies with the goroutine.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- unix.Mount("/proc/thread-self/ns/net", pin, "", unix.MS_BIND, "")
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(pin, unix.MNT_DETACH) })

	own := nsInode(t, "/proc/thread-self/ns/net")
	var inside uint64
	if err := Run(pin, func() error {
		inside = nsInode(t, "/proc/thread-self/ns/net")
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if inside != nsInode(t, pin) || inside == own {
		t.Fatalf("fn ran in namespace %d; pinned %d, the test's %d", inside, nsInode(t, pin), own)
	}
	if err := Run(t.TempDir()+"/missing", func() error { return nil }); err == nil {
		t.Fatal("Run on a missing namespace succeeded")
	}
}

func nsInode(t *testing.T, path string) uint64 {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}
