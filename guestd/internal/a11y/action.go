package a11y

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/acierr"
)

// Bounds of an action request.
const (
	DefaultActionTimeout = 2 * time.Second
	MaxSetText           = 64 << 10
)

// Action does r on the element it names, through its application. The
// request was validated (ValidateAction).
func (c *Client) Action(ctx context.Context, r *aciv1.A11YActionRequest) error {
	target, ok := parseRef(r.GetRef())
	if !ok {
		return acierr.Invalid("a11y_action.ref", "%q is not an element ref (\"<unique bus name>:<object path>\")", r.GetRef())
	}
	timeout := DefaultActionTimeout
	if t := r.GetTimeoutMs(); t > 0 {
		timeout = time.Duration(t) * time.Millisecond
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := c.get(ctx)
	if err != nil {
		return acierr.New(aciv1.ErrorCode_ERROR_CODE_UNAVAILABLE, "", "%v", err)
	}
	done := make(chan error, 1)
	go func() { done <- act(ctx, conn, target, r) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		c.drop(conn) // see Tree: a stopped bus can block a write
		err = ctx.Err()
	}
	if err == nil {
		return nil
	}
	var ae *acierr.Error
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, context.DeadlineExceeded):
		return acierr.New(aciv1.ErrorCode_ERROR_CODE_TIMEOUT, "", "the element's application did not answer within %v", timeout)
	case errors.Is(err, context.Canceled):
		return acierr.New(aciv1.ErrorCode_ERROR_CODE_CANCELED, "", "canceled")
	case goneError(err):
		return acierr.New(aciv1.ErrorCode_ERROR_CODE_NOT_FOUND, "a11y_action.ref", "element %s is gone: %v", target, err)
	case unsupportedError(err):
		return acierr.New(aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, "a11y_action.kind", "element %s does not support %s: %v", target, r.GetKind(), err)
	}
	return acierr.New(aciv1.ErrorCode_ERROR_CODE_INTERNAL, "", "a11y_action: %v", err)
}

func act(ctx context.Context, conn *wireConn, target ref, r *aciv1.A11YActionRequest) error {
	// The element must exist: a stale ref is NOT_FOUND, not an action on
	// whatever reuses the path.
	var st []uint32
	if err := call(ctx, conn, target, ifAccessible+".GetState", nil, &st); err != nil {
		return err
	}
	if has(states(st), StateDefunct) {
		return acierr.New(aciv1.ErrorCode_ERROR_CODE_NOT_FOUND, "a11y_action.ref", "element %s is defunct", target)
	}
	var ok bool
	switch r.GetKind() {
	case aciv1.A11YActionKind_A11Y_ACTION_KIND_DO:
		var acts []actionInfo
		if err := call(ctx, conn, target, ifAction+".GetActions", nil, &acts); err != nil {
			return err
		}
		it := &item{ref: target, actions: make([]string, min(len(acts), maxActions))}
		for i := range it.actions {
			it.actions[i] = acts[i].Name
		}
		if err := nameActions(ctx, conn, []*item{it}); err != nil {
			return err
		}
		index := slices.Index(it.actions, r.GetAction())
		names := it.actions
		if index < 0 {
			return acierr.New(aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, "a11y_action.action",
				"element %s has no action %q (it has %q)", target, r.GetAction(), names)
		}
		if err := call(ctx, conn, target, ifAction+".DoAction", []any{int32(index)}, &ok); err != nil {
			return err
		}
	case aciv1.A11YActionKind_A11Y_ACTION_KIND_FOCUS:
		if err := call(ctx, conn, target, ifComponent+".GrabFocus", nil, &ok); err != nil {
			return err
		}
	case aciv1.A11YActionKind_A11Y_ACTION_KIND_SET_TEXT:
		if err := call(ctx, conn, target, ifEditable+".SetTextContents", []any{r.GetText()}, &ok); err != nil {
			return err
		}
	case aciv1.A11YActionKind_A11Y_ACTION_KIND_SET_VALUE:
		if err := call(ctx, conn, target, ifProperties+".Set", []any{ifValue, "CurrentValue", r.GetValue()}); err != nil {
			return err
		}
		ok = true
	case aciv1.A11YActionKind_A11Y_ACTION_KIND_SCROLL_INTO_VIEW:
		if err := call(ctx, conn, target, ifComponent+".ScrollTo", []any{scrollAnyWher}, &ok); err != nil {
			return err
		}
	default:
		return acierr.Invalid("a11y_action.kind", "kind %v: want do, focus, set_text, set_value or scroll_into_view", r.GetKind())
	}
	if !ok {
		return acierr.New(aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, "a11y_action.kind",
			"element %s refused %s", target, r.GetKind())
	}
	return nil
}

