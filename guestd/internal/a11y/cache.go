package a11y

import (
	"context"
	"hash/fnv"
	"maps"
	"sync"
	"time"
)

// The tree cache. Toolkits send AT-SPI events (object:children-changed,
// property-change, text-changed, state-changed) to whoever registered for
// them with the registry. guestd registers, keeps what a tree read of each
// element (role, name, description, states, children, interfaces, the
// bounds of the showing ones) and forgets an element when an event names
// it; a later tree asks only what has no event: the bounds of the showing
// elements (and their text and values), and what the cache lacks. Before,
// a page of 1,800 elements cost 1,000 to 6,000 calls by luck (Chromium
// answers its own cache, Cache.GetItems, for all or a small part of a
// page, by the order the page was built in); with the cache, about 350.
//
// What has no event: elements a scroll or a resize brings into view
// (Chromium sets SHOWING silently), so when a showing element's bounds are
// not the cached ones the tree is read again with every element asked its
// states (tree.go, moved); a document's name (its title: Chromium sends
// nothing), so documents are always read; a document's place (a page
// loaded in its stead: Chromium says nothing to the element hosting it),
// so the children of an element that ever held a document are always
// read, and a tree that meets a new document reads the application again
// without the cache (a page load changes more of the browser silently,
// such as the description carrying the address); and whatever else a toolkit
// changes silently, so an entry lives 5 to 10 s (by its path) and is read
// again after: such a change shows within 10 s.
//
// Ordering: before a tree uses an application's cache it pings the
// application over the bus, which carries its events: the application
// answers after sending the events of everything it did before, so a
// change made before the tree was asked is in it. What a read found of an
// element an event named during the read is not kept. A new application, a
// new bus connection (the registrations go with it), lost events (more
// than maxDirty between two trees) and an application flooding events
// (more than floodEvents a second: its match rule is removed, the bus no
// longer routes its events to guestd) fall back to reading the application
// whole, as without a cache. Bounded: at most cacheApps applications,
// cacheItems elements each.

// cacheEvents are the events the registry is asked to have sent.
var cacheEvents = []string{"object:children-changed", "object:property-change", "object:text-changed", "object:state-changed"}

const (
	eventIface = "org.a11y.atspi.Event.Object"
	// maxDirty: the events logged between two trees; past it the
	// application's cache is dropped whole.
	maxDirty   = 4096
	cacheApps  = 16
	cacheItems = 2 * DefaultMaxNodes
	// cacheTTL is an entry's shortest life; each gets up to as much again
	// (by its path), so a page's entries, loaded at once, are read again
	// a few at a time.
	cacheTTL = 5 * time.Second
)

// expiry is when an entry for path loaded at now is read again.
func expiry(path objectPath, now time.Time) time.Time {
	h := fnv.New32a()
	h.Write([]byte(path))
	return now.Add(cacheTTL + time.Duration(h.Sum32()%1000)*cacheTTL/1000)
}

// fresh: the entry is younger than its expiry (and the clock did not jump
// back past its load).
func (ci *cachedItem) fresh(now time.Time) bool {
	return now.Before(ci.expires) && ci.expires.Sub(now) <= 2*cacheTTL
}

// documentRole: Chromium changes a document's name (its title) without an
// event.
func documentRole(r uint32) bool {
	switch r {
	case 82, 92, 93, 94, 95, 96: // document frame, spreadsheet, presentation, text, web, email
		return true
	}
	return false
}

// floodEvents: events per second past which an application's events are
// turned off (RemoveMatch) and its trees read it whole (a var: the tests
// flood with fewer).
var floodEvents = 20000

// cachedItem is what a tree keeps of one element; never changed once
// published (a new map replaces the old).
type cachedItem struct {
	expires    time.Time
	loaded     bool // role, name, desc, count, parent, ifaces are known
	role       uint32
	name, desc string
	count      int32
	parent     ref
	ifaces     uint32
	known      bool // children is the complete list
	children   []ref
	// states as last read (statesKnown), and the bounds then, for the
	// showing elements (hasBounds): a tree trusts the states while the
	// showing elements keep their bounds.
	statesKnown bool
	states      uint64
	hasBounds   bool
	bounds      [4]int32
}

// appCache is one application's cache.
type appCache struct {
	items map[objectPath]*cachedItem
	// seq counts the events that named an element; log holds the paths
	// of events base+1 to seq (at most maxDirty: the older half goes when
	// full), applied is the last one items reflects.
	seq, base, applied uint64
	log                []objectPath
	// hosts are the elements that held a document (their children are
	// never kept).
	hosts      map[objectPath]bool
	subscribed bool // its match rule is on the connection
	flooded    bool
	window     time.Time
	inWindow   int
}

