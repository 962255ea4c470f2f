package aci

import (
	"context"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
	"github.com/forkfleet/forkfleet/guestd/internal/acierr"
)

// Step limits.
const (
	maxActions     = 256
	maxWait        = 60 * time.Second
	maxClickCount  = 10
	maxScrollNotch = 1000
	maxDragSteps   = 1000
	maxTypeText    = 64 << 10
	maxComboKeys   = 16
)

// step runs the actions in order, then the observation. A failing action
// never hides the observation: its error is in its outcome.
func (ss *session) step(ctx context.Context, r *aciv1.StepRequest) (*aciv1.StepResponse, error) {
	acts := r.GetActions()
	if len(acts) > maxActions {
		return nil, errInvalid("step.actions", "%d actions, at most %d per step", len(acts), maxActions)
	}
	resp := &aciv1.StepResponse{Outcomes: make([]*aciv1.ActionOutcome, len(acts))}
	outcomes := make([]aciv1.ActionOutcome, len(acts)) // one allocation for all
	failed := false
	for i, a := range acts {
		o := &outcomes[i]
		resp.Outcomes[i] = o
		field := "step.actions[" + strconv.Itoa(i) + "]"
		if failed && r.GetStopOnError() {
			o.Error = acierr.New(aciv1.ErrorCode_ERROR_CODE_CANCELED, field, "not run: an earlier action failed").Proto()
			continue
		}
		if ctx.Err() != nil {
			o.Error = acierr.New(aciv1.ErrorCode_ERROR_CODE_CANCELED, field, "step canceled").Proto()
			failed = true
			continue
		}
		t := time.Now()
		if err := ss.act(ctx, a, field); err != nil {
			o.Error = toError(err, field)
			failed = true
		}
		o.DurationNs = uint64(time.Since(t))
	}
	if obs := r.GetObserve(); obs != nil {
		shot, err := ss.screenshot(ctx, obs, "step.observe")
		if err != nil {
			resp.ObservationError = toError(err, "step.observe")
		} else {
			resp.Observation = shot
		}
	}
	if obs := r.GetObserveTree(); obs != nil {
		var tree *aciv1.A11YTreeResponse
		var err error
		if ss.srv.opts.A11y == nil {
			err = acierr.New(aciv1.ErrorCode_ERROR_CODE_UNIMPLEMENTED, "step.observe_tree", "a11y is not supported by this server (not in its capabilities)")
		} else {
			tree, err = ss.srv.a11yTree(ctx, obs, "step.observe_tree")
		}
		if err != nil {
			resp.TreeError = toError(err, "step.observe_tree")
		} else {
			resp.Tree = tree
		}
	}
	return resp, nil
}

func button(b aciv1.MouseButton, field string) (int, error) {
	switch b {
	case aciv1.MouseButton_MOUSE_BUTTON_UNSPECIFIED:
		return 1, nil
	case aciv1.MouseButton_MOUSE_BUTTON_LEFT, aciv1.MouseButton_MOUSE_BUTTON_MIDDLE, aciv1.MouseButton_MOUSE_BUTTON_RIGHT,
		aciv1.MouseButton_MOUSE_BUTTON_BACK, aciv1.MouseButton_MOUSE_BUTTON_FORWARD:
		return int(b), nil
	}
	return 0, errInvalid(field, "unknown mouse button %d", int32(b))
}