// ValidateAction checks an A11yActionRequest's fields before any call.
func ValidateAction(r *aciv1.A11YActionRequest) error {
	if _, ok := parseRef(r.GetRef()); !ok {
		return acierr.Invalid("a11y_action.ref", "%q is not an element ref (\"<unique bus name>:<object path>\")", r.GetRef())
	}
	switch r.GetKind() {
	case aciv1.A11YActionKind_A11Y_ACTION_KIND_DO:
		if r.GetAction() == "" || len(r.GetAction()) > 256 {
			return acierr.Invalid("a11y_action.action", "name the action (1..256 bytes)")
		}
	case aciv1.A11YActionKind_A11Y_ACTION_KIND_FOCUS, aciv1.A11YActionKind_A11Y_ACTION_KIND_SCROLL_INTO_VIEW,
		aciv1.A11YActionKind_A11Y_ACTION_KIND_SET_VALUE:
	case aciv1.A11YActionKind_A11Y_ACTION_KIND_SET_TEXT:
		if len(r.GetText()) > MaxSetText {
			return acierr.Invalid("a11y_action.text", "text of %d bytes, at most %d", len(r.GetText()), MaxSetText)
		}
	default:
		return acierr.Invalid("a11y_action.kind", "kind %v: want do, focus, set_text, set_value or scroll_into_view", r.GetKind())
	}
	if r.GetTimeoutMs() > uint32(MaxTimeout/time.Millisecond) {
		return acierr.Invalid("a11y_action.timeout_ms", "at most %d", MaxTimeout/time.Millisecond)
	}
	return nil
}

// ValidateTree turns a tree request into options, or an INVALID_ARGUMENT
// naming the field (prefix: "a11y_tree" or "step.observe_tree").
func ValidateTree(r *aciv1.A11YTreeRequest, prefix string) (TreeOptions, error) {
	o := TreeOptions{Root: r.GetRoot(), WindowID: r.GetWindowId(), ShowingOnly: r.GetShowingOnly(),
		MaxDepth: DefaultMaxDepth, MaxNodes: DefaultMaxNodes, Timeout: DefaultTimeout, AppTimeout: DefaultAppTimeout,
		MaxBytes: DefaultMaxBytes, IfNoneMatch: r.GetIfNoneMatch()}
	switch o.Root {
	case aciv1.A11YRoot_A11Y_ROOT_UNSPECIFIED, aciv1.A11YRoot_A11Y_ROOT_DESKTOP, aciv1.A11YRoot_A11Y_ROOT_FOCUSED_WINDOW:
	case aciv1.A11YRoot_A11Y_ROOT_WINDOW:
		if o.WindowID == 0 {
			return o, acierr.Invalid(prefix+".window_id", "root WINDOW needs window_id")
		}
	case aciv1.A11YRoot_A11Y_ROOT_POINT:
		if r.GetPoint() == nil {
			return o, acierr.Invalid(prefix+".point", "root POINT needs point")
		}
		o.X, o.Y = int(r.GetPoint().GetX()), int(r.GetPoint().GetY())
	default:
		return o, acierr.Invalid(prefix+".root", "unknown root %v", o.Root)
	}
	if d := r.GetMaxDepth(); d > 0 {
		if d > MaxDepth {
			return o, acierr.Invalid(prefix+".max_depth", "%d: at most %d", d, MaxDepth)
		}
		o.MaxDepth = int(d)
	}
	if n := r.GetMaxNodes(); n > 0 {
		if n > MaxNodes {
			return o, acierr.Invalid(prefix+".max_nodes", "%d: at most %d", n, MaxNodes)
		}
		o.MaxNodes = int(n)
	}
	if t := r.GetTimeoutMs(); t > 0 {
		if time.Duration(t)*time.Millisecond > MaxTimeout {
			return o, acierr.Invalid(prefix+".timeout_ms", "%d: at most %d", t, MaxTimeout/time.Millisecond)
		}
		o.Timeout = time.Duration(t) * time.Millisecond
	}
	o.AppTimeout = min(o.AppTimeout, o.Timeout)
	if t := r.GetAppTimeoutMs(); t > 0 {
		if time.Duration(t)*time.Millisecond > o.Timeout {
			return o, acierr.Invalid(prefix+".app_timeout_ms", "%d ms: at most timeout_ms (%v)", t, o.Timeout)
		}
		o.AppTimeout = time.Duration(t) * time.Millisecond
	}
	if len(o.IfNoneMatch) != 0 && len(o.IfNoneMatch) != 16 {
		return o, acierr.Invalid(prefix+".if_none_match", "%d bytes: a tree hash is 16", len(o.IfNoneMatch))
	}
	if len(r.GetFields()) == 0 {
		o.Fields = AllFields
	}
	for i, f := range r.GetFields() {
		if f <= aciv1.A11YField_A11Y_FIELD_UNSPECIFIED || f > aciv1.A11YField_A11Y_FIELD_ACTIONS {
			return o, acierr.Invalid(fmt.Sprintf("%s.fields[%d]", prefix, i), "unknown field %v", f)
		}
		o.Fields |= 1 << f
	}
	return o, nil
}
