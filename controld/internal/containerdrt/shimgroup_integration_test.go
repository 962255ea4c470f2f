//go:build linux

package containerdrt

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// parentOf is pid's parent (the shim that reaps a container's init).
func parentOf(t *testing.T, pid uint32) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// comm may hold spaces: the fields after it start past the last ')'.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatal(err)
	}
	return ppid
}

// Replicas forked together share one shim daemon (shimgroup.go), and each
// stays its own container: deleting one leaves the others running and
// reported, an exit inside one is reported as that replica's, and the
// group's shim goes with its last container.
func TestIntegrationForksShareShim(t *testing.T) {
	integration(t)
	r := newTestRuntime(t, testNamespace)
	importTestImage(t, r)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	exits, err := r.Exits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	src := bootT(t, r, testSpec(uniqueID("src")))
	value := "mem-" + randomHex(8)
	if got := mustCall(t, src, "set "+value); got != "ok" {
		t.Fatal(got)
	}
	res := checkpointT(t, r, src.ID, runtime.TierMemory, false)

	const n = 3
	forks := make([]runtime.Instance, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range forks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			spec := testSpec(uniqueID(fmt.Sprintf("grp%d", i)))
			t.Cleanup(func() { deleteQuiet(r, spec.ID) })
			forks[i], errs[i] = r.Restore(ctx, spec, res.Ref)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("fork %d: %v", i, err)
		}
	}
	shim := parentOf(t, forks[0].PID)
	for _, f := range forks {
		waitSocket(t, f, 10*time.Second)
		if got := mustCall(t, f, "get"); got != value {
			t.Errorf("%s: memory value %q, want %q", f.ID, got, value)
		}
		if p := parentOf(t, f.PID); p != shim {
			t.Errorf("%s: init's parent %d, want the group's shim %d", f.ID, p, shim)
		}
	}
	if p := parentOf(t, src.PID); p == shim {
		t.Errorf("the booted source shares the forks' shim %d", shim)
	}

	// One deleted: the others run on, served by the same shim.
	if err := r.Delete(ctx, forks[0].ID); err != nil {
		t.Fatal(err)
	}
	for _, f := range forks[1:] {
		if got, _ := r.Get(ctx, f.ID); got.Status != runtime.StatusRunning {
			t.Errorf("%s after a sibling's delete: %v", f.ID, got.Status)
		}
		if got := mustCall(t, f, "get"); got != value {
			t.Errorf("%s after a sibling's delete: %q", f.ID, got)
		}
	}
	// An exit inside one is that replica's.
	if _, err := call(forks[1].ACISocket, "exit 3", 2*time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-exits:
		if e.ID != forks[1].ID || e.Status != 3 {
			t.Errorf("exit %+v, want %s status 3", e, forks[1].ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no exit reported")
	}
	if got, _ := r.Get(ctx, forks[2].ID); got.Status != runtime.StatusRunning {
		t.Errorf("%s after a sibling's exit: %v", forks[2].ID, got.Status)
	}
	// The last ones go, and the shim with them.
	for _, f := range forks[1:] {
		if err := r.Delete(ctx, f.ID); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", shim)); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the group's shim %d outlived its containers", shim)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestShimGroups(t *testing.T) {
	var a, b shimGroups
	now := time.Now()
	first := a.nextAt(now)
	for i := 1; i < shimGroupSize; i++ {
		if g := a.nextAt(now); g != first {
			t.Fatalf("fork %d in group %q, want %q", i, g, first)
		}
	}
	second := a.nextAt(now)
	if second == first {
		t.Fatalf("fork %d still in group %q", shimGroupSize, second)
	}
	if g := a.nextAt(now.Add(shimGroupWindow / 2)); g != second {
		t.Fatalf("a fork soon after in group %q, want %q", g, second)
	}
	if g := a.nextAt(now.Add(2 * shimGroupWindow)); g == second {
		t.Fatalf("a fork after a pause joined group %q", g)
	}
	if g := b.next(); g == first {
		t.Fatalf("another runtime's first group %q is this one's", g)
	}
}
