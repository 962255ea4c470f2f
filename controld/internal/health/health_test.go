package health

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestAliveLoopsAndChecks(t *testing.T) {
	c := New()
	now := time.Unix(1000, 0)
	var mu sync.Mutex
	c.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	ctx := context.Background()

	reaper := c.Loop("reaper", 10*time.Second)
	if err := c.Alive(ctx); err != nil {
		t.Fatalf("fresh loop: %v", err)
	}
	advance(11 * time.Second)
	if err := c.Alive(ctx); err == nil || !strings.Contains(err.Error(), "loop reaper: no progress for 11s") {
		t.Fatalf("stalled loop: %v", err)
	}
	reaper.Beat()
	if err := c.Alive(ctx); err != nil {
		t.Fatalf("after a beat: %v", err)
	}
	advance(time.Minute)
	reaper.Done() // a loop that ended on purpose is not stalled
	if err := c.Alive(ctx); err != nil {
		t.Fatalf("after Done: %v", err)
	}

	var fail bool
	c.AddCheck("store", func(context.Context) error {
		if fail {
			return errors.New("disk gone")
		}
		return nil
	})
	if err := c.Alive(ctx); err != nil {
		t.Fatal(err)
	}
	fail = true
	if err := c.Alive(ctx); err == nil || !strings.Contains(err.Error(), "check store: disk gone") {
		t.Fatalf("failing check: %v", err)
	}
	// A check that hangs fails at the caller's deadline.
	c2 := New()
	c2.AddCheck("lock", func(context.Context) error { time.Sleep(200 * time.Millisecond); return nil })
	tctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := c2.Alive(tctx); err == nil || !strings.Contains(err.Error(), "check lock: no answer") {
		t.Fatalf("hanging check: %v", err)
	}
}

func TestStateMovesForward(t *testing.T) {
	c := New()
	var seen []State
	c.OnState(func(s State) { seen = append(seen, s) })
	c.SetState(Serving)
	c.SetState(Starting) // ignored: no way back
	c.SetState(Stopping)
	c.SetState(Serving) // ignored
	if len(seen) != 3 || seen[0] != Starting || seen[1] != Serving || seen[2] != Stopping || c.State() != Stopping {
		t.Fatalf("states %v, now %v", seen, c.State())
	}
}
