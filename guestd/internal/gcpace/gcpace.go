// Package gcpace paces guestd's garbage collector by its heap alone.
//
// Go's runtime collects when the heap has grown by GOGC percent since the
// last collection, and also when two minutes have passed since it (sysmon's
// forced collection). The clock keeps running while a sandbox is frozen (a
// pool member waits frozen until its claim) and across a checkpoint (a
// replica restores its source's time of the last collection), so a guestd
// thawed or restored more than two minutes after its last collection
// collected first: in the claim's or the fork's window, on a heap that KSM
// had merged with the other replicas' (every page the collector writes is
// then a copy-on-write fault, with a TLB flush of the other CPUs since
// guestd is multi-threaded). Measured on a 2-vCPU PVM host: a claim of such
// a pool member cost guestd 12 to 13 ms of CPU against 3 to 3.5 ms for one
// frozen less than two minutes (controld/docs/pools.md, "A thawed guestd
// does not collect first").
//
// Start turns the collector's own triggers off (GOGC=off, which also ends
// the forced collection) and sets a memory limit instead, moved after
// every collection to what GOGC=100 would let the heap reach: the live heap
// plus as much again (and the stacks and globals it scans), at least 4 MiB,
// over the memory the runtime holds besides its heap (and 5% more, which
// the scavenger keeps free). The heap paces the collector as before; time
// no longer does.
package gcpace

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

// minGrowth is the least the heap may grow between two collections: the
// runtime's own minimum heap goal at GOGC=100.
const minGrowth = 4 << 20

// The metrics a limit is computed from, in this order.
var names = []string{
	"/memory/classes/total:bytes",
	"/memory/classes/heap/released:bytes",
	"/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/unused:bytes",
	"/memory/classes/heap/free:bytes",
	"/gc/heap/live:bytes",
	"/gc/scan/stack:bytes",
	"/gc/scan/globals:bytes",
}

type pacer struct {
	mu      sync.Mutex // a limit is computed and set as one step
	samples []metrics.Sample
	// spare is the growth Spare asked for when spareAt collections had
	// completed; it holds until the next one.
	spare, spareAt uint64
}

// active is the pacer Start started, for Spare.
var active atomic.Pointer[pacer]

// Start paces the collector by the heap alone, unless GOGC or GOMEMLIMIT
// is set (the operator's choice stands), and reports whether it did.
func Start(getenv func(string) string) bool {
	if getenv("GOGC") != "" || getenv("GOMEMLIMIT") != "" {
		return false
	}
	p := &pacer{samples: make([]metrics.Sample, len(names))}
	for i, n := range names {
		p.samples[i].Name = n
	}
	// The limit first: with GOGC off and no limit nothing would collect.
	p.mu.Lock()
	debug.SetMemoryLimit(p.limit())
	p.mu.Unlock()
	debug.SetGCPercent(-1)
	p.arm()
	active.Store(p)
	return true
}

// Spare lets the heap grow by at least n before the next collection, after
// which it is paced as before; a no-op unless Start paced the collector.
// guestd calls it after it gave its freed heap back: before a pool
// member's freeze, and before a checkpoint's dump (its replicas restore
// the spare). A small live heap may otherwise grow by only 4 MiB, less
// than a new session and its first screenshot allocate, and a member's
// collection at its claim ran on a heap KSM had merged with its
// siblings', every page it wrote a copy-on-write fault inside the
// claimant's first screenshot. The spare is fresh memory, not merged
// pages.
func Spare(n uint64) {
	p := active.Load()
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.spare, p.spareAt = n, cycles()
	debug.SetMemoryLimit(p.limit())
}

// cycles is how many collections have completed.
func cycles() uint64 {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// limit is the memory limit that lets the heap grow as GOGC=100 would
// from the last collection's live heap (or by the spare). Called with mu
// held.
func (p *pacer) limit() int64 {
	metrics.Read(p.samples)
	v := func(i int) uint64 {
		if p.samples[i].Value.Kind() != metrics.KindUint64 {
			return 0
		}
		return p.samples[i].Value.Uint64()
	}
	total, released := v(0), v(1)
	heap := v(2) + v(3) + v(4) // objects, unused and free spans: reused before the heap grows
	live, stacks, globals := v(5), v(6), v(7)
	held := total - released // what the memory limit counts
	besides := held - min(heap, held)
	want := besides + live + max(live+stacks+globals, minGrowth, p.spare)
	// Under a memory limit the scavenger keeps the runtime's memory at 95%
	// of it: a limit of just what the heap may reach would have it give
	// back pages every cycle that the heap faults in again.
	return int64(want * 100 / scavengedPercent)
}

// scavengedPercent is the share of the memory limit the runtime's
// scavenger keeps the process under (runtime/mgcscavenge.go,
// reduceExtraPercent).
const scavengedPercent = 95

// cycle is allocated once per collection; its cleanup runs after the
// collection that found it unreachable. 16 bytes: the tiny allocator,
// whose objects may never get their cleanups run, takes smaller ones.
type cycle struct{ _ [16]byte }

// arm moves the limit after the next collection, and again after each one.
func (p *pacer) arm() {
	runtime.AddCleanup(new(cycle), func(p *pacer) {
		p.mu.Lock()
		// The cleanup of a collection that completed before Spare may
		// run after it: that one keeps the spare.
		if p.spare > 0 && cycles() > p.spareAt {
			p.spare = 0
		}
		debug.SetMemoryLimit(p.limit())
		p.mu.Unlock()
		p.arm()
	}, p)
}
