package a11y

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/acierr"
)

// fakeApp builds an application's items as a cache would hold them: a
// frame with a button, an entry and a hidden label.
func fakeApp(bus string) *app {
	a := &app{ref: ref{bus, rootPath}, pid: 42, items: map[objectPath]*item{}}
	add := func(path string, parent objectPath, index int32, role uint32, name string, st uint64, kids ...string) *item {
		it := &item{ref: ref{bus, objectPath(path)}, parent: ref{bus, parent}, index: index, role: role, name: name,
			states: st, count: int32(len(kids)), known: true, ifaces: hasComponent}
		for _, k := range kids {
			it.children = append(it.children, ref{bus, objectPath(k)})
		}
		a.items[it.ref.Path] = it
		return it
	}
	showing := uint64(1<<StateShowing | 1<<StateVisible)
	add(string(rootPath), "", -1, roleApplication, "app", 0, "/w")
	add("/w", rootPath, 0, 23, "Window", showing|1<<StateActive, "/b", "/e", "/h")
	add("/b", "/w", 0, 43, "OK", showing).bounds = &aciv1.Rect{X: 10, Y: 10, Width: 50, Height: 20}
	add("/e", "/w", 1, 79, "Name", showing|1<<StateFocused).bounds = &aciv1.Rect{X: 10, Y: 40, Width: 200, Height: 20}
	add("/h", "/w", 2, 29, "hidden", 0)
	return a
}

func opts() TreeOptions {
	o, err := ValidateTree(&aciv1.A11YTreeRequest{}, "a11y_tree")
	if err != nil {
		panic(err)
	}
	return o
}

func TestBuildDesktopPreorder(t *testing.T) {
	a := fakeApp(":1.5")
	desk := &item{name: "main", role: roleDesktop, known: true, children: []ref{a.ref}}
	r := build(desk, []*app{a}, desk, opts())
	var got []string
	for _, n := range r.Nodes {
		got = append(got, n.Role+":"+n.Name)
	}
	want := "desktop frame:main application:app frame:Window push button:OK entry:Name label:hidden"
	if strings.Join(got, " ") != want {
		t.Fatalf("pre-order %q, want %q", strings.Join(got, " "), want)
	}
	if r.Nodes[1].Ref != ":1.5:/org/a11y/atspi/accessible/root" || r.Nodes[1].App != 1 || r.Apps[0].Node != 1 {
		t.Errorf("app node %v, app %v", r.Nodes[1], r.Apps[0])
	}
	if r.Nodes[3].Window != 2 || r.Nodes[2].Window != 2 || r.Nodes[1].Window != 0 {
		t.Errorf("window ids: %d %d %d", r.Nodes[1].Window, r.Nodes[2].Window, r.Nodes[3].Window)
	}
	if r.Nodes[0].Ref != "" || r.Nodes[0].App != 0 {
		t.Errorf("desktop node has ref %q app %d", r.Nodes[0].Ref, r.Nodes[0].App)
	}
	if len(r.Nodes[2].Children) != 3 || r.Nodes[2].Children[0] != 3 {
		t.Errorf("frame's children %v", r.Nodes[2].Children)
	}
}

func TestBuildLimits(t *testing.T) {
	a := fakeApp(":1.5")
	desk := &item{name: "main", role: roleDesktop, known: true, children: []ref{a.ref}}
	o := opts()
	o.ShowingOnly = true
	if r := build(desk, []*app{a}, desk, o); len(r.Nodes) != 5 || r.Truncated {
		t.Errorf("showing only: %d nodes (truncated %v), want 5 without the hidden label", len(r.Nodes), r.Truncated)
	}
	o = opts()
	o.MaxNodes = 3
	if r := build(desk, []*app{a}, desk, o); len(r.Nodes) != 3 || !r.Truncated || !r.Nodes[2].ChildrenTruncated {
		t.Errorf("max_nodes 3: %d nodes, truncated %v", len(r.Nodes), r.Truncated)
	}
	o = opts()
	o.MaxDepth = 1
	if r := build(desk, []*app{a}, desk, o); len(r.Nodes) != 2 || !r.Truncated {
		t.Errorf("max_depth 1: %d nodes, truncated %v", len(r.Nodes), r.Truncated)
	}
	// A cycle (a hostile application naming its ancestor as a child) ends.
	a.items["/b"].children = []ref{{":1.5", "/w"}}
	a.items["/b"].count, a.items["/b"].known = 1, true
	if r := build(desk, []*app{a}, desk, opts()); len(r.Nodes) != 6 {
		t.Errorf("cycle: %d nodes", len(r.Nodes))
	}
}