// act performs one action.
func (ss *session) act(ctx context.Context, a *aciv1.Action, field string) error {
	if w := a.GetWait(); w != nil {
		d := time.Duration(w.GetMilliseconds()) * time.Millisecond
		if d > maxWait {
			return errInvalid(field+".wait.milliseconds", "wait is capped at %s", maxWait)
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	d, err := ss.srv.desktop()
	if err != nil {
		return err
	}
	sw, sh := d.ScreenSize()
	// point validates an on-screen point; nil means "where the pointer is".
	moveTo := func(p *aciv1.Point, f string, required bool) error {
		if p == nil {
			if required {
				return errInvalid(f, "point is required")
			}
			return nil
		}
		if err := onScreen(p, sw, sh, f); err != nil {
			return err
		}
		return d.MoveTo(int(p.GetX()), int(p.GetY()))
	}
	switch v := a.GetAction().(type) {
	case *aciv1.Action_Move:
		return moveTo(v.Move.GetTo(), field+".move.to", true)
	case *aciv1.Action_Click:
		b, err := button(v.Click.GetButton(), field+".click.button")
		if err != nil {
			return err
		}
		n := int(v.Click.GetCount())
		if n == 0 {
			n = 1
		}
		if n > maxClickCount {
			return errInvalid(field+".click.count", "count %d, at most %d", n, maxClickCount)
		}
		if err := moveTo(v.Click.GetAt(), field+".click.at", false); err != nil {
			return err
		}
		return d.Click(b, n)
	case *aciv1.Action_ButtonDown:
		b, err := button(v.ButtonDown.GetButton(), field+".button_down.button")
		if err != nil {
			return err
		}
		if err := moveTo(v.ButtonDown.GetAt(), field+".button_down.at", false); err != nil {
			return err
		}
		return d.ButtonDown(b)
	case *aciv1.Action_ButtonUp:
		b, err := button(v.ButtonUp.GetButton(), field+".button_up.button")
		if err != nil {
			return err
		}
		if err := moveTo(v.ButtonUp.GetAt(), field+".button_up.at", false); err != nil {
			return err
		}
		return d.ButtonUp(b)
	case *aciv1.Action_Drag:
		if err := onScreen(v.Drag.GetTo(), sw, sh, field+".drag.to"); err != nil {
			return err
		}
		return drag(d, v.Drag, field+".drag", moveTo)
	case *aciv1.Action_Scroll:
		dx, dy := v.Scroll.GetDx(), v.Scroll.GetDy()
		if dx < -maxScrollNotch || dx > maxScrollNotch || dy < -maxScrollNotch || dy > maxScrollNotch {
			return errInvalid(field+".scroll", "scroll is capped at %d notches per axis", maxScrollNotch)
		}
		if err := moveTo(v.Scroll.GetAt(), field+".scroll.at", false); err != nil {
			return err
		}
		return d.Scroll(int(dx), int(dy))
	case *aciv1.Action_KeyDown:
		if err := keyName(v.KeyDown.GetKey(), field+".key_down.key"); err != nil {
			return err
		}
		return d.KeyDown(v.KeyDown.GetKey())
	case *aciv1.Action_KeyUp:
		if err := keyName(v.KeyUp.GetKey(), field+".key_up.key"); err != nil {
			return err
		}
		return d.KeyUp(v.KeyUp.GetKey())
	case *aciv1.Action_KeyPress:
		if err := keyName(v.KeyPress.GetKey(), field+".key_press.key"); err != nil {
			return err
		}
		return d.KeyCombo([]string{v.KeyPress.GetKey()})
	case *aciv1.Action_KeyCombo:
		keys := v.KeyCombo.GetKeys()
		if len(keys) == 0 || len(keys) > maxComboKeys {
			return errInvalid(field+".key_combo.keys", "want 1..%d keys, got %d", maxComboKeys, len(keys))
		}
		for i, k := range keys {
			if err := keyName(k, fmt.Sprintf("%s.key_combo.keys[%d]", field, i)); err != nil {
				return err
			}
		}
		return d.KeyCombo(keys)
	case *aciv1.Action_TypeText:
		t := v.TypeText.GetText()
		if len(t) > maxTypeText {
			return errInvalid(field+".type_text.text", "text is %d bytes, at most %d", len(t), maxTypeText)
		}
		if !utf8.ValidString(t) {
			return errInvalid(field+".type_text.text", "text is not valid UTF-8")
		}
		return d.TypeText(t)
	case nil:
		return acierr.New(aciv1.ErrorCode_ERROR_CODE_UNIMPLEMENTED, field, "unknown action kind (newer client?)")
	}
	return acierr.New(aciv1.ErrorCode_ERROR_CODE_UNIMPLEMENTED, field, "unsupported action %T", a.GetAction())
}

// onScreen validates a required on-screen point.
func onScreen(p *aciv1.Point, sw, sh int, field string) error {
	if p == nil {
		return errInvalid(field, "point is required")
	}
	if p.GetX() < 0 || p.GetY() < 0 || int(p.GetX()) >= sw || int(p.GetY()) >= sh {
		return errInvalid(field, "point (%d,%d) is outside the %dx%d screen", p.GetX(), p.GetY(), sw, sh)
	}
	return nil
}

func keyName(k, field string) error {
	if k == "" {
		return errInvalid(field, "key name is empty")
	}
	if len(k) > 64 {
		return errInvalid(field, "key name longer than 64 bytes")
	}
	return nil
}

func drag(d Desktop, g *aciv1.DragAction, field string, moveTo func(*aciv1.Point, string, bool) error) error {
	b, err := button(g.GetButton(), field+".button")
	if err != nil {
		return err
	}
	if g.GetSteps() > maxDragSteps {
		return errInvalid(field+".steps", "steps %d, at most %d", g.GetSteps(), maxDragSteps)
	}
	from, to := g.GetFrom(), g.GetTo()
	if from == nil || to == nil {
		return errInvalid(field, "from and to are required")
	}
	if err := moveTo(from, field+".from", true); err != nil {
		return err
	}
	if err := d.ButtonDown(b); err != nil {
		return err
	}
	n := int(g.GetSteps())
	for i := 1; i <= n; i++ {
		x := int(from.GetX()) + (int(to.GetX())-int(from.GetX()))*i/(n+1)
		y := int(from.GetY()) + (int(to.GetY())-int(from.GetY()))*i/(n+1)
		if err := d.MoveTo(x, y); err != nil {
			d.ButtonUp(b)
			return err
		}
	}
	if err := d.MoveTo(int(to.GetX()), int(to.GetY())); err != nil {
		d.ButtonUp(b)
		return err
	}
	return d.ButtonUp(b)
}