// since returns the paths of events after seq n; ok false when some of
// them are no longer logged.
func (ac *appCache) since(n uint64) ([]objectPath, bool) {
	if n < ac.base {
		return nil, false
	}
	return ac.log[n-ac.base:], true
}

// treeCache is the Client's cache of the applications on one bus
// connection.
type treeCache struct {
	mu         sync.Mutex
	conn       *wireConn
	registered bool // the registry sends cacheEvents
	failed     bool // the registry refused: no cache on this connection
	apps       map[string]*appCache
}

// reset starts over on conn (nil: none): the registrations and match rules
// belonged to the connection before.
func (t *treeCache) reset(conn *wireConn) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.conn, t.registered, t.failed, t.apps = conn, false, false, nil
	if conn != nil {
		conn.setSignalHandler(t.event)
	}
}

// event runs on the connection's reader for every signal its match rules
// route to guestd: constant work, no calls.
func (t *treeCache) event(sender string, path objectPath, iface, member string) {
	if iface != eventIface {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	ac := t.apps[sender]
	if ac == nil || ac.flooded {
		return
	}
	now := time.Now()
	if now.Sub(ac.window) >= time.Second || now.Before(ac.window) {
		ac.window, ac.inWindow = now, 0
	}
	if ac.inWindow++; ac.inWindow > floodEvents {
		ac.flooded, ac.items, ac.log = true, nil, nil
		ac.seq++
		ac.base = ac.seq
		conn := t.conn
		if conn == nil {
			return
		}
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
			defer cancel()
			_ = call(ctx, conn, busRef, "org.freedesktop.DBus.RemoveMatch", []any{matchRule(sender)})
		}()
		return
	}
	switch member {
	case "PropertyChange", "ChildrenChanged", "TextChanged", "StateChanged":
	default:
		return // another client's registration (caret moves, selections...)
	}
	if len(ac.log) >= maxDirty {
		half := len(ac.log) / 2
		ac.log = append(ac.log[:0], ac.log[half:]...)
		ac.base += uint64(half)
	}
	ac.seq++
	ac.log = append(ac.log, path)
}

func matchRule(sender string) string {
	return "type='signal',interface='" + eventIface + "',sender='" + sender + "'"
}

// cacheView is a read's share of an application's cache: the items (read
// only) and the event count they are current to.
type cacheView struct {
	items map[objectPath]*cachedItem
	seq   uint64
}

