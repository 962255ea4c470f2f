package acitest

import (
	"errors"

	"google.golang.org/protobuf/proto"

	"github.com/forkfleet/forkfleet/api/aci/a11yrules"
	"github.com/forkfleet/forkfleet/api/errdefs"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// AT-SPI state bits the fake's tree uses (api/aci/wire.A11yStates names them).
const (
	stActive    = 1
	stEditable  = 7
	stEnabled   = 8
	stFocusable = 11
	stFocused   = 12
	stSensitive = 24
	stShowing   = 25
	stVisible   = 30
)

func bits(states ...int) uint64 {
	var b uint64
	for _, s := range states {
		b |= 1 << s
	}
	return b
}

// SampleA11yTree is the fake's accessibility tree until SetA11yTree: the
// desktop with one application showing the fake's window ("xterm", pid 42):
// a button, an editable entry, a slider and a label that is not showing.
func SampleA11yTree() *aciv1.A11YTreeResponse {
	const bus = ":1.2"
	shown := bits(stEnabled, stSensitive, stShowing, stVisible)
	n := func(id uint32, role, name, path string, kids ...uint32) *aciv1.A11YNode {
		return &aciv1.A11YNode{Id: id, Role: role, Name: name, Ref: bus + ":" + path, App: 1, Window: 2, Children: kids}
	}
	desk := &aciv1.A11YNode{Id: 0, Role: "desktop frame", Name: "main", Children: []uint32{1}}
	app := n(1, "application", "xterm", "/org/a11y/atspi/accessible/root", 2)
	app.Window = 0
	frame := n(2, "frame", "xterm", "/org/a11y/atspi/accessible/1", 3, 4, 5, 6)
	frame.States, frame.Bounds = shown|bits(stActive), &aciv1.Rect{X: 10, Y: 10, Width: 640, Height: 480}
	ok := n(3, "push button", "OK", "/org/a11y/atspi/accessible/2")
	ok.States, ok.Bounds, ok.Actions = shown|bits(stFocusable), &aciv1.Rect{X: 20, Y: 20, Width: 80, Height: 30}, []string{"press"}
	entry := n(4, "entry", "Name", "/org/a11y/atspi/accessible/3")
	entry.States, entry.Bounds, entry.Actions = shown|bits(stFocusable, stEditable), &aciv1.Rect{X: 20, Y: 60, Width: 200, Height: 24}, []string{"activate"}
	slider := n(5, "slider", "Volume", "/org/a11y/atspi/accessible/4")
	half := 0.5
	slider.States, slider.Bounds, slider.Value = shown|bits(stFocusable), &aciv1.Rect{X: 20, Y: 100, Width: 200, Height: 20}, &half
	hidden := n(6, "label", "hidden", "/org/a11y/atspi/accessible/5")
	hidden.States = bits(stEnabled, stSensitive)
	return &aciv1.A11YTreeResponse{Bus: true, Nodes: []*aciv1.A11YNode{desk, app, frame, ok, entry, slider, hidden},
		Apps: []*aciv1.A11YApp{{BusName: bus, Pid: 42, Name: "xterm", Node: 1}}}
}

// SetA11yTree replaces the fake's accessibility tree: the whole desktop in
// pre-order, ids its indexes, as guestd answers a desktop root.
func (s *Server) SetA11yTree(t *aciv1.A11YTreeResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.a11y = proto.CloneOf(t)
}

// fieldError types a rule's error (a11yrules) as the ACI's INVALID_ARGUMENT.
func fieldError(err error) *aciv1.Error {
	var fe *errdefs.FieldError
	if errors.As(err, &fe) {
		return &aciv1.Error{Code: aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, Message: fe.Reason, Field: fe.Field}
	}
	return &aciv1.Error{Code: aciv1.ErrorCode_ERROR_CODE_INVALID_ARGUMENT, Message: err.Error()}
}

// a11yTree answers a tree request from the fake's tree with guestd's rules:
// validation, roots, max_depth, max_nodes, showing_only, fields and the
// tree hash (a11yrules).
func (s *Server) a11yTree(r *aciv1.A11YTreeRequest, field string) (*aciv1.A11YTreeResponse, *aciv1.Error) {
	o, err := a11yrules.ValidateTree(r, field)
	if err != nil {
		return nil, fieldError(err)
	}
	s.mu.Lock()
	full := proto.CloneOf(s.a11y)
	s.mu.Unlock()
	nodes := full.GetNodes()
	if len(nodes) == 0 {
		return &aciv1.A11YTreeResponse{Bus: full.GetBus()}, nil
	}
	root := nodes[0]
	notFound := func(f, msg string) *aciv1.Error {
		return &aciv1.Error{Code: aciv1.ErrorCode_ERROR_CODE_NOT_FOUND, Message: msg, Field: f}
	}
	switch o.Root {
	case aciv1.A11YRoot_A11Y_ROOT_FOCUSED_WINDOW:
		root = nil
		for _, n := range nodes {
			if n.GetWindow() == n.GetId() && n.GetWindow() != 0 && n.GetStates()&bits(stActive) != 0 {
				root = n
				break
			}
		}
		if root == nil {
			return nil, notFound("", "no window holds the focus")
		}
	case aciv1.A11YRoot_A11Y_ROOT_WINDOW:
		// The fake's one X window (list_windows) is the top-level named
		// like its title.
		root = nil
		for _, n := range nodes {
			if o.WindowID == 0x400001 && n.GetWindow() == n.GetId() && n.GetWindow() != 0 && n.GetName() == "xterm" {
				root = n
				break
			}
		}
		if root == nil {
			return nil, notFound(field+".window_id", "no window with an accessible application")
		}
	case aciv1.A11YRoot_A11Y_ROOT_POINT:
		// The window at the point, then its deepest showing element
		// holding the point; later siblings are drawn above.
		holds := func(n *aciv1.A11YNode) bool {
			b := n.GetBounds()
			return b != nil && n.GetStates()&bits(stShowing) != 0 && o.X >= int(b.GetX()) && o.Y >= int(b.GetY()) &&
				o.X < int(b.GetX()+b.GetWidth()) && o.Y < int(b.GetY()+b.GetHeight())
		}
		root = nil
		for _, n := range nodes {
			if n.GetWindow() == n.GetId() && n.GetWindow() != 0 && holds(n) {
				root = n
			}
		}
		if root == nil {
			return nil, notFound(field+".point", "no window at the point")
		}
		for {
			var next *aciv1.A11YNode
			for _, c := range root.GetChildren() {
				if int(c) >= len(nodes) {
					continue
				}
				if holds(nodes[c]) {
					next = nodes[c]
				}
			}
			if next == nil {
				break
			}
			root = next
		}
	}
	out := &aciv1.A11YTreeResponse{Bus: full.GetBus(), Partial: full.GetPartial(), Apps: full.GetApps()}
	newID := map[uint32]uint32{}
	var walk func(n *aciv1.A11YNode, depth int) uint32
	walk = func(n *aciv1.A11YNode, depth int) uint32 {
		c := proto.CloneOf(n)
		c.Id, c.Children = uint32(len(out.Nodes)), nil
		newID[n.GetId()] = c.Id
		if !o.Fields.Has(aciv1.A11YField_A11Y_FIELD_BOUNDS) {
			c.Bounds = nil
		}
		if !o.Fields.Has(aciv1.A11YField_A11Y_FIELD_STATES) {
			c.States = 0
		}
		if !o.Fields.Has(aciv1.A11YField_A11Y_FIELD_DESCRIPTION) {
			c.Description = ""
		}
		if !o.Fields.Has(aciv1.A11YField_A11Y_FIELD_TEXT) {
			c.Text = ""
		}
		if !o.Fields.Has(aciv1.A11YField_A11Y_FIELD_VALUE) {
			c.Value = nil
		}
		if !o.Fields.Has(aciv1.A11YField_A11Y_FIELD_ACTIONS) {
			c.Actions = nil
		}
		out.Nodes = append(out.Nodes, c)
		for _, k := range n.GetChildren() {
			if int(k) >= len(nodes) || int(k) <= int(n.GetId()) {
				continue // not a child in pre-order
			}
			ch := nodes[k]
			if o.ShowingOnly && ch.GetRole() != "application" && ch.GetStates()&bits(stShowing) == 0 {
				continue
			}
			if depth >= o.MaxDepth || len(out.Nodes) >= o.MaxNodes {
				c.ChildrenTruncated, out.Truncated = true, true
				break
			}
			c.Children = append(c.Children, walk(ch, depth+1))
		}
		return c.Id
	}
	walk(root, 0)
	for _, n := range out.Nodes {
		n.Window = newID[n.GetWindow()] // 0 when its window is not in the reply
	}
	for _, a := range out.Apps {
		a.Node = newID[a.GetNode()]
	}
	a11yrules.Finish(out, o.IfNoneMatch)
	return out, nil
}

// a11yAction acts on the fake's tree with guestd's rules: validation, an
// unknown element NOT_FOUND, an action or interface it lacks
// FAILED_PRECONDITION; SET_TEXT, FOCUS and SET_VALUE change the tree.
func (s *Server) a11yAction(r *aciv1.A11YActionRequest) *aciv1.Error {
	if err := a11yrules.ValidateAction(r); err != nil {
		return fieldError(err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var target *aciv1.A11YNode
	for _, n := range s.a11y.GetNodes() {
		if n.GetRef() == r.GetRef() {
			target = n
		}
	}
	if target == nil {
		return &aciv1.Error{Code: aciv1.ErrorCode_ERROR_CODE_NOT_FOUND, Message: "element " + r.GetRef() + " is gone", Field: "a11y_action.ref"}
	}
	refuse := func(field, msg string) *aciv1.Error {
		return &aciv1.Error{Code: aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, Message: "element " + r.GetRef() + " " + msg, Field: field}
	}
	switch r.GetKind() {
	case aciv1.A11YActionKind_A11Y_ACTION_KIND_DO:
		found := false
		for _, a := range target.GetActions() {
			found = found || a == r.GetAction()
		}
		if !found {
			return refuse("a11y_action.action", "has no action "+r.GetAction())
		}
	case aciv1.A11YActionKind_A11Y_ACTION_KIND_FOCUS:
		if target.GetStates()&bits(stFocusable) == 0 {
			return refuse("a11y_action.kind", "refused FOCUS")
		}
		for _, n := range s.a11y.GetNodes() {
			n.States &^= bits(stFocused)
		}
		target.States |= bits(stFocused)
	case aciv1.A11YActionKind_A11Y_ACTION_KIND_SET_TEXT:
		if target.GetStates()&bits(stEditable) == 0 {
			return refuse("a11y_action.ref", "is not editable")
		}
		target.Text = r.GetText()
	case aciv1.A11YActionKind_A11Y_ACTION_KIND_SET_VALUE:
		if target.Value == nil {
			return refuse("a11y_action.kind", "has no value")
		}
		v := r.GetValue()
		target.Value = &v
	}
	return nil
}
