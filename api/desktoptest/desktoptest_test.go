//go:build linux

package desktoptest_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/forkfleet/forkfleet/api/desktoptest"
)

// TestXvfb starts two servers at once: each picks its own display, accepts
// connections on it, and is gone once stopped.
func TestXvfb(t *testing.T) {
	a := desktoptest.NewXvfb(t, desktoptest.XvfbOptions{})
	b := desktoptest.NewXvfb(t, desktoptest.XvfbOptions{Width: 640, Height: 480})
	if a.Num == b.Num {
		t.Fatalf("two servers on display %s", a.Name())
	}
	for _, x := range []*desktoptest.Xvfb{a, b} {
		if _, err := os.Stat(filepath.Join("/tmp/.X11-unix", "X"+x.Name()[1:])); err != nil {
			t.Errorf("display %s has no socket: %v", x.Name(), err)
		}
	}
	b.Stop()
	b.Stop() // idempotent
	if exited, _ := b.Exited(); !exited {
		t.Error("Xvfb runs on after Stop")
	}
	if _, err := os.Stat(filepath.Join("/tmp/.X11-unix", "X"+b.Name()[1:])); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("display %s keeps its socket after Stop: %v", b.Name(), err)
	}
}

func TestRepoRoot(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root := desktoptest.RepoRoot(wd)
	if root == "" {
		t.Fatalf("no monorepo above %s", wd)
	}
	if _, err := os.Stat(filepath.Join(root, "guestd", "cmd", "guestd")); err != nil {
		t.Errorf("the monorepo root %s holds no guestd: %v", root, err)
	}
	if got := desktoptest.RepoRoot(t.TempDir()); got != "" {
		t.Errorf("RepoRoot of a temporary directory: %q", got)
	}
}
