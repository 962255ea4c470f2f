package a11y

import (
	"slices"
	"sync"
	"time"
)

// A browser's actions cost the most calls of a tree: GetActions, then a
// GetName per action (Chromium leaves the names out of GetActions), on
// every control on screen; about 650 of a 1,800-node page's 1,050 calls.
// They change with the element's role and states (a checkbox's "check"
// becomes "uncheck"), so the Client remembers each element's names with
// the role and states they were read under, and a tree reuses them while
// both are the same and the names are younger than namesTTL. What an
// application changes without changing the role or states (a script that
// gives a <div> a click handler) shows within namesTTL.
const namesTTL = 5 * time.Second

// actionNames are an element's action names as read at time at.
type actionNames struct {
	role   uint32
	states uint64
	names  []string
	at     time.Time
}

// match returns the names (a copy) when they were read under it's role and
// states less than namesTTL before now.
func (n actionNames) match(it *item, now time.Time) ([]string, bool) {
	age := now.Sub(n.at)
	if n.at.IsZero() || n.role != it.role || n.states != it.states || age < 0 || age >= namesTTL {
		return nil, false
	}
	return slices.Clone(n.names), true
}

// nameCache holds the action names of the applications on the bus, by
// unique bus name (never reused while the bus runs). Bounded: an
// application keeps at most MaxNodes entries, and applications that left
// the desktop are forgotten.
type nameCache struct {
	mu   sync.Mutex
	apps map[string]map[objectPath]actionNames
}

// of returns the application's names; the map is never written after it
// is handed out (learn makes a new one).
func (c *nameCache) of(bus string) map[objectPath]actionNames {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.apps[bus]
}

// keep forgets the applications not in apps.
func (c *nameCache) keep(apps []ref) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for bus := range c.apps {
		if !slices.ContainsFunc(apps, func(r ref) bool { return r.Bus == bus }) {
			delete(c.apps, bus)
		}
	}
}

// learn stores the names a read of bus asked for (those it reused keep
// their time). Only complete reads are kept: an action left unnamed (a
// call that failed) is asked again next time.
func (c *nameCache) learn(bus string, items []*item) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.apps[bus]
	m := make(map[objectPath]actionNames, len(old))
	for p, n := range old {
		if age := now.Sub(n.at); age >= 0 && age < namesTTL {
			m[p] = n
		}
	}
	for _, it := range items {
		if it.actions == nil || it.actionsKnown || slices.Contains(it.actions, "") {
			continue
		}
		m[it.ref.Path] = actionNames{role: it.role, states: it.states, names: slices.Clone(it.actions), at: now}
	}
	if len(m) > MaxNodes {
		// A page that keeps making elements: start over rather than grow.
		m = map[objectPath]actionNames{}
	}
	if c.apps == nil {
		c.apps = map[string]map[objectPath]actionNames{}
	}
	c.apps[bus] = m
}

// forget drops every name (the bus connection was lost: a new bus may
// reuse unique names).
func (c *nameCache) forget() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.apps = nil
}
