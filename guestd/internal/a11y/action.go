package a11y

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/forkfleet/forkfleet/api/aci/a11yrules"
	"github.com/forkfleet/forkfleet/api/errdefs"
	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/acierr"
	"github.com/forkfleet/forkfleet/guestd/internal/desktop"
)

// Bounds of an action request (api/aci/a11yrules).
const (
	DefaultActionTimeout = a11yrules.DefaultActionTimeout
	MaxSetText           = a11yrules.MaxSetText
)

// Keyboard is guestd's typing path (x11.Desktop): what SET_TEXT types with
// into an element whose toolkit gives no EditableText (Chromium's inputs),
// and the X windows, to check that keys reach the element's window.
type Keyboard interface {
	KeyCombo(keys []string) error
	TypeText(text string) error
	ListWindows() ([]desktop.Window, error)
}

// errByTyping: the element is editable but offers no EditableText; its text
// is set by typing (setTextByTyping).
var errByTyping = errors.New("a11y: editable by typing only")

// focusPoll is how often SET_TEXT by typing looks whether the element took
// the focus and shows the text (Chromium updates its tree asynchronously).
const focusPoll = 10 * time.Millisecond

// Action does r on the element it names, through its application. The
// request was validated (ValidateAction). kb (nil without a display) types
// SET_TEXT's text into an element without EditableText.
func (c *Client) Action(ctx context.Context, r *aciv1.A11YActionRequest, kb Keyboard) error {
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
	err = c.bounded(ctx, conn, func() error { return act(ctx, conn, target, r) })
	if errors.Is(err, errByTyping) {
		err = c.setTextByTyping(ctx, conn, target, r.GetText(), kb)
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
		err := call(ctx, conn, target, ifEditable+".SetTextContents", []any{r.GetText()}, &ok)
		switch {
		case err != nil && unsupportedError(err) && has(states(st), StateEditable):
			return errByTyping // Chromium's inputs: Text without EditableText
		case err != nil && unsupportedError(err):
			return acierr.New(aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, "a11y_action.ref",
				"element %s is not editable (no EditableText, no EDITABLE state)", target)
		case err != nil:
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

// bounded runs f, which calls over conn, within ctx: a bus that stops
// reading can block a write, which no context interrupts; past the deadline
// the connection is dropped (its close unblocks the writer).
func (c *Client) bounded(ctx context.Context, conn *wireConn, f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		if dl, ok := ctx.Deadline(); err != nil && ok && !time.Now().Before(dl) {
			// Past the deadline, the deadline is the cause: a flush that
			// met it closes the connection, which can fail the call
			// before the context's timer fires.
			return context.DeadlineExceeded
		}
		return err
	case <-ctx.Done():
		c.drop(conn)
		return ctx.Err()
	}
}

// setTextByTyping sets the text of an editable element without
// EditableText as a user would: the element takes the focus, its content
// is selected (ctrl+a) and replaced by the text typed through guestd's
// typing path (BackSpace for ""). Keys go to the X focus window, so that
// window must be the element's application's; then the reply waits until
// the element shows the text (a password field's is not readable).
func (c *Client) setTextByTyping(ctx context.Context, conn *wireConn, target ref, text string, kb Keyboard) error {
	if kb == nil {
		return acierr.New(aciv1.ErrorCode_ERROR_CODE_UNAVAILABLE, "", "element %s takes text by typing only, and there is no display", target)
	}
	var pid uint32
	var role uint32
	err := c.bounded(ctx, conn, func() error {
		if err := call(ctx, conn, busRef, "org.freedesktop.DBus.GetConnectionUnixProcessID", []any{target.Bus}, &pid); err != nil {
			return err
		}
		if err := call(ctx, conn, target, ifAccessible+".GetRole", nil, &role); err != nil {
			return err
		}
		var ok bool
		if err := call(ctx, conn, target, ifComponent+".GrabFocus", nil, &ok); err != nil {
			return err
		}
		return waitFor(ctx, func() (bool, error) {
			var st []uint32
			err := call(ctx, conn, target, ifAccessible+".GetState", nil, &st)
			return err == nil && has(states(st), StateFocused), err
		})
	})
	if errors.Is(err, context.DeadlineExceeded) {
		return acierr.New(aciv1.ErrorCode_ERROR_CODE_TIMEOUT, "", "element %s did not take the focus in time", target)
	}
	if err != nil {
		return err
	}
	ws, err := kb.ListWindows()
	if err != nil {
		return err
	}
	focused := -1
	for _, w := range ws {
		if w.Focused {
			focused = w.PID
		}
	}
	if focused != int(pid) {
		return acierr.New(aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, "a11y_action.ref",
			"element %s takes text by typing only, and its application's window (pid %d) does not hold the keyboard focus (pid %d's does)", target, pid, focused)
	}
	if err := kb.KeyCombo([]string{"ctrl", "a"}); err != nil {
		return err
	}
	if text == "" {
		err = kb.KeyCombo([]string{"BackSpace"})
	} else {
		err = kb.TypeText(text)
	}
	if err != nil {
		return err
	}
	if role == rolePasswordText {
		return nil
	}
	// got is written by the poll, which bounded may leave running past
	// the deadline.
	var mu sync.Mutex
	var got string
	err = c.bounded(ctx, conn, func() error {
		return waitFor(ctx, func() (bool, error) {
			var s string
			err := call(ctx, conn, target, ifText+".GetText", []any{int32(0), int32(-1)}, &s)
			if err == nil { // a read the deadline cut short shows nothing
				mu.Lock()
				got = s
				mu.Unlock()
			}
			return err == nil && s == text, err
		})
	})
	if errors.Is(err, context.DeadlineExceeded) {
		mu.Lock()
		shown := got
		mu.Unlock()
		return acierr.New(aciv1.ErrorCode_ERROR_CODE_FAILED_PRECONDITION, "a11y_action.text",
			"typed the text into element %s, which shows %q instead (a limit or a filter of the field, or it was slow to update)", target, clip(shown))
	}
	return err
}

// waitFor polls done every focusPoll until it reports true, fails or ctx
// ends.
func waitFor(ctx context.Context, done func() (bool, error)) error {
	for {
		ok, err := done()
		if ok || err != nil {
			return err
		}
		t := time.NewTimer(focusPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// ValidateAction checks an A11yActionRequest's fields before any call
// (a11yrules.ValidateAction, the fake's too).
func ValidateAction(r *aciv1.A11YActionRequest) error {
	return invalid(a11yrules.ValidateAction(r))
}

// ValidateTree turns a tree request into options, or an INVALID_ARGUMENT
// naming the field (prefix: "a11y_tree" or "step.observe_tree";
// a11yrules.ValidateTree, the fake's too).
func ValidateTree(r *aciv1.A11YTreeRequest, prefix string) (TreeOptions, error) {
	t, err := a11yrules.ValidateTree(r, prefix)
	if err != nil {
		return TreeOptions{}, invalid(err)
	}
	return TreeOptions{Tree: t, MaxBytes: DefaultMaxBytes}, nil
}

// invalid types a rule's error as the ACI's INVALID_ARGUMENT on its field.
func invalid(err error) error {
	var fe *errdefs.FieldError
	if errors.As(err, &fe) {
		return acierr.Invalid(fe.Field, "%s", fe.Reason)
	}
	return err
}