// view readies bus's cache for a read over conn and returns it; ok false:
// the application is read whole and nothing is kept (no registration,
// flooded, too many applications, or a call failed). It registers the
// events with the registry (once per connection), routes the
// application's events to guestd (once), and pings the application over
// the bus so every event it sent before is applied.
func (t *treeCache) view(ctx context.Context, conn *wireConn, bus string) (cacheView, bool) {
	t.mu.Lock()
	if t.conn != conn || t.failed {
		t.mu.Unlock()
		return cacheView{}, false
	}
	if !t.registered {
		t.mu.Unlock()
		if !t.register(ctx, conn) {
			return cacheView{}, false
		}
		t.mu.Lock()
	}
	ac := t.apps[bus]
	if ac == nil {
		if len(t.apps) >= cacheApps {
			t.mu.Unlock()
			return cacheView{}, false
		}
		ac = &appCache{}
		if t.apps == nil {
			t.apps = map[string]*appCache{}
		}
		t.apps[bus] = ac
	}
	subscribed, flooded := ac.subscribed, ac.flooded
	t.mu.Unlock()
	if flooded {
		return cacheView{}, false
	}
	if !subscribed {
		if call(ctx, conn, busRef, "org.freedesktop.DBus.AddMatch", []any{matchRule(bus)}) != nil {
			return cacheView{}, false
		}
	} else if call(ctx, conn, ref{bus, rootPath}, "org.freedesktop.DBus.Peer.Ping", nil) != nil {
		return cacheView{}, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.apps[bus] != ac || ac.flooded {
		return cacheView{}, false
	}
	ac.subscribed = true
	changed, ok := ac.since(ac.applied)
	switch {
	case !ok || ac.items == nil:
		ac.items = map[objectPath]*cachedItem{} // events were lost
	case len(changed) > 0:
		items := maps.Clone(ac.items)
		for _, p := range changed {
			delete(items, p)
		}
		ac.items = items
	}
	ac.applied = ac.seq
	return cacheView{items: ac.items, seq: ac.seq}, true
}

// register asks the registry to have cacheEvents sent. The registry
// answers after it told the applications (the bus delivers in order), so
// a ping sent to one afterwards is answered after it sends them.
func (t *treeCache) register(ctx context.Context, conn *wireConn) bool {
	calls := make([]pending, len(cacheEvents))
	for i, ev := range cacheEvents {
		calls[i] = start(ctx, conn, ref{registryName, "/org/a11y/atspi/registry"}, registryName+".RegisterEvent", ev, []string{}, "")
	}
	ok := true
	for _, p := range calls {
		if p.wait(ctx) != nil {
			ok = false
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.conn == conn {
		t.registered = ok
		// A registry that refuses (an older one, another signature) is
		// not asked again on this connection; a deadline is.
		t.failed = !ok && ctx.Err() == nil
	}
	return ok && t.conn == conn
}

// keep forgets the applications not in apps (and their match rules).
func (t *treeCache) keep(ctx context.Context, apps []ref) {
	t.mu.Lock()
	var gone []string
	for bus, ac := range t.apps {
		found := false
		for _, r := range apps {
			found = found || r.Bus == bus
		}
		if !found {
			delete(t.apps, bus)
			if ac.subscribed && !ac.flooded {
				gone = append(gone, bus)
			}
		}
	}
	conn := t.conn
	t.mu.Unlock()
	for _, bus := range gone {
		start(ctx, conn, busRef, "org.freedesktop.DBus.RemoveMatch", matchRule(bus))
	}
}

// store keeps what a read found of its items, but for the elements an
// event named since its view (what it read of them may predate the event;
// the next view drops them from the cache too). Entries the read used
// keep their expiry, with the states and bounds it read; entries it read
// get a new one. whole: the read saw every element of the application, so
// the ones it did not see are gone.
func (t *treeCache) store(conn *wireConn, bus string, v cacheView, read map[objectPath]*item, now time.Time, whole bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ac := t.apps[bus]
	if t.conn != conn || ac == nil || ac.flooded {
		return
	}
	changed, ok := ac.since(v.seq)
	if !ok {
		return
	}
	skip := make(map[objectPath]bool, len(changed))
	for _, p := range changed {
		skip[p] = true
	}
	items := make(map[objectPath]*cachedItem, len(ac.items)+len(read))
	for p, ci := range ac.items {
		if !whole || read[p] != nil {
			items[p] = ci
		}
	}
	for p, it := range read {
		for _, ch := range it.children {
			if c := read[ch.Path]; c != nil && documentRole(c.role) && !ac.hosts[p] && len(ac.hosts) < cacheItems {
				if ac.hosts == nil {
					ac.hosts = map[objectPath]bool{}
				}
				ac.hosts[p] = true
			}
		}
	}
	for p, it := range read {
		if skip[p] {
			delete(items, p)
			continue
		}
		var e cachedItem
		switch {
		case it.entry != nil:
			e = *it.entry
		case it.loadOK && !documentRole(it.role):
			e = cachedItem{expires: expiry(p, now), loaded: true, role: it.role, name: it.name, desc: it.desc,
				count: it.count, parent: it.parent, ifaces: it.ifaces}
		default:
			// Partly read, or a document (Chromium renames one without an
			// event): its children only.
			e = cachedItem{expires: expiry(p, now)}
		}
		e.statesKnown, e.states = e.loaded, it.states
		e.hasBounds, e.bounds = it.bounds != nil, [4]int32{}
		if it.bounds != nil {
			e.bounds = [4]int32{it.bounds.X, it.bounds.Y, it.bounds.Width, it.bounds.Height}
		}
		e.known, e.children = it.known && !ac.hosts[p], nil
		if e.known {
			e.children = it.children
		}
		items[p] = &e
	}
	if len(items) > cacheItems {
		// A page that keeps making elements: keep this read's only.
		for p := range items {
			if read[p] == nil {
				delete(items, p)
			}
		}
	}
	ac.items = items
}

// warm: the cache knows the application (its root, and at least half of
// its entries are fresh), so the toolkit's own cache (GetItems, a call
// that costs a browser about 20 ms) is not asked; the expired entries are
// read one by one.
func warm(items map[objectPath]*cachedItem, now time.Time) bool {
	root := items[rootPath]
	if root == nil || !root.loaded || !root.fresh(now) {
		return false
	}
	n := 0
	for _, ci := range items {
		if ci.fresh(now) {
			n++
		}
	}
	return 2*n >= len(items)
}
