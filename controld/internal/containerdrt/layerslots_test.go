//go:build linux

package containerdrt

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
)

// fakeSnapshotter records prepared and removed keys; the other methods are
// not used by layer slots.
type fakeSnapshotter struct {
	snapshots.Snapshotter
	mu      sync.Mutex
	parents map[string]string // live key -> parent
}

func (f *fakeSnapshotter) Prepare(_ context.Context, key, parent string, _ ...snapshots.Opt) ([]mount.Mount, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.parents[key] = parent
	return []mount.Mount{{Type: "overlay", Options: []string{"upperdir=/x/" + key}}}, nil
}

func (f *fakeSnapshotter) Remove(_ context.Context, key string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.parents, key)
	return nil
}

// live returns the parents of the live snapshots, sorted.
func (f *fakeSnapshotter) live() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, p := range f.parents {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// settle waits until no refill is in flight.
func settleLayers(t *testing.T, r *Runtime) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		r.layers.mu.Lock()
		n := len(r.layers.filling)
		r.layers.mu.Unlock()
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("refill still in flight")
		}
	}
}

func TestLayerSlots(t *testing.T) {
	sn := &fakeSnapshotter{parents: map[string]string{}}
	r := &Runtime{cfg: Config{Namespace: "ns"}, sn: sn, log: slog.Default()}
	ctx := context.Background()

	// No slot yet: a layer is prepared on demand. A commit refills.
	l, err := r.takeLayer(ctx, "img")
	if err != nil || sn.parents[l.key] != "img" {
		t.Fatalf("take without a slot: %+v, %v", l, err)
	}
	r.refillLayer("img")
	settleLayers(t, r)
	if got := sn.live(); !slices.Equal(got, []string{"img", "img"}) {
		t.Fatalf("after a refill: live layers on %v", got)
	}
	// The next take is the slot.
	slot := r.layers.ready["img"].key
	if l2, _ := r.takeLayer(ctx, "img"); l2.key != slot {
		t.Errorf("take after a refill: %s, want the slot %s", l2.key, slot)
	}

	// A deleted checkpoint layer loses its slot and gets none again.
	r.refillLayer("ck")
	settleLayers(t, r)
	if err := r.dropLayerSlot(ctx, "ck"); err != nil {
		t.Fatal(err)
	}
	r.refillLayer("ck")
	settleLayers(t, r)
	if _, ok := r.layers.ready["ck"]; ok || slices.Contains(sn.live(), "ck") {
		t.Errorf("dropped parent: slot %v, live %v", r.layers.ready, sn.live())
	}

	// A slot that waited too long goes at the next refill.
	r.refillLayer("old")
	settleLayers(t, r)
	r.layers.mu.Lock()
	old := r.layers.ready["old"]
	old.at = time.Now().Add(-2 * layerSlotMaxAge)
	r.layers.ready["old"] = old
	r.layers.mu.Unlock()
	r.refillLayer("img")
	settleLayers(t, r)
	for deadline := time.Now().Add(5 * time.Second); slices.Contains(sn.live(), "old"); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("stale slot still live: %v", sn.live())
		}
	}

	// Close removes what is left and stops refills.
	if err := r.closeLayerSlots(ctx); err != nil {
		t.Fatal(err)
	}
	r.refillLayer("img")
	if got := sn.live(); !slices.Equal(got, []string{"img", "img"}) { // the two taken layers
		t.Errorf("after close: live layers on %v, want only the two taken", got)
	}
}
