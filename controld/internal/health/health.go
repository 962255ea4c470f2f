// Package health says whether controld is alive and whether it is ready.
//
// Alive: every loop that registered with a Checker beat within its bound and
// every check (the store commits, the manager's lock is free) passed. What
// answers "alive" drives the systemd watchdog (WATCHDOG=1 only while alive)
// and /healthz; a blind timer would keep a controld whose loops are stuck.
//
// Ready: the State, STARTING until startup reconciliation is done, SERVING
// until shutdown begins, then STOPPING. It drives grpc.health.v1 and
// /readyz.
package health

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"
)

// State is controld's readiness.
type State int

const (
	// Starting: listeners may answer, reconciliation is not done.
	Starting State = iota
	// Serving: reconciled, serving every API.
	Serving
	// Stopping: shutdown began; no new work.
	Stopping
)

func (s State) String() string {
	switch s {
	case Starting:
		return "starting"
	case Serving:
		return "serving"
	case Stopping:
		return "stopping"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Checker holds the loops, checks and state. The zero value is not usable;
// use New. Safe for concurrent use.
type Checker struct {
	now func() time.Time

	mu       sync.Mutex
	state    State
	loops    map[*Loop]struct{}
	checks   []check
	watchers []func(State)
}

type check struct {
	name string
	fn   func(context.Context) error
}

// New returns a Checker in state Starting.
func New() *Checker {
	return &Checker{now: time.Now, loops: map[*Loop]struct{}{}}
}

// Loop is one background loop that promises to Beat at least once per
// bound while it runs.
type Loop struct {
	c     *Checker
	name  string
	bound time.Duration
	last  time.Time // guarded by c.mu
}

// Loop registers a loop: from now until Done it must Beat within bound.
func (c *Checker) Loop(name string, bound time.Duration) *Loop {
	l := &Loop{c: c, name: name, bound: bound}
	c.mu.Lock()
	l.last = c.now()
	c.loops[l] = struct{}{}
	c.mu.Unlock()
	return l
}

// Beat records progress.
func (l *Loop) Beat() {
	l.c.mu.Lock()
	l.last = l.c.now()
	l.c.mu.Unlock()
}

// Done unregisters the loop (it ended on purpose, e.g. at shutdown).
func (l *Loop) Done() {
	l.c.mu.Lock()
	delete(l.c.loops, l)
	l.c.mu.Unlock()
}

// AddCheck adds a check run by Alive; it must honour ctx's deadline.
func (c *Checker) AddCheck(name string, fn func(ctx context.Context) error) {
	c.mu.Lock()
	c.checks = append(c.checks, check{name, fn})
	c.mu.Unlock()
}

// Alive returns nil when every registered loop beat within its bound and
// every check passed within ctx; otherwise an error naming each failure.
func (c *Checker) Alive(ctx context.Context) error {
	c.mu.Lock()
	now := c.now()
	var errs []error
	for l := range c.loops {
		if since := now.Sub(l.last); since > l.bound {
			errs = append(errs, fmt.Errorf("loop %s: no progress for %s (bound %s)", l.name, since.Round(time.Millisecond), l.bound))
		}
	}
	checks := append([]check(nil), c.checks...)
	c.mu.Unlock()
	sort.Slice(errs, func(i, j int) bool { return errs[i].Error() < errs[j].Error() })
	for _, ch := range checks {
		if err := runCheck(ctx, ch.fn); err != nil {
			errs = append(errs, fmt.Errorf("check %s: %w", ch.name, err))
		}
	}
	return errors.Join(errs...)
}

// runCheck runs fn but returns at ctx's deadline even when fn does not (a
// check that hangs is the failure it looks for).
func runCheck(ctx context.Context, fn func(context.Context) error) error {
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("no answer: %w", ctx.Err())
	}
}

// State returns the current readiness.
func (c *Checker) State() State {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state
}

// SetState changes the readiness and tells the watchers. States only move
// forward (Starting -> Serving -> Stopping).
func (c *Checker) SetState(s State) {
	c.mu.Lock()
	if s <= c.state {
		c.mu.Unlock()
		return
	}
	c.state = s
	ws := append([]func(State){}, c.watchers...)
	c.mu.Unlock()
	for _, w := range ws {
		w(s)
	}
}

// OnState calls fn with the current state now and with every later change.
func (c *Checker) OnState(fn func(State)) {
	c.mu.Lock()
	c.watchers = append(c.watchers, fn)
	s := c.state
	c.mu.Unlock()
	fn(s)
}
