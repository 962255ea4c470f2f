// Package a11yrules holds the rules of the ACI's accessibility requests
// (a11y_tree, a11y_action, step.observe_tree) that guestd and its fake
// (api/aci/acitest) share, so the fake refuses what guestd refuses with the
// same field and answers the same tree hash: bounds, defaults, element refs
// and the hash. docs/aci-spec.md, "a11y_tree", states them.
package a11yrules

import (
	"strconv"
	"strings"
	"time"

	"github.com/zeebo/xxh3"
	"google.golang.org/protobuf/proto"

	"github.com/forkfleet/forkfleet/api/errdefs"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// Bounds and defaults of a tree request.
const (
	DefaultMaxDepth   = 64
	MaxDepth          = 256
	DefaultMaxNodes   = 10000
	MaxNodes          = 20000
	DefaultTimeout    = 5 * time.Second
	DefaultAppTimeout = 3 * time.Second
	MaxTimeout        = 60 * time.Second
)

// Bounds and defaults of an action request.
const (
	DefaultActionTimeout = 2 * time.Second
	MaxSetText           = 64 << 10
	MaxActionName        = 256
)

// Tree is a validated A11yTreeRequest.
type Tree struct {
	Root        aciv1.A11YRoot
	WindowID    uint32
	X, Y        int
	MaxDepth    int
	MaxNodes    int
	ShowingOnly bool
	Timeout     time.Duration
	AppTimeout  time.Duration
	Fields      Fields
	IfNoneMatch []byte
}

// Fields is the set of optional node fields to fill.
type Fields uint32

// Has reports whether x is in the set.
func (f Fields) Has(x aciv1.A11YField) bool { return f&(1<<x) != 0 }

// AllFields fills every optional field.
const AllFields = Fields(1<<aciv1.A11YField_A11Y_FIELD_BOUNDS | 1<<aciv1.A11YField_A11Y_FIELD_STATES |
	1<<aciv1.A11YField_A11Y_FIELD_DESCRIPTION | 1<<aciv1.A11YField_A11Y_FIELD_TEXT |
	1<<aciv1.A11YField_A11Y_FIELD_VALUE | 1<<aciv1.A11YField_A11Y_FIELD_ACTIONS)

// ValidateTree turns a tree request into options, or an InvalidField error
// naming the field (prefix: "a11y_tree" or "step.observe_tree").
func ValidateTree(r *aciv1.A11YTreeRequest, prefix string) (Tree, error) {
	o := Tree{Root: r.GetRoot(), WindowID: r.GetWindowId(), ShowingOnly: r.GetShowingOnly(),
		MaxDepth: DefaultMaxDepth, MaxNodes: DefaultMaxNodes, Timeout: DefaultTimeout, AppTimeout: DefaultAppTimeout,
		IfNoneMatch: r.GetIfNoneMatch()}
	switch o.Root {
	case aciv1.A11YRoot_A11Y_ROOT_UNSPECIFIED, aciv1.A11YRoot_A11Y_ROOT_DESKTOP, aciv1.A11YRoot_A11Y_ROOT_FOCUSED_WINDOW:
	case aciv1.A11YRoot_A11Y_ROOT_WINDOW:
		if o.WindowID == 0 {
			return o, errdefs.InvalidField(prefix+".window_id", "root WINDOW needs window_id")
		}
	case aciv1.A11YRoot_A11Y_ROOT_POINT:
		if r.GetPoint() == nil {
			return o, errdefs.InvalidField(prefix+".point", "root POINT needs point")
		}
		o.X, o.Y = int(r.GetPoint().GetX()), int(r.GetPoint().GetY())
	default:
		return o, errdefs.InvalidField(prefix+".root", "unknown root %v", o.Root)
	}
	if d := r.GetMaxDepth(); d > 0 {
		if d > MaxDepth {
			return o, errdefs.InvalidField(prefix+".max_depth", "%d: at most %d", d, MaxDepth)
		}
		o.MaxDepth = int(d)
	}
	if n := r.GetMaxNodes(); n > 0 {
		if n > MaxNodes {
			return o, errdefs.InvalidField(prefix+".max_nodes", "%d: at most %d", n, MaxNodes)
		}
		o.MaxNodes = int(n)
	}
	if t := r.GetTimeoutMs(); t > 0 {
		if time.Duration(t)*time.Millisecond > MaxTimeout {
			return o, errdefs.InvalidField(prefix+".timeout_ms", "%d: at most %d", t, MaxTimeout/time.Millisecond)
		}
		o.Timeout = time.Duration(t) * time.Millisecond
	}
	o.AppTimeout = min(o.AppTimeout, o.Timeout)
	if t := r.GetAppTimeoutMs(); t > 0 {
		if time.Duration(t)*time.Millisecond > o.Timeout {
			return o, errdefs.InvalidField(prefix+".app_timeout_ms", "%d ms: at most timeout_ms (%v)", t, o.Timeout)
		}
		o.AppTimeout = time.Duration(t) * time.Millisecond
	}
	if len(o.IfNoneMatch) != 0 && len(o.IfNoneMatch) != 16 {
		return o, errdefs.InvalidField(prefix+".if_none_match", "%d bytes: a tree hash is 16", len(o.IfNoneMatch))
	}
	if len(r.GetFields()) == 0 {
		o.Fields = AllFields
	}
	for i, f := range r.GetFields() {
		if f <= aciv1.A11YField_A11Y_FIELD_UNSPECIFIED || f > aciv1.A11YField_A11Y_FIELD_ACTIONS {
			return o, errdefs.InvalidField(prefix+".fields["+strconv.Itoa(i)+"]", "unknown field %v", f)
		}
		o.Fields |= 1 << f
	}
	return o, nil
}

// ValidateAction checks an A11yActionRequest's fields before any call.
func ValidateAction(r *aciv1.A11YActionRequest) error {
	if _, _, ok := ParseRef(r.GetRef()); !ok {
		return errdefs.InvalidField("a11y_action.ref", "%q is not an element ref (\"<unique bus name>:<object path>\")", r.GetRef())
	}
	switch r.GetKind() {
	case aciv1.A11YActionKind_A11Y_ACTION_KIND_DO:
		if r.GetAction() == "" || len(r.GetAction()) > MaxActionName {
			return errdefs.InvalidField("a11y_action.action", "name the action (1..%d bytes)", MaxActionName)
		}
	case aciv1.A11YActionKind_A11Y_ACTION_KIND_FOCUS, aciv1.A11YActionKind_A11Y_ACTION_KIND_SCROLL_INTO_VIEW,
		aciv1.A11YActionKind_A11Y_ACTION_KIND_SET_VALUE:
	case aciv1.A11YActionKind_A11Y_ACTION_KIND_SET_TEXT:
		if len(r.GetText()) > MaxSetText {
			return errdefs.InvalidField("a11y_action.text", "text of %d bytes, at most %d", len(r.GetText()), MaxSetText)
		}
	default:
		return errdefs.InvalidField("a11y_action.kind", "kind %v: want do, focus, set_text, set_value or scroll_into_view", r.GetKind())
	}
	if r.GetTimeoutMs() > uint32(MaxTimeout/time.Millisecond) {
		return errdefs.InvalidField("a11y_action.timeout_ms", "at most %d", MaxTimeout/time.Millisecond)
	}
	return nil
}

// ParseRef splits an element ref, "<unique bus name>:<object path>". The
// bus name must be a unique name (":1.42"): a well-known name could be taken
// over by anything on the bus; the path must be a valid D-Bus object path.
func ParseRef(s string) (bus, path string, ok bool) {
	i := strings.Index(s, ":/")
	if i <= 0 || !strings.HasPrefix(s, ":") || len(s) > 1024 {
		return "", "", false
	}
	bus, path = s[:i], s[i+1:]
	if !ValidObjectPath(path) || strings.ContainsAny(bus, "/ \x00") {
		return "", "", false
	}
	return bus, path, true
}

// ValidObjectPath: "/" or "/"-separated non-empty elements of [A-Za-z0-9_].
func ValidObjectPath(p string) bool {
	if p == "/" {
		return true
	}
	if len(p) < 2 || p[0] != '/' || p[len(p)-1] == '/' {
		return false
	}
	prev := byte('/')
	for i := 1; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '/':
			if prev == '/' {
				return false
			}
		case c == '_', c >= '0' && c <= '9', c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		default:
			return false
		}
		prev = c
	}
	return true
}

// Hash is a tree's tree_hash: the 128-bit XXH3 of its nodes, apps, partial
// and truncated, deterministically marshaled.
func Hash(r *aciv1.A11YTreeResponse) []byte {
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(&aciv1.A11YTreeResponse{Nodes: r.GetNodes(), Apps: r.GetApps(),
		Partial: r.GetPartial(), Truncated: r.GetTruncated()})
	h := xxh3.Hash128(b).Bytes()
	return h[:]
}

// Finish sets r's tree_hash and, when it equals ifNoneMatch, leaves the
// nodes and apps out (not_modified).
func Finish(r *aciv1.A11YTreeResponse, ifNoneMatch []byte) {
	r.TreeHash = Hash(r)
	if len(ifNoneMatch) == len(r.TreeHash) && string(ifNoneMatch) == string(r.TreeHash) {
		r.Nodes, r.Apps, r.NotModified = nil, nil, true
	}
}
