package store

import (
	"sync"
	"time"
)

// groupCommit is the store's one way of making writes durable together:
// items queue, and one goroutine at a time commits them in batches, so
// items that arrive while a batch commits share the next commit (one sync)
// instead of queueing for one each. Batches commit in arrival order, one
// after the other. The records' writes (Update) and the claim journal's
// frames (Claim) are both queues of this kind.
type groupCommit[T any] struct {
	// take is how many items at the head of a non-empty queue go in the
	// next batch (at least 1); commit makes a batch durable and answers
	// its items.
	take   func(queue []T) int
	commit func(batch []T)
	// hold, when set, is how much longer the committer waits before it
	// takes the next batch of a non-empty queue (0: take it now); an add
	// ends the wait early, for hold to look again. Called with mu held.
	hold func(queue []T) time.Duration

	mu      sync.Mutex
	queue   []T
	running bool          // a committer goroutine is draining queue
	added   chan struct{} // an add during a hold (capacity 1)
}

// add queues item for the next batch, starting a committer when none runs.
func (g *groupCommit[T]) add(item T) {
	g.mu.Lock()
	g.queue = append(g.queue, item)
	if !g.running {
		g.running = true
		go g.drain()
	} else if g.added != nil {
		select {
		case g.added <- struct{}{}:
		default:
		}
	}
	g.mu.Unlock()
}

// drain commits batches until the queue is empty.
func (g *groupCommit[T]) drain() {
	for {
		g.mu.Lock()
		if len(g.queue) == 0 {
			g.running = false
			g.mu.Unlock()
			return
		}
		if g.hold != nil {
			if d := g.hold(g.queue); d > 0 {
				if g.added == nil {
					g.added = make(chan struct{}, 1)
				}
				g.mu.Unlock()
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-g.added:
				}
				t.Stop()
				continue
			}
		}
		n := g.take(g.queue)
		batch := g.queue[:n:n]
		g.queue = g.queue[n:]
		g.mu.Unlock()
		g.commit(batch)
	}
}