func TestBuildPartialApp(t *testing.T) {
	a := fakeApp(":1.5")
	late := &app{ref: ref{":1.9", rootPath}, items: map[objectPath]*item{}, timedOut: true}
	desk := &item{name: "main", role: roleDesktop, known: true, children: []ref{a.ref, late.ref}}
	r := build(desk, []*app{a, late}, desk, opts())
	if !r.Partial || !r.Apps[1].TimedOut {
		t.Fatalf("partial %v, late app %v", r.Partial, r.Apps[1])
	}
	last := r.Nodes[len(r.Nodes)-1]
	if last.Role != "application" || last.App != 2 || r.Apps[1].Node != last.Id {
		t.Errorf("the late app's node: %v (app %v)", last, r.Apps[1])
	}
}

func TestDeepestAt(t *testing.T) {
	a := fakeApp(":1.5")
	w := a.items["/w"]
	w.bounds = &aciv1.Rect{Width: 300, Height: 100}
	if got := deepestAt(w, []*app{a}, 20, 45); got.name != "Name" {
		t.Errorf("at (20,45): %q, want the entry", got.name)
	}
	if got := deepestAt(w, []*app{a}, 250, 90); got != w {
		t.Errorf("at (250,90): %q, want the window", got.name)
	}
}

func TestFinishHash(t *testing.T) {
	a := fakeApp(":1.5")
	desk := &item{name: "main", role: roleDesktop, known: true, children: []ref{a.ref}}
	o := opts()
	r1 := finish(&aciv1.A11YTreeResponse{Bus: true}, build(desk, []*app{a}, desk, o), o, time.Now())
	r2 := finish(&aciv1.A11YTreeResponse{Bus: true}, build(desk, []*app{a}, desk, o), o, time.Now())
	if len(r1.TreeHash) != 16 || string(r1.TreeHash) != string(r2.TreeHash) {
		t.Fatalf("hashes %x %x", r1.TreeHash, r2.TreeHash)
	}
	o.IfNoneMatch = r1.TreeHash
	r3 := finish(&aciv1.A11YTreeResponse{Bus: true}, build(desk, []*app{a}, desk, o), o, time.Now())
	if !r3.NotModified || len(r3.Nodes) != 0 {
		t.Errorf("if_none_match: not_modified %v, %d nodes", r3.NotModified, len(r3.Nodes))
	}
	a.items["/b"].name = "Cancel"
	o.IfNoneMatch = nil
	if r4 := finish(&aciv1.A11YTreeResponse{}, build(desk, []*app{a}, desk, o), o, time.Now()); string(r4.TreeHash) == string(r1.TreeHash) {
		t.Error("a renamed button kept the hash")
	}
}

