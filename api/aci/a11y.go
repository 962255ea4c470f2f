package aci

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/forkfleet/forkfleet/api/aci/wire"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// A11yTree reads the accessibility tree (capability "a11y"). A tree whose
// applications did not all answer in time comes back with Partial set and
// the late ones marked in Apps, not as an error.
func (s *Session) A11yTree(ctx context.Context, req *aciv1.A11YTreeRequest) (*aciv1.A11YTreeResponse, error) {
	if req == nil {
		req = &aciv1.A11YTreeRequest{}
	}
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_A11YTree{A11YTree: req}})
	if err != nil {
		return nil, err
	}
	if r := m.GetA11YTree(); r != nil {
		return r, checkTree(r)
	}
	return nil, unexpected("a11y_tree", m)
}

// A11yAction acts on one element (A11yNode.Ref): Do, Focus, SetText,
// SetValue and ScrollIntoView build the request.
func (s *Session) A11yAction(ctx context.Context, req *aciv1.A11YActionRequest) error {
	m, err := s.Do(ctx, &aciv1.ClientMessage{Request: &aciv1.ClientMessage_A11YAction{A11YAction: req}})
	if err != nil {
		return err
	}
	if m.GetA11YAction() == nil {
		return unexpected("a11y_action", m)
	}
	return nil
}

// DoAction does the element's action named name ("click", "press",
// "activate", "jump": one of its A11yNode.Actions).
func DoAction(ref, name string) *aciv1.A11YActionRequest {
	return &aciv1.A11YActionRequest{Ref: ref, Kind: aciv1.A11YActionKind_A11Y_ACTION_KIND_DO, Action: name}
}

// Focus gives the element the keyboard focus.
func Focus(ref string) *aciv1.A11YActionRequest {
	return &aciv1.A11YActionRequest{Ref: ref, Kind: aciv1.A11YActionKind_A11Y_ACTION_KIND_FOCUS}
}

// SetText replaces an editable element's text.
func SetText(ref, text string) *aciv1.A11YActionRequest {
	return &aciv1.A11YActionRequest{Ref: ref, Kind: aciv1.A11YActionKind_A11Y_ACTION_KIND_SET_TEXT, Text: text}
}

// SetValue sets a range element's value.
func SetValue(ref string, v float64) *aciv1.A11YActionRequest {
	return &aciv1.A11YActionRequest{Ref: ref, Kind: aciv1.A11YActionKind_A11Y_ACTION_KIND_SET_VALUE, Value: v}
}

// ScrollIntoView scrolls the element's ancestors until it is on screen.
func ScrollIntoView(ref string) *aciv1.A11YActionRequest {
	return &aciv1.A11YActionRequest{Ref: ref, Kind: aciv1.A11YActionKind_A11Y_ACTION_KIND_SCROLL_INTO_VIEW}
}

// checkTree refuses a tree whose ids do not index its nodes (a hostile or
// broken guestd): every id is its position, every child id points past its
// parent (pre-order) and inside the reply, so walking it never loops or
// reads out of range.
func checkTree(r *aciv1.A11YTreeResponse) error {
	nodes := r.GetNodes()
	for i, n := range nodes {
		if n.GetId() != uint32(i) {
			return fmt.Errorf("%w: a11y_tree: node %d has id %d", ErrProtocol, i, n.GetId())
		}
		for _, c := range n.GetChildren() {
			if int(c) <= i || int(c) >= len(nodes) {
				return fmt.Errorf("%w: a11y_tree: node %d has child %d of %d nodes", ErrProtocol, i, c, len(nodes))
			}
		}
		if a := n.GetApp(); a > uint32(len(r.GetApps())) {
			return fmt.Errorf("%w: a11y_tree: node %d names app %d of %d", ErrProtocol, i, a, len(r.GetApps()))
		}
	}
	return nil
}

// StateNames are the AT-SPI state names, by bit of A11yNode.States.
var StateNames = wire.A11yStates

