package app_test

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/forkfleet/forkfleet/api/aci"
	"github.com/forkfleet/forkfleet/api/aci/pagetest"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	controldv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/controld/v1"
)

// a11yPage places two buttons, a text input, a link and a checkbox at fixed
// CSS positions and shows in its title what was clicked and what the input
// holds.
//
//go:embed testdata/a11y.html
var a11yPage []byte

// a11yControls are a11yPage's controls: role, name and CSS box.
var a11yControls = []struct {
	role, name string
	x, y, w, h int32
}{
	{"push button", "Save draft", 100, 50, 120, 40},
	{"push button", "Cancel", 260, 50, 120, 40},
	{"entry", "Your name", 100, 120, 300, 30},
	{"link", "Get help", 100, 180, 80, 24},
	{"check box", "I agree", 100, 230, 20, 20},
}

// TestRealStackA11y reads the accessibility tree of the web desktop on the
// real stack: guestd's own bus and registry, Chromium with renderer
// accessibility. A test page's controls are in the tree with their roles,
// names and screen bounds (the page's origin plus their CSS boxes), actions
// through a11y_action change what the page sees (SET_TEXT on a web input
// too, which has no EditableText), the focused-window and
// point roots find them, a GTK app (l3afpad) joins the tree, a SIGSTOPped
// app yields a partial tree within its timeout, step.observe_tree with
// if_none_match costs no nodes when nothing changed, and after a live
// checkpoint and a fork the replica's tree equals the source's. Own
// namespace forkfleet-a11y-it (testenv).
func TestRealStackA11y(t *testing.T) {
	s := newWebStackIn(t, "forkfleet-a11y-it")
	web := s.image
	ctx := s.ctx
	cr, err := s.sbc.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{Image: web, WaitReady: true})
	if err != nil {
		t.Fatal(err)
	}
	s.deleteSandboxAtEnd(cr.Sandbox.Id)
	sess, err := aci.Dial(ctx, cr.Endpoint.Url, cr.Endpoint.Token)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if _, err := sess.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sess.PutFile(ctx, "/tmp/a11y.html", a11yPage); err != nil {
		t.Fatal(err)
	}
	if _, err := sess.Step(ctx, []*aciv1.Action{aci.Key("ctrl", "l"), aci.Wait(300 * time.Millisecond),
		aci.Type("file:///tmp/a11y.html"), aci.Key("Return")}, nil); err != nil {
		t.Fatal(err)
	}
	waitTitle(t, ctx, sess, "a11y page", func(title string) bool { return strings.HasPrefix(title, "a11y ready") })

	// The page's controls, as the renderer exposes them once it built its
	// tree (asynchronously after the load).
	var tree *aciv1.A11YTreeResponse
	var found map[string]*aciv1.A11YNode
	deadline := time.Now().Add(30 * time.Second)
	for {
		tree, err = sess.A11yTree(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		found = controls(tree)
		if len(found) == len(a11yControls) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(found) != len(a11yControls) {
		t.Fatalf("the tree has %d of the page's %d controls; tree:\n%s", len(found), len(a11yControls), aci.RenderTree(tree, aci.RenderOptions{}))
	}
	t.Logf("desktop tree: %d nodes, %d apps, %v, %d bytes", len(tree.Nodes), len(tree.Apps), time.Duration(tree.DurationNs), proto.Size(tree))
	doc := docNode(tree)
	if doc == nil || doc.Bounds == nil {
		t.Fatalf("no document web node with bounds; tree:\n%s", aci.RenderTree(tree, aci.RenderOptions{}))
	}
	for _, c := range a11yControls {
		n := found[c.name]
		b := n.GetBounds()
		if b == nil {
			t.Fatalf("%s %q has no bounds", c.role, c.name)
		}
		if x, y := b.X-doc.Bounds.X, b.Y-doc.Bounds.Y; abs(x-c.x) > 1 || abs(y-c.y) > 1 || abs(b.Width-c.w) > 1 || abs(b.Height-c.h) > 1 {
			t.Errorf("%s %q at %d,%d %dx%d in the page, the page lays it out at %d,%d %dx%d (page origin %d,%d)",
				c.role, c.name, x, y, b.Width, b.Height, c.x, c.y, c.w, c.h, doc.Bounds.X, doc.Bounds.Y)
		}
		if !aci.HasState(n, aci.StateShowing) {
			t.Errorf("%s %q is not showing: %v", c.role, c.name, aci.States(n))
		}
	}
	t.Logf("rendered:\n%s", aci.RenderTree(tree, aci.RenderOptions{}))
	// Actions reach the page.
	if err := sess.A11yAction(ctx, aci.DoAction(found["Save draft"].Ref, firstAction(found["Save draft"]))); err != nil {
		t.Fatalf("click Save draft: %v", err)
	}
	waitTitle(t, ctx, sess, "save clicked", func(title string) bool { return strings.HasPrefix(title, "a11y save [") })
	if err := sess.A11yAction(ctx, aci.Focus(found["Your name"].Ref)); err != nil {
		t.Fatalf("focus the input: %v", err)
	}
	if _, err := sess.Step(ctx, []*aciv1.Action{aci.Type("Ada")}, nil); err != nil {
		t.Fatal(err)
	}
	waitTitle(t, ctx, sess, "typed into the focused input", func(title string) bool { return strings.HasPrefix(title, "a11y save [Ada]") })
	if err := sess.A11yAction(ctx, aci.DoAction(found["Get help"].Ref, firstAction(found["Get help"]))); err != nil {
		t.Fatalf("jump the link: %v", err)
	}
	waitTitle(t, ctx, sess, "link followed", func(title string) bool { return strings.HasPrefix(title, "a11y help [Ada]") })
	// Typed errors: a gone element, an action it lacks.
	if err := sess.A11yAction(ctx, aci.DoAction(found["Save draft"].Ref, "no-such-action")); !errors.Is(err, aci.ErrFailedPrecondition) {
		t.Errorf("unknown action: %v, want FAILED_PRECONDITION", err)
	}
	gone := found["Save draft"].Ref[:strings.Index(found["Save draft"].Ref, ":/")] + ":/org/a11y/atspi/accessible/no_such_object"
	if err := sess.A11yAction(ctx, aci.Focus(gone)); !errors.Is(err, aci.ErrNotFound) {
		t.Errorf("gone element: %v, want NOT_FOUND", err)
	}

	// The input's text is in the tree; the focused window's tree has the
	// page and is smaller than the desktop's; the point root finds the
	// button under it.
	tree = waitTree(t, ctx, sess, &aciv1.A11YTreeRequest{Root: aciv1.A11YRoot_A11Y_ROOT_FOCUSED_WINDOW}, func(tr *aciv1.A11YTreeResponse) bool {
		n := controls(tr)["Your name"]
		return n != nil && n.Text == "Ada"
	})
	if tree.Nodes[0].Role != "frame" {
		t.Errorf("focused window root is a %q, want the browser's frame", tree.Nodes[0].Role)
	}
	save := controls(tree)["Save draft"]
	at, err := sess.A11yTree(ctx, &aciv1.A11YTreeRequest{Root: aciv1.A11YRoot_A11Y_ROOT_POINT,
		Point: &aciv1.Point{X: save.Bounds.X + 10, Y: save.Bounds.Y + 10}})
	if err != nil {
		t.Fatal(err)
	}
	if at.Nodes[0].Name != "Save draft" {
		t.Errorf("element at the button's point: %s %q, want the button", at.Nodes[0].Role, at.Nodes[0].Name)
	}

	// SET_TEXT on a web input (Text without EditableText): focused, its
	// content selected and replaced by typing; the page sees input events.
	// A button is not editable: a typed error.
	if err := sess.A11yAction(ctx, aci.SetText(found["Your name"].Ref, "Grace Hopper ü")); err != nil {
		t.Fatalf("set the input's text: %v", err)
	}
	waitTitle(t, ctx, sess, "text set", func(title string) bool { return strings.HasPrefix(title, "a11y help [Grace Hopper ü]") })
	if err := sess.A11yAction(ctx, aci.SetText(found["Save draft"].Ref, "x")); !errors.Is(err, aci.ErrFailedPrecondition) {
		t.Errorf("set a button's text: %v, want FAILED_PRECONDITION", err)
	}

	// A tree unchanged since the last costs no nodes (step.observe_tree).
	// The page's part: the browser's own widgets change their names on
	// their own (a tab's name carries the page's memory use).
	pageReq := &aciv1.A11YTreeRequest{Root: aciv1.A11YRoot_A11Y_ROOT_POINT,
		Point: &aciv1.Point{X: save.Bounds.X + 600, Y: save.Bounds.Y + 400}}
	full, err := sess.StepRequest(ctx, &aciv1.StepRequest{ObserveTree: pageReq})
	if err != nil || full.Tree == nil {
		t.Fatalf("step.observe_tree: %v %v", err, full.GetTreeError())
	}
	if full.Tree.Nodes[0].Role != "document web" || len(controls(full.Tree)) != len(a11yControls) {
		t.Fatalf("the page's tree at a point of its background: root %s %q, %d controls", full.Tree.Nodes[0].Role, full.Tree.Nodes[0].Name, len(controls(full.Tree)))
	}
	pageReq.IfNoneMatch = full.Tree.TreeHash
	same, err := sess.StepRequest(ctx, &aciv1.StepRequest{ObserveTree: pageReq})
	if err != nil || same.Tree == nil {
		t.Fatalf("step.observe_tree: %v %v", err, same.GetTreeError())
	}
	if !same.Tree.NotModified || len(same.Tree.Nodes) != 0 {
		t.Errorf("unchanged tree: not_modified %v with %d nodes: %s", same.Tree.NotModified, len(same.Tree.Nodes), treeDiff(full.Tree, same.Tree))
	}

	// A GTK app joins the tree; stopped, it costs its timeout and leaves a
	// partial tree with the browser's part whole.
	pid, err := sess.Launch(ctx, &aciv1.LaunchRequest{Argv: []string{"/usr/bin/l3afpad"}})
	if err != nil {
		t.Fatal(err)
	}
	waitTree(t, ctx, sess, nil, func(tr *aciv1.A11YTreeResponse) bool {
		for _, a := range tr.Apps {
			if a.Name == "l3afpad" && a.Node != 0 && len(tr.Nodes[a.Node].Children) > 0 {
				return true
			}
		}
		return false
	})
	if r, err := sess.Run(ctx, "kill", "-STOP", strconv.Itoa(pid)); err != nil || r.ExitCode != 0 {
		t.Fatalf("SIGSTOP l3afpad: %v %s", err, r.GetStderr())
	}
	t0 := time.Now()
	// The browser's part takes a few hundred ms on a loaded 2-core machine:
	// its application gets the same timeout as the stopped one.
	partial, err := sess.A11yTree(ctx, &aciv1.A11YTreeRequest{AppTimeoutMs: 3000, TimeoutMs: 10000})
	took := time.Since(t0)
	if err != nil {
		t.Fatalf("tree with a stopped app: %v", err)
	}
	var stopped *aciv1.A11YApp
	for _, a := range partial.Apps {
		if a.Pid == int32(pid) {
			stopped = a
		}
	}
	if !partial.Partial || stopped == nil || !stopped.TimedOut {
		t.Fatalf("tree with l3afpad stopped: partial %v, its app %v", partial.Partial, stopped)
	}
	if len(controls(partial)) != len(a11yControls) {
		t.Errorf("the browser's part lost controls while l3afpad was stopped: %d", len(controls(partial)))
	}
	if took > 10*time.Second {
		t.Errorf("a stopped app held the tree %v, past the call's timeout", took)
	}
	t.Logf("stopped app: tree in %v with app_timeout 3 s", took)
	if r, err := sess.Run(ctx, "kill", "-KILL", strconv.Itoa(pid)); err != nil || r.ExitCode != 0 {
		t.Fatalf("SIGKILL l3afpad: %v %s", err, r.GetStderr())
	}
	// The window manager hands the browser's window back its active state a
	// moment after l3afpad's is gone: the replica must match the settled
	// tree (two reads in a row alike), not one from before that.
	var prev *aciv1.A11YTreeResponse
	before := waitTree(t, ctx, sess, nil, func(tr *aciv1.A11YTreeResponse) bool {
		settled := len(tr.Apps) == 1 && !tr.Partial && prev != nil && treeDiff(prev, tr) == ""
		prev = tr
		return settled
	})
	sess.Close()

	// A replica's tree equals the source's.
	rs := s.forkOne(cr.Sandbox.Id)
	after, err := rs.A11yTree(ctx, nil)
	if err != nil {
		t.Fatalf("replica's tree: %v", err)
	}
	if d := treeDiff(before, after); d != "" {
		t.Fatalf("the replica's tree differs from the source's: %s", d)
	}
	t.Logf("replica's tree equals the source's: %d nodes, hash %x", len(after.Nodes), after.TreeHash)
}

// controls maps the page's controls found in tr by name.
func controls(tr *aciv1.A11YTreeResponse) map[string]*aciv1.A11YNode {
	out := map[string]*aciv1.A11YNode{}
	for _, c := range a11yControls {
		for _, n := range tr.GetNodes() {
			if n.Role == c.role && n.Name == c.name {
				out[c.name] = n
			}
		}
	}
	return out
}

func docNode(tr *aciv1.A11YTreeResponse) *aciv1.A11YNode {
	for _, n := range tr.GetNodes() {
		if n.Role == "document web" && strings.HasPrefix(n.Name, "a11y") {
			return n
		}
	}
	return nil
}

func firstAction(n *aciv1.A11YNode) string {
	if len(n.Actions) == 0 {
		return ""
	}
	return n.Actions[0]
}

func waitTree(t *testing.T, ctx context.Context, sess *aci.Session, req *aciv1.A11YTreeRequest, ok func(*aciv1.A11YTreeResponse) bool) *aciv1.A11YTreeResponse {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		tr, err := sess.A11yTree(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if ok(tr) {
			return tr
		}
		if time.Now().After(deadline) {
			t.Fatalf("tree never matched in 30 s; last:\n%s", aci.RenderTree(tr, aci.RenderOptions{All: true}))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// treeDiff describes the first difference of two trees (nodes and apps),
// "" when they are equal.
func treeDiff(a, b *aciv1.A11YTreeResponse) string {
	if len(a.Nodes) != len(b.Nodes) {
		return fmt.Sprintf("%d nodes, the source had %d:\n%s\nsource:\n%s", len(b.Nodes), len(a.Nodes),
			aci.RenderTree(b, aci.RenderOptions{All: true}), aci.RenderTree(a, aci.RenderOptions{All: true}))
	}
	for i := range a.Nodes {
		if x, y := a.Nodes[i], b.Nodes[i]; x.Role == "page tab" && y.Role == "page tab" {
			// A tab's name carries the page's memory use, which Chromium
			// updates on a timer: compare the rest.
			x, y = proto.Clone(x).(*aciv1.A11YNode), proto.Clone(y).(*aciv1.A11YNode)
			x.Name, y.Name = "", ""
			if !proto.Equal(x, y) {
				return fmt.Sprintf("node %d: %v, the source's %v", i, b.Nodes[i], a.Nodes[i])
			}
			continue
		}
		if !proto.Equal(a.Nodes[i], b.Nodes[i]) {
			return fmt.Sprintf("node %d: %v, the source's %v", i, b.Nodes[i], a.Nodes[i])
		}
	}
	for i := range a.Apps {
		if !proto.Equal(a.Apps[i], b.Apps[i]) {
			return fmt.Sprintf("app %d: %v, the source's %v", i, b.Apps[i], a.Apps[i])
		}
	}
	return ""
}

func abs(v int32) int32 {
	if v < 0 {
		return -v
	}
	return v
}

// TestRealStackA11ySlimDesktop: the slim desktop has no accessibility bus
// (xterm exposes nothing, openbox nothing): its tree is the bare desktop
// node, flagged, and the roots that need an application are UNAVAILABLE.
// Own namespace forkfleet-a11y-slim-it (testenv).
func TestRealStackA11ySlimDesktop(t *testing.T) {
	s := newStackIn(t, "forkfleet-a11y-slim-it")
	s.launch(0)
	ctx := s.ctx
	cr, err := s.sbc.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{WaitReady: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.sbc.DeleteSandbox(context.Background(), &controldv1.DeleteSandboxRequest{Id: cr.Sandbox.Id}) })
	sess, err := aci.Dial(ctx, cr.Endpoint.Url, cr.Endpoint.Token)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	tree, err := sess.A11yTree(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tree.Bus || len(tree.Nodes) != 1 || tree.Nodes[0].Role != "desktop frame" || len(tree.TreeHash) != 16 {
		t.Fatalf("slim desktop's tree: bus %v, nodes %v", tree.Bus, tree.Nodes)
	}
	if _, err := sess.A11yTree(ctx, &aciv1.A11YTreeRequest{Root: aciv1.A11YRoot_A11Y_ROOT_FOCUSED_WINDOW}); !errors.Is(err, aci.ErrUnavailable) {
		t.Errorf("focused window without a bus: %v, want UNAVAILABLE", err)
	}
}

// TestRealStackA11yCache: guestd's tree cache (kept current by AT-SPI
// events) on a page that changes all the time. pagetest.Counter counts
// every 50 ms into a text node and the document's title (the document
// web node's name): each tree shows a later count than the one before, its
// title's count and its text's agree, typed text shows, and after a live
// checkpoint and a fork the replica's first tree is as current. Own
// namespace forkfleet-a11y-cache-it (testenv).
func TestRealStackA11yCache(t *testing.T) {
	s := newWebStackIn(t, "forkfleet-a11y-cache-it")
	web := s.image
	ctx := s.ctx
	cr, err := s.sbc.CreateSandbox(ctx, &controldv1.CreateSandboxRequest{Image: web, WaitReady: true})
	if err != nil {
		t.Fatal(err)
	}
	s.deleteSandboxAtEnd(cr.Sandbox.Id)
	sess, err := aci.Dial(ctx, cr.Endpoint.Url, cr.Endpoint.Token)
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if _, err := sess.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pagetest.Open(ctx, sess, pagetest.CounterPath, pagetest.Counter); err != nil {
		t.Fatal(err)
	}
	waitTitle(t, ctx, sess, "counter page", func(title string) bool { return strings.HasPrefix(title, "counter ") })

	// The trees show later and later counts (the text node's name changes
	// with an event the cache follows; the browser sends the page's
	// changes a few times a second, later on a loaded host), and in each
	// the text agrees with the title, within the ticks a tree takes to
	// read: a stale element would fall behind for good.
	last := -1
	for i := 0; i < 8; i++ {
		tr := waitTree(t, ctx, sess, nil, func(tr *aciv1.A11YTreeResponse) bool {
			text, _, ok := counts(tr)
			return ok && text > last
		})
		text, title, _ := counts(tr)
		if d := text - title; d < -20 || d > 20 {
			t.Fatalf("tree %d: the text shows %d, the title %d (read %v)", i, text, title, time.Duration(tr.DurationNs))
		}
		t.Logf("tree %d: count %d (title %d), %d nodes in %v", i, text, title, len(tr.Nodes), time.Duration(tr.DurationNs))
		last = text
		time.Sleep(250 * time.Millisecond)
	}

	// Typed text: the input's text and the title that carries it.
	if _, err := sess.Step(ctx, []*aciv1.Action{aci.Type("Ada")}, nil); err != nil {
		t.Fatal(err)
	}
	typed := waitTree(t, ctx, sess, nil, func(tr *aciv1.A11YTreeResponse) bool {
		d := counterDoc(tr)
		return d != nil && strings.HasSuffix(d.Name, " Ada")
	})
	if in := entryText(typed); in != "Ada" {
		t.Fatalf("the title says Ada was typed, the input's text is %q", in)
	}
	text, _, _ := counts(typed)

	// The replica's first tree is as current: the cache came with guestd,
	// the events in flight with the bus.
	rs := s.forkOne(cr.Sandbox.Id)
	first, err := rs.A11yTree(ctx, nil)
	if err != nil {
		t.Fatalf("replica's tree: %v", err)
	}
	rtext, rtitle, ok := counts(first)
	if !ok || rtext < text || rtext-rtitle < -20 || rtext-rtitle > 20 || entryText(first) != "Ada" {
		t.Fatalf("replica's first tree: count %d (title %d, source %d before the checkpoint), input %q; tree:\n%s",
			rtext, rtitle, text, entryText(first), aci.RenderTree(first, aci.RenderOptions{}))
	}
	t.Logf("replica's first tree: count %d (title %d), source's %d before the checkpoint", rtext, rtitle, text)
}

// counterDoc is the counter page's document node.
func counterDoc(tr *aciv1.A11YTreeResponse) *aciv1.A11YNode {
	for _, n := range tr.GetNodes() {
		if n.Role == "document web" && strings.HasPrefix(n.Name, "counter ") {
			return n
		}
	}
	return nil
}

// counts reads the counter page's count from its text node (the page's
// only all-digit text) and from its title, in one tree.
func counts(tr *aciv1.A11YTreeResponse) (text, title int, ok bool) {
	d := counterDoc(tr)
	if d == nil {
		return 0, 0, false
	}
	f := strings.Fields(d.Name)
	title, err := strconv.Atoi(f[1])
	if err != nil {
		return 0, 0, false
	}
	text = -1
	for _, n := range tr.GetNodes() {
		if v, err := strconv.Atoi(n.Name); err == nil && n.Role == "static" && n.Window == d.Window {
			text = v
		}
	}
	return text, title, text >= 0
}

// entryText is the text of the counter page's input (an entry under its
// document; the browser's address bar is one too).
func entryText(tr *aciv1.A11YTreeResponse) string {
	d := counterDoc(tr)
	if d == nil {
		return ""
	}
	for todo := []uint32{d.Id}; len(todo) > 0; todo = todo[1:] {
		n := tr.Nodes[todo[0]]
		if n.Role == "entry" {
			return n.Text
		}
		todo = append(todo, n.Children...)
	}
	return ""
}