func TestNoBus(t *testing.T) {
	c := New("")
	r, err := c.Tree(context.Background(), opts(), nil)
	if err != nil || r.Bus || len(r.Nodes) != 1 || r.Nodes[0].Role != "desktop frame" {
		t.Fatalf("no bus: %v %v", r, err)
	}
	o := opts()
	o.Root = aciv1.A11YRoot_A11Y_ROOT_FOCUSED_WINDOW
	if _, err := c.Tree(context.Background(), o, nil); !errors.Is(err, ErrNoBus) {
		t.Errorf("focused window without a bus: %v", err)
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		req   *aciv1.A11YTreeRequest
		field string
	}{
		{&aciv1.A11YTreeRequest{Root: aciv1.A11YRoot_A11Y_ROOT_WINDOW}, "a11y_tree.window_id"},
		{&aciv1.A11YTreeRequest{Root: aciv1.A11YRoot_A11Y_ROOT_POINT}, "a11y_tree.point"},
		{&aciv1.A11YTreeRequest{Root: 99}, "a11y_tree.root"},
		{&aciv1.A11YTreeRequest{MaxNodes: MaxNodes + 1}, "a11y_tree.max_nodes"},
		{&aciv1.A11YTreeRequest{MaxDepth: MaxDepth + 1}, "a11y_tree.max_depth"},
		{&aciv1.A11YTreeRequest{TimeoutMs: 60001}, "a11y_tree.timeout_ms"},
		{&aciv1.A11YTreeRequest{TimeoutMs: 100, AppTimeoutMs: 200}, "a11y_tree.app_timeout_ms"},
		{&aciv1.A11YTreeRequest{IfNoneMatch: []byte{1}}, "a11y_tree.if_none_match"},
		{&aciv1.A11YTreeRequest{Fields: []aciv1.A11YField{0}}, "a11y_tree.fields[0]"},
	} {
		_, err := ValidateTree(tc.req, "a11y_tree")
		var ae *acierr.Error
		if !errors.As(err, &ae) || ae.Code != aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT || ae.Field != tc.field {
			t.Errorf("%v: %v, want INVALID_ARGUMENT on %s", tc.req, err, tc.field)
		}
	}
	o, err := ValidateTree(&aciv1.A11YTreeRequest{TimeoutMs: 500, Fields: []aciv1.A11YField{aciv1.A11YField_A11Y_FIELD_BOUNDS}}, "x")
	if err != nil || o.AppTimeout != 500*time.Millisecond || !o.Fields.Has(aciv1.A11YField_A11Y_FIELD_BOUNDS) || o.Fields.Has(aciv1.A11YField_A11Y_FIELD_TEXT) {
		t.Errorf("options %+v %v", o, err)
	}
	for _, tc := range []struct {
		req   *aciv1.A11YActionRequest
		field string
	}{
		{&aciv1.A11YActionRequest{Ref: "org.x:/a", Kind: 2}, "a11y_action.ref"},
		{&aciv1.A11YActionRequest{Ref: ":1.2", Kind: 2}, "a11y_action.ref"},
		{&aciv1.A11YActionRequest{Ref: ":1.2:/a", Kind: 1}, "a11y_action.action"},
		{&aciv1.A11YActionRequest{Ref: ":1.2:/a"}, "a11y_action.kind"},
		{&aciv1.A11YActionRequest{Ref: ":1.2:/a", Kind: 3, Text: strings.Repeat("x", MaxSetText+1)}, "a11y_action.text"},
	} {
		err := ValidateAction(tc.req)
		var ae *acierr.Error
		if !errors.As(err, &ae) || ae.Field != tc.field {
			t.Errorf("%v: %v, want an error on %s", tc.req, err, tc.field)
		}
	}
	if err := ValidateAction(&aciv1.A11YActionRequest{Ref: ":1.2:/org/a11y/atspi/accessible/7", Kind: 1, Action: "click"}); err != nil {
		t.Error(err)
	}
}

func TestClip(t *testing.T) {
	if s := clip(strings.Repeat("é", maxString)); len(s) > maxString || !strings.HasPrefix(s, "é") || strings.ContainsRune(s, '\uFFFD') {
		t.Errorf("clip cut a rune: %d bytes", len(s))
	}
	if s := clip("a\xffb"); s != "a\uFFFDb" {
		t.Errorf("invalid UTF-8 kept: %q", s)
	}
	if RoleName(43) != "push button" || RoleName(999) != "role 999" {
		t.Errorf("role names %q %q", RoleName(43), RoleName(999))
	}
}

func TestActionNamesMatch(t *testing.T) {
	at := time.Unix(1000, 0)
	n := actionNames{role: 43, states: 1 << StateShowing, names: []string{"press"}, at: at}
	it := &item{role: 43, states: 1 << StateShowing}
	if got, ok := n.match(it, at.Add(time.Second)); !ok || got[0] != "press" {
		t.Fatalf("same role and states: %q %v", got, ok)
	}
	for name, c := range map[string]struct {
		it  *item
		now time.Time
	}{
		"states changed":  {&item{role: 43, states: 1<<StateShowing | 1<<StateFocused}, at},
		"role changed":    {&item{role: 44, states: 1 << StateShowing}, at},
		"too old":         {it, at.Add(namesTTL)},
		"clock went back": {it, at.Add(-time.Second)},
	} {
		if _, ok := n.match(c.it, c.now); ok {
			t.Errorf("%s: names reused", name)
		}
	}
	if _, ok := (actionNames{}).match(it, at); ok {
		t.Error("no entry matched")
	}
}