// AT-SPI state bits of A11yNode.States.
const (
	StateActive    = 1
	StateChecked   = 4
	StateEditable  = 7
	StateEnabled   = 8
	StateFocusable = 11
	StateFocused   = 12
	StateSelected  = 23
	StateSensitive = 24
	StateShowing   = 25
	StateVisible   = 30
)

// HasState reports whether n has AT-SPI state bit.
func HasState(n *aciv1.A11YNode, bit int) bool { return n.GetStates()&(1<<bit) != 0 }

// States names n's states.
func States(n *aciv1.A11YNode) []string {
	var out []string
	for i := range 64 {
		if HasState(n, i) {
			if i < len(StateNames) {
				out = append(out, StateNames[i])
			} else {
				out = append(out, "state "+strconv.Itoa(i))
			}
		}
	}
	return out
}

// RenderOptions shape RenderTree's text.
type RenderOptions struct {
	// Unnamed leaves a model cannot act on are left out unless All
	// (they are most of a web page's tree and say nothing).
	All bool
	// MaxLineBytes cuts long names (0: 120).
	MaxLineBytes int
}

// RenderTree renders a tree compactly for a prompt: one element a line,
// indented by depth, "role "name" @x,y wxh" plus the states an agent acts
// on (focused, checked, selected, disabled) and its value or text:
//
//	[3] push button "Submit" @540,310 120x32 focused
//
// The number in brackets is the node id, for the caller to map back to
// A11yNode.Ref.
func RenderTree(r *aciv1.A11YTreeResponse, o RenderOptions) string {
	nodes := r.GetNodes()
	if len(nodes) == 0 {
		return ""
	}
	if o.MaxLineBytes <= 0 {
		o.MaxLineBytes = 120
	}
	var b strings.Builder
	// Iterative pre-order walk; checkTree made ids safe to follow.
	type frame struct {
		id    uint32
		depth int
	}
	stack := []frame{{0, 0}}
	for len(stack) > 0 {
		f := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if int(f.id) >= len(nodes) {
			continue
		}
		n := nodes[f.id]
		depth := f.depth
		if o.All || keep(n) {
			renderLine(&b, n, depth, o.MaxLineBytes)
			depth++
		}
		kids := n.GetChildren()
		for i := len(kids) - 1; i >= 0; i-- {
			if kids[i] > f.id {
				stack = append(stack, frame{kids[i], depth})
			}
		}
	}
	return b.String()
}

// keep: named elements, anything with an action, value or text, and the
// windows and applications that give the lines their context.
func keep(n *aciv1.A11YNode) bool {
	switch n.GetRole() {
	case "desktop frame", "application", "frame", "window", "dialog":
		return true
	}
	return n.GetName() != "" || len(n.GetActions()) > 0 || n.GetText() != "" || n.Value != nil
}

func renderLine(b *strings.Builder, n *aciv1.A11YNode, depth, maxBytes int) {
	b.WriteString(strings.Repeat("  ", min(depth, 40)))
	fmt.Fprintf(b, "[%d] %s", n.GetId(), n.GetRole())
	if name := n.GetName(); name != "" {
		b.WriteString(" " + strconv.Quote(cut(name, maxBytes)))
	}
	if r := n.GetBounds(); r != nil {
		fmt.Fprintf(b, " @%d,%d %dx%d", r.GetX(), r.GetY(), r.GetWidth(), r.GetHeight())
	}
	for _, s := range []struct {
		bit  int
		name string
	}{{StateFocused, "focused"}, {StateChecked, "checked"}, {StateSelected, "selected"}} {
		if HasState(n, s.bit) {
			b.WriteString(" " + s.name)
		}
	}
	if n.GetStates() != 0 && !HasState(n, StateEnabled) && !HasState(n, StateSensitive) && len(n.GetActions()) > 0 {
		b.WriteString(" disabled")
	}
	if n.Value != nil {
		b.WriteString(" value=" + strconv.FormatFloat(n.GetValue(), 'g', -1, 64))
	}
	if t := n.GetText(); t != "" {
		b.WriteString(" text=" + strconv.Quote(cut(t, maxBytes)))
	}
	b.WriteByte('\n')
}

func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && n < len(s) && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}
