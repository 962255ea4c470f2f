package fleet

import (
	"context"
	"testing"
	"time"
)

func TestWaitClaimsQuiet(t *testing.T) {
	ctx := context.Background()
	m := &Manager{}

	p := &pool{}
	start := time.Now()
	if waited, ok := m.waitClaimsQuiet(ctx, p, start); waited || !ok {
		t.Fatalf("no claims ever: waited=%v ok=%v, want no wait", waited, ok)
	}

	p.lastClaim.Store(time.Now().UnixNano())
	start = time.Now()
	waited, ok := m.waitClaimsQuiet(ctx, p, start)
	if d := time.Since(start); !waited || !ok || d < poolQuiet-5*time.Millisecond {
		t.Fatalf("claim just ended: waited=%v ok=%v after %v, want a wait of about %v", waited, ok, d, poolQuiet)
	}

	// A claim in flight holds refills off, but not past poolMaxDefer.
	p.claiming.Add(1)
	since := time.Now().Add(-poolMaxDefer + 20*time.Millisecond)
	start = time.Now()
	if _, ok := m.waitClaimsQuiet(ctx, p, since); !ok || time.Since(start) > poolQuiet {
		t.Fatalf("deferral not bounded: ok=%v after %v", ok, time.Since(start))
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, ok := m.waitClaimsQuiet(cctx, p, time.Now()); ok {
		t.Fatal("canceled wait reported ok")
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
