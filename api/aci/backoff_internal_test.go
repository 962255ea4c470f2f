package aci

import (
	"testing"
	"time"
)

// Full jitter: attempt n waits uniformly in [0, min(Max, Initial*2^n)]; a
// thousand sessions dropped together spread over the whole window rather
// than redialling at the same instant.
func TestBackoffFullJitter(t *testing.T) {
	b := Backoff{Initial: 50 * time.Millisecond, Max: 2 * time.Second}.withDefaults()
	for n, ceiling := range []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond,
		400 * time.Millisecond, 800 * time.Millisecond, 1600 * time.Millisecond, 2 * time.Second, 2 * time.Second} {
		const sessions = 1024
		var lo, hi time.Duration = ceiling, 0
		distinct := map[time.Duration]bool{}
		quarters := [4]int{}
		for range sessions {
			w := b.wait(n)
			if w < 0 || w > ceiling {
				t.Fatalf("attempt %d: wait %v outside [0, %v]", n, w, ceiling)
			}
			lo, hi = min(lo, w), max(hi, w)
			distinct[w] = true
			quarters[min(int(4*w/(ceiling+1)), 3)]++
		}
		if len(distinct) < sessions/2 || lo > ceiling/20 || hi < ceiling*19/20 {
			t.Errorf("attempt %d: %d distinct waits in [%v, %v] of [0, %v]: not spread", n, len(distinct), lo, hi, ceiling)
		}
		for q, c := range quarters {
			if c < sessions/8 { // uniform: about 256 per quarter
				t.Errorf("attempt %d: %d of %d waits in quarter %d", n, c, sessions, q)
			}
		}
	}
	if w := b.wait(1000); w < 0 || w > b.Max {
		t.Fatalf("a late attempt waits %v", w)
	}
}
