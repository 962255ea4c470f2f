package a11y

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/godbus/dbus/v5"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// cachedClient is a Client of a bus with one fake toolkit of n buttons and
// a registry that takes event registrations.
func cachedClient(t *testing.T, n int) (*Client, *fakeToolkit) {
	t.Helper()
	addr := testBus(t)
	app := startToolkit(t, addr, n, nil)
	startRegistry(t, addr, app)
	c := New(addr)
	t.Cleanup(c.Close)
	return c, app
}

func buttonNames(t *testing.T, r *aciv1.A11YTreeResponse) []string {
	t.Helper()
	var names []string
	for _, n := range r.Nodes {
		if n.Role == "push button" {
			names = append(names, n.Name)
		}
	}
	return names
}

func mustTree(t *testing.T, c *Client, o TreeOptions) *aciv1.A11YTreeResponse {
	t.Helper()
	r, err := c.Tree(context.Background(), o, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Partial {
		t.Fatalf("partial tree: %v", r.Apps)
	}
	return r
}

// A second tree asks cached elements nothing but their bounds; an element
// an event names is read again, and what it changed shows in the next
// tree (a name, a state, a child the window added); when the showing
// elements moved (a scroll), every element is asked its states.
func TestTreeCacheFollowsEvents(t *testing.T) {
	c, app := cachedClient(t, 30)
	o := opts()
	first := mustTree(t, c, o)
	if got := len(buttonNames(t, first)); got != 30 || app.getRole.Load() < 30 {
		t.Fatalf("first tree: %d buttons, %d GetRole", got, app.getRole.Load())
	}
	app.getRole.Store(0)
	app.getState.Store(0)
	app.getChildren.Store(0)
	second := mustTree(t, c, o)
	if r, s, k := app.getRole.Load(), app.getState.Load(), app.getChildren.Load(); r != 0 || s != 0 || k != 0 {
		t.Fatalf("cached tree: %d GetRole, %d GetState, %d GetChildren; want none", r, s, k)
	}
	if string(second.TreeHash) != string(first.TreeHash) {
		t.Fatal("the cached tree differs from the first")
	}

	app.rename(t, 7, "renamed", true)
	app.getRole.Store(0)
	names := buttonNames(t, mustTree(t, c, o))
	if names[7] != "renamed" || app.getRole.Load() != 1 {
		t.Fatalf("after a name-change event: button 7 %q, %d GetRole (want only it read again)", names[7], app.getRole.Load())
	}

	app.check(t, 4)
	app.getState.Store(0)
	tr := mustTree(t, c, o)
	if b := tr.Nodes[3+4]; b.Name != "button 4" || b.States&(1<<4) == 0 || app.getState.Load() != 1 {
		t.Fatalf("after a state-change event: %s %q states %#x, %d GetState (want only it asked)", b.Role, b.Name, b.States, app.getState.Load())
	}

	app.add(t)
	names = buttonNames(t, mustTree(t, c, o))
	if len(names) != 31 || names[30] != "button 30" {
		t.Fatalf("after children-changed: %d buttons, last %q", len(names), names[len(names)-1])
	}

	app.scroll.Store(40)
	app.getState.Store(0)
	tr = mustTree(t, c, o)
	if b := tr.Nodes[3]; b.Bounds.GetY() != 20-40 || app.getState.Load() < 31 {
		t.Fatalf("after a scroll: first button at y %d, %d GetState (want every element asked)", b.Bounds.GetY(), app.getState.Load())
	}
	app.getState.Store(0)
	mustTree(t, c, o)
	if n := app.getState.Load(); n != 0 {
		t.Fatalf("the tree after the scroll's asked %d states", n)
	}
}

// A new bus connection starts without cache (its registrations and match
// rules went with the old one).
func TestTreeCacheResetWithConnection(t *testing.T) {
	c, app := cachedClient(t, 10)
	mustTree(t, c, opts())
	c.mu.Lock()
	c.dropLocked()
	c.mu.Unlock()
	app.rename(t, 3, "while away", false) // no event: nobody registered
	app.getRole.Store(0)
	names := buttonNames(t, mustTree(t, c, opts()))
	if names[3] != "while away" || app.getRole.Load() < 10 {
		t.Fatalf("after a reconnect: %q, %d GetRole (want a whole read)", names[3], app.getRole.Load())
	}
}

// An application that floods events has them turned off and is read whole
// from then on, right; guestd's memory for it stays bounded.
func TestTreeCacheFlood(t *testing.T) {
	old := floodEvents
	floodEvents = 500 // a rate a loaded test machine's emitter reaches
	t.Cleanup(func() { floodEvents = old })
	c, app := cachedClient(t, 10)
	mustTree(t, c, opts())
	for i := range 6 * floodEvents {
		app.emit(t, dbus.ObjectPath(fmt.Sprintf("/x/%d", i)), "PropertyChange", "accessible-name")
		if i%100 == 0 {
			c.cache.mu.Lock()
			n := len(c.cache.apps[app.conn.Names()[0]].log)
			c.cache.mu.Unlock()
			if n > maxDirty {
				t.Fatalf("%d events logged", n)
			}
		}
	}
	app.rename(t, 2, "after the flood", false)
	// The ping orders the tree after the events; the flooder is read whole.
	deadline := time.Now().Add(10 * time.Second)
	for {
		app.getRole.Store(0)
		names := buttonNames(t, mustTree(t, c, opts()))
		c.cache.mu.Lock()
		flooded := c.cache.apps[app.conn.Names()[0]].flooded
		c.cache.mu.Unlock()
		if flooded {
			if names[2] != "after the flood" || app.getRole.Load() < 10 {
				t.Fatalf("flooder: %q, %d GetRole (want a whole read)", names[2], app.getRole.Load())
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the flooding application was not cut off")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// What a read loaded of an element an event named during the read is not
// kept; when more events came than the log holds, nothing is.
func TestCacheStoreSkipsChanged(t *testing.T) {
	tc := &treeCache{apps: map[string]*appCache{":1.5": {items: map[objectPath]*cachedItem{}, subscribed: true}}}
	ac := tc.apps[":1.5"]
	v := cacheView{items: ac.items, seq: ac.seq}
	tc.event(":1.5", "/a", eventIface, "PropertyChange")
	tc.event(":1.5", "/c", eventIface, "TextCaretMoved") // not about what the tree shows: not logged
	read := map[objectPath]*item{"/a": {loadOK: true, name: "old"}, "/b": {loadOK: true, name: "b"}, "/c": {loadOK: true}}
	tc.store(nil, ":1.5", v, read, time.Now(), false)
	if ac.items["/a"] != nil || ac.items["/b"] == nil || ac.items["/c"] == nil {
		t.Fatalf("stored %v: want /b and /c, not /a", ac.items)
	}
	if changed, ok := ac.since(v.seq); !ok || len(changed) != 1 || changed[0] != "/a" {
		t.Fatalf("since the view: %v %v", changed, ok)
	}

	v = cacheView{items: ac.items, seq: ac.seq}
	for i := range maxDirty + 10 {
		tc.event(":1.5", objectPath(fmt.Sprintf("/x/%d", i)), eventIface, "ChildrenChanged")
	}
	if len(ac.log) > maxDirty {
		t.Fatalf("%d events logged", len(ac.log))
	}
	if _, ok := ac.since(v.seq); ok {
		t.Fatal("lost events went unnoticed")
	}
	tc.store(nil, ":1.5", v, map[objectPath]*item{"/d": {loadOK: true}}, time.Now(), false)
	if ac.items["/d"] != nil {
		t.Fatal("a read that lost events was kept")
	}
}

// A browser swaps the document its view holds (a page loaded) without a
// children-changed event: the children of an element that held a document
// are read every time.
func TestTreeCacheDocumentHost(t *testing.T) {
	addr := testBus(t)
	app := startToolkit(t, addr, 5, nil)
	app.firstIsDoc = true
	startRegistry(t, addr, app)
	c := New(addr)
	t.Cleanup(c.Close)
	mustTree(t, c, opts())
	mustTree(t, c, opts())
	app.mu.Lock()
	app.extra++ // no event
	app.mu.Unlock()
	tr := mustTree(t, c, opts())
	if n := len(buttonNames(t, tr)); n != 5 {
		t.Fatalf("%d buttons after the window's children changed silently, want 5 (and the document)", n)
	}
}
