package testenv

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
)

// shimExitWait bounds how long a shim daemon may take to exit once
// containerd sent it Shutdown.
const shimExitWait = 15 * time.Second

// NoLeakedShims checks, when t ends (after the cleanups registered before
// it), that no containerd shim daemon of namespace ns outlived its
// sandboxes: there are at most as many daemons serving ns as tasks in it
// (none when no task is left). Shim daemons may serve several tasks (forks
// share them, containerdrt shimgroup.go) and a daemon that never got a
// connection is never told to exit, so this is the check that finds one.
// Register it before the runtime whose Close removes the test's sandboxes.
func NoLeakedShims(t testing.TB, ns string) {
	t.Helper()
	t.Cleanup(func() {
		t.Helper()
		if err := waitShims(ns, shimExitWait); err != nil {
			t.Error(err)
		}
	})
}

// waitShims waits until ns's shim daemons are no more than its tasks.
func waitShims(ns string, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(context.Background(), ns), wait+10*time.Second)
	defer cancel()
	c, err := client.New(Address())
	if err != nil {
		return fmt.Errorf("shim leak check: %w", err)
	}
	defer c.Close()
	deadline := time.Now().Add(wait)
	for {
		shims, err := ShimDaemons(ns)
		if err != nil {
			return err
		}
		tasks, err := c.TaskService().List(ctx, nil)
		if err != nil {
			return fmt.Errorf("shim leak check: list tasks: %w", err)
		}
		if len(shims) <= len(tasks.Tasks) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("shim daemons %v of namespace %s outlived its sandboxes (%d tasks left)", shims, ns, len(tasks.Tasks))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ShimDaemons are the pids of the containerd shim processes serving
// namespace ns (daemons; a shim `start` in progress shows too, for the
// milliseconds it runs).
func ShimDaemons(ns string) ([]int, error) {
	procs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		return nil, err
	}
	want := []byte("\x00-namespace\x00" + ns + "\x00")
	var pids []int
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(b, want) {
			continue
		}
		argv0, _, _ := bytes.Cut(b, []byte{0})
		if !bytes.HasPrefix([]byte(filepath.Base(string(argv0))), []byte("containerd-shim")) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p))); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}
