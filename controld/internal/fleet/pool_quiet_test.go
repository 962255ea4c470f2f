package fleet

import (
	"context"
	"testing"
	"time"
)

func TestWaitClaimsQuiet(t *testing.T) {
	ctx := context.Background()
	m := &pooler{registry: &registry{}}

	start := time.Now()
	if waited, ok := m.waitClaimsQuiet(ctx, start); waited || !ok {
		t.Fatalf("no claims ever: waited=%v ok=%v, want no wait", waited, ok)
	}

	m.claims.enter()
	m.claims.leave()
	start = time.Now()
	waited, ok := m.waitClaimsQuiet(ctx, start)
	if d := time.Since(start); !waited || !ok || d < poolQuiet-5*time.Millisecond {
		t.Fatalf("claim just ended: waited=%v ok=%v after %v, want a wait of about %v", waited, ok, d, poolQuiet)
	}

	// A claim in flight holds refills off, but not past poolMaxDefer.
	m.claims.enter()
	defer m.claims.leave()
	since := time.Now().Add(-poolMaxDefer + 20*time.Millisecond)
	start = time.Now()
	if _, ok := m.waitClaimsQuiet(ctx, since); !ok || time.Since(start) > poolQuiet {
		t.Fatalf("deferral not bounded: ok=%v after %v", ok, time.Since(start))
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, ok := m.waitClaimsQuiet(cctx, time.Now()); ok {
		t.Fatal("canceled wait reported ok")
	}
}

// Boot and fork slots hold their precreates while claims of any pool are
// in flight and for poolQuiet after (the fill bounds the hold by
// slotRefillHold); a create that found no boot slot ends the hold.
func TestSlotRefillsHoldForClaims(t *testing.T) {
	w := &warmer{registry: &registry{}}
	ws, fs := &warmSlots{m: w}, &forkSlots{m: w}
	now := time.Now()
	if h, f := ws.holdLocked(now), fs.holdLocked(now); h != 0 || f != 0 {
		t.Fatalf("no claims: boot slots hold %v, fork slots %v; want 0", h, f)
	}
	w.claims.enter()
	if h, f := ws.holdLocked(now), fs.holdLocked(now); h != poolQuiet || f != poolQuiet {
		t.Fatalf("claim in flight: boot slots hold %v, fork slots %v; want %v", h, f, poolQuiet)
	}
	w.claims.leave()
	if h, f := ws.holdLocked(time.Now()), fs.holdLocked(time.Now()); h <= 0 || h > poolQuiet || f <= 0 || f > poolQuiet {
		t.Fatalf("claim just ended: boot slots hold %v, fork slots %v; want (0, %v]", h, f, poolQuiet)
	}
	ws.demand = true
	if h := ws.holdLocked(time.Now()); h != 0 {
		t.Fatalf("a create found no slot: boot slots hold %v, want 0", h)
	}
}

func TestGate(t *testing.T) {
	ctx := context.Background()
	var g gate
	start := time.Now()
	g.wait(ctx, 0, time.Second)
	if time.Since(start) > 50*time.Millisecond {
		t.Fatal("wait on an idle gate blocked")
	}
	g.enter()
	g.enter()
	go func() {
		time.Sleep(20 * time.Millisecond)
		g.leave()
		g.leave()
	}()
	start = time.Now()
	g.wait(ctx, 10*time.Millisecond, 5*time.Second)
	if d := time.Since(start); d < 25*time.Millisecond || d > 2*time.Second {
		t.Fatalf("wait returned after %v, want 10ms after the last leaves (~30ms)", d)
	}
	g.enter()
	start = time.Now()
	g.wait(ctx, 0, 30*time.Millisecond)
	if d := time.Since(start); d < 25*time.Millisecond || d > 2*time.Second {
		t.Fatalf("bounded wait returned after %v, want ~30ms", d)
	}
	g.leave()
}
