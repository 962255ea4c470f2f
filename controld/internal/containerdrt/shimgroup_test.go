//go:build linux

package containerdrt

import (
	"context"
	"testing"
	"time"
)

func TestShimGroupsSize(t *testing.T) {
	var gs shimGroups
	first := gs.join("f0")
	gs.created("f0", true)
	for i := 1; i < shimGroupSize; i++ {
		id := "f" + string(rune('a'+i))
		if g := gs.join(id); g != first {
			t.Fatalf("fork %d in group %q, want %q", i, g, first)
		}
		gs.created(id, true)
	}
	if g := gs.join("over"); g == first {
		t.Fatalf("fork %d still in group %q", shimGroupSize, g)
	}
	var other shimGroups
	if g := other.join("f0"); g == first {
		t.Fatalf("another runtime's first group %q is this one's", g)
	}
}

// The last live fork's leave closes its group: the next fork starts a new
// one instead of finding a daemon that is exiting.
func TestShimGroupsLastLeaveCloses(t *testing.T) {
	var gs shimGroups
	a := gs.join("a")
	gs.created("a", true)
	gs.join("b")
	gs.created("b", true)
	gs.leave(context.Background(), "a")
	if g := gs.join("c"); g != a {
		t.Fatalf("a fork beside a live one in group %q, want %q", g, a)
	}
	gs.created("c", true)
	gs.leave(context.Background(), "b")
	gs.leave(context.Background(), "c")
	if g := gs.join("d"); g == a {
		t.Fatalf("a fork joined group %q after its last fork left", g)
	}
}

// Deleting a group's last live fork waits for the forks still joining it:
// once created, the daemon holds them and the delete does not end it.
func TestShimGroupsLastLeaveWaitsForJoins(t *testing.T) {
	var gs shimGroups
	gs.join("a")
	gs.created("a", true)
	gs.join("b") // b's shim start is under way
	left := make(chan struct{})
	go func() {
		gs.leave(context.Background(), "a")
		close(left)
	}()
	select {
	case <-left:
		t.Fatal("the last live fork left while another was joining its group")
	case <-time.After(50 * time.Millisecond):
	}
	gs.created("b", true)
	select {
	case <-left:
	case <-time.After(5 * time.Second):
		t.Fatal("leave still waiting after the join ended")
	}

	// A fork that leaves before its task exists (its create failed
	// earlier) ends its join too.
	gs.join("c")
	gs.join("d")
	gs.created("c", true)
	gs.leave(context.Background(), "d")
	done := make(chan struct{})
	go func() {
		gs.leave(context.Background(), "c")
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("leave waits for a fork that left")
	}

	// Waiting ends with the caller's context.
	gs.join("e")
	gs.created("e", true)
	gs.join("f")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	gs.leave(ctx, "e")
}

// A failed create closes its group (containerd's cleanup may have ended a
// daemon with no live fork); the fork is out of it, to be made again in a
// shim of its own.
func TestShimGroupsFailedCreate(t *testing.T) {
	var gs shimGroups
	a := gs.join("a")
	gs.join("b")
	if !gs.grouped("a") {
		t.Fatal("a joining fork is not grouped")
	}
	gs.created("a", false)
	if gs.grouped("a") {
		t.Fatal("a fork whose create failed is still grouped")
	}
	if !gs.grouped("b") {
		t.Fatal("the failure of another fork took b out of its group")
	}
	if g := gs.join("c"); g == a {
		t.Fatalf("a fork joined group %q after a create failed in it", g)
	}
	gs.created("b", true)
	if gs.grouped("b") {
		t.Fatal("a created fork reports joining")
	}
	gs.leave(context.Background(), "b") // no one is joining: returns
	gs.leave(context.Background(), "unknown")
}

// A group's second member creates its task only after the first member's
// create returned (race 1 of shimgroup.go: concurrent first starts of a
// group leak a daemon); when that create failed, or its fork left before
// it, the waiting members go to shims of their own.
func TestShimGroupsAwaitFirstCreate(t *testing.T) {
	ctx := context.Background()
	var gs shimGroups
	gs.join("a")
	gs.join("b")
	if !gs.await(ctx, "a") {
		t.Fatal("the group's first member waits")
	}
	waited := make(chan bool)
	go func() { waited <- gs.await(ctx, "b") }()
	select {
	case <-waited:
		t.Fatal("the second member went ahead of the first member's create")
	case <-time.After(50 * time.Millisecond):
	}
	gs.created("a", true)
	select {
	case ok := <-waited:
		if !ok || !gs.grouped("b") {
			t.Fatal("the second member left its group after the first create succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the second member still waits after the first create")
	}
	if !gs.await(ctx, "b") {
		t.Fatal("await again")
	}
	gs.created("b", true)

	// The first create fails: the others go ungrouped, the group closes.
	var f shimGroups
	g := f.join("c")
	f.join("d")
	go f.created("c", false)
	if f.await(ctx, "d") || f.grouped("d") {
		t.Fatal("a member stayed in a group whose first create failed")
	}
	if f.join("e") == g {
		t.Fatal("a fork joined a group whose first create failed")
	}

	// The first member leaves before its create (its container failed).
	var l shimGroups
	l.join("f")
	l.join("g")
	l.leave(ctx, "f")
	if l.await(ctx, "g") {
		t.Fatal("a member stayed in a group whose first fork left before its create")
	}

	// Waiting ends with the caller's context, out of the group.
	var c shimGroups
	c.join("h")
	c.join("i")
	cctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if c.await(cctx, "i") || c.grouped("i") {
		t.Fatal("a member whose wait ended stayed in its group")
	}
	c.created("h", true)
	c.leave(ctx, "h") // nothing joining any more: returns

	// Groups off: no group at all.
	off := shimGroups{off: true}
	if g := off.join("j"); g != "" || off.grouped("j") {
		t.Fatalf("groups off, fork in group %q", g)
	}
}
