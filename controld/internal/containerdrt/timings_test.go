//go:build linux

package containerdrt

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/forkfleet/forkfleet/controld/internal/runtime"
)

// TestIntegrationTimings measures each step several times on the desktop
// image and logs medians (FORKFLEET_TIMINGS=1; FORKFLEET_TIMINGS_REPS,
// default 5). It asserts nothing about speed: benchd does that.
func TestIntegrationTimings(t *testing.T) {
	integration(t)
	if os.Getenv("FORKFLEET_TIMINGS") != "1" {
		t.Skip("set FORKFLEET_TIMINGS=1 to measure step timings")
	}
	reps := 5
	if n, err := strconv.Atoi(os.Getenv("FORKFLEET_TIMINGS_REPS")); err == nil && n > 0 {
		reps = n
	}
	r, ctx, image := desktopRuntime(t)
	spec := func(prefix string) runtime.BootSpec {
		return runtime.BootSpec{ID: uniqueID(prefix), Image: image, MemoryBytes: 1 << 30,
			ACIToken: "a-" + randomHex(8), AdminToken: "b-" + randomHex(8)}
	}
	samples := map[string][]time.Duration{}
	add := func(k string, d time.Duration) { samples[k] = append(samples[k], d) }
	usable := func(inst runtime.Instance) error {
		if _, err := waitDial(inst.ACISocket, 10*time.Second); err != nil {
			return err
		}
		return waitX(inst, 10*time.Second)
	}

	// Warm the image unpack check.
	warm := bootT(t, r, spec("warm"))
	deleteQuiet(r, warm.ID)

	var srcRef runtime.CheckpointRef
	for i := range reps {
		// Cold boot: request to guestd socket and Xvfb answering.
		s := spec("tboot")
		start := time.Now()
		inst, err := r.Boot(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		add("boot: Boot returned", time.Since(start))
		if err := usable(inst); err != nil {
			t.Fatal(err)
		}
		add("boot: usable (guestd + Xvfb)", time.Since(start))
		deleteQuiet(r, s.ID)

		// Precreated boot: only Start remains.
		s = spec("tpre")
		if err := r.Precreate(ctx, s); err != nil {
			t.Fatal(err)
		}
		start = time.Now()
		inst, err = r.Boot(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		if err := usable(inst); err != nil {
			t.Fatal(err)
		}
		add("boot precreated: usable", time.Since(start))

		// Live checkpoint of the settled desktop.
		time.Sleep(500 * time.Millisecond)
		res, err := r.Checkpoint(ctx, s.ID, runtime.CheckpointSpec{
			Dir: fmt.Sprintf("%s/t%d-%s", r.cfg.CheckpointRoot, i, randomHex(4)), Tier: runtime.TierMemory})
		if err != nil {
			t.Fatal(err)
		}
		add("checkpoint: frozen", res.Frozen)
		add("checkpoint: dump", res.Dump)
		add("checkpoint: layer copy", res.Layer)
		add("checkpoint: total", res.Total)
		if i < reps-1 {
			defer r.DeleteCheckpoint(ctx, res.Ref)
		} else {
			srcRef = res.Ref
			defer r.DeleteCheckpoint(ctx, res.Ref)
		}

		// One fork, cold and precreated.
		f := spec("tfork")
		start = time.Now()
		fi, err := r.Restore(ctx, f, res.Ref)
		if err != nil {
			t.Fatal(err)
		}
		if err := usable(fi); err != nil {
			t.Fatal(err)
		}
		add("fork: usable", time.Since(start))
		deleteQuiet(r, f.ID)
		f = spec("tfpre")
		if err := r.PrecreateRestore(ctx, f, res.Ref); err != nil {
			t.Fatal(err)
		}
		start = time.Now()
		fi, err = r.Restore(ctx, f, res.Ref)
		if err != nil {
			t.Fatal(err)
		}
		if err := usable(fi); err != nil {
			t.Fatal(err)
		}
		add("fork precreated: usable", time.Since(start))
		deleteQuiet(r, f.ID)
		deleteQuiet(r, s.ID)

		// Raw freezer claim of a frozen fork (restore ahead, then freeze).
		f = spec("tfrozen")
		fi, err = r.Restore(ctx, f, res.Ref)
		if err != nil {
			t.Fatal(err)
		}
		if err := usable(fi); err != nil {
			t.Fatal(err)
		}
		if err := r.Freeze(ctx, f.ID); err != nil {
			t.Fatal(err)
		}
		start = time.Now()
		if err := r.Thaw(ctx, f.ID); err != nil {
			t.Fatal(err)
		}
		if err := usable(fi); err != nil {
			t.Fatal(err)
		}
		add("frozen fork: thaw to usable", time.Since(start))
		deleteQuiet(r, f.ID)
	}

	for _, n := range []int{4, 8} {
		var wg sync.WaitGroup
		ids := make([]string, n)
		errs := make([]error, n)
		start := time.Now()
		for j := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				f := spec(fmt.Sprintf("tfan%d", j))
				ids[j] = f.ID
				fi, err := r.Restore(ctx, f, srcRef)
				if err == nil {
					err = usable(fi)
				}
				errs[j] = err
			}()
		}
		wg.Wait()
		add(fmt.Sprintf("fan-out N=%d wall", n), time.Since(start))
		for j, err := range errs {
			if err != nil {
				t.Errorf("fan-out N=%d fork %d: %v", n, j, err)
			}
			deleteQuiet(r, ids[j])
		}
	}

	keys := make([]string, 0, len(samples))
	for k := range samples {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := slices.Clone(samples[k])
		slices.Sort(v)
		t.Logf("%-32s median %8.1f ms  min %8.1f  max %8.1f  (n=%d)", k,
			ms(v[len(v)/2]), ms(v[0]), ms(v[len(v)-1]), len(v))
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
