package aci

import (
	"time"

	aciv1 "github.com/forkfleet/forkfleet/api/gen/forkfleet/aci/v1"
)

// Action constructors, so a step reads
//
//	s.Step(ctx, []*aciv1.Action{aci.Click(10, 20), aci.Type("hi")}, aci.PNG())

func pt(x, y int) *aciv1.Point { return &aciv1.Point{X: int32(x), Y: int32(y)} }

// Move moves the pointer to (x, y).
func Move(x, y int) *aciv1.Action {
	return &aciv1.Action{Action: &aciv1.Action_Move{Move: &aciv1.MoveAction{To: pt(x, y)}}}
}

// Click left-clicks at (x, y).
func Click(x, y int) *aciv1.Action {
	return ClickButton(x, y, aciv1.MouseButton_MOUSE_BUTTON_LEFT, 1)
}

// DoubleClick left-double-clicks at (x, y).
func DoubleClick(x, y int) *aciv1.Action {
	return ClickButton(x, y, aciv1.MouseButton_MOUSE_BUTTON_LEFT, 2)
}

// RightClick right-clicks at (x, y).
func RightClick(x, y int) *aciv1.Action {
	return ClickButton(x, y, aciv1.MouseButton_MOUSE_BUTTON_RIGHT, 1)
}

// ClickButton clicks button count times at (x, y).
func ClickButton(x, y int, button aciv1.MouseButton, count int) *aciv1.Action {
	return &aciv1.Action{Action: &aciv1.Action_Click{Click: &aciv1.ClickAction{
		At: pt(x, y), Button: button, Count: uint32(max(count, 1)),
	}}}
}

// ClickHere clicks the left button where the pointer is.
func ClickHere() *aciv1.Action {
	return &aciv1.Action{Action: &aciv1.Action_Click{Click: &aciv1.ClickAction{
		Button: aciv1.MouseButton_MOUSE_BUTTON_LEFT, Count: 1,
	}}}
}

// ButtonDown presses button where the pointer is.
func ButtonDown(button aciv1.MouseButton) *aciv1.Action {
	return &aciv1.Action{Action: &aciv1.Action_ButtonDown{ButtonDown: &aciv1.ButtonAction{Button: button}}}
}

// ButtonUp releases button where the pointer is.
func ButtonUp(button aciv1.MouseButton) *aciv1.Action {
	return &aciv1.Action{Action: &aciv1.Action_ButtonUp{ButtonUp: &aciv1.ButtonAction{Button: button}}}
}

// Drag presses the left button at (x1, y1), moves to (x2, y2) in steps
// intermediate motions and releases.
func Drag(x1, y1, x2, y2, steps int) *aciv1.Action {
	return &aciv1.Action{Action: &aciv1.Action_Drag{Drag: &aciv1.DragAction{
		From: pt(x1, y1), To: pt(x2, y2), Button: aciv1.MouseButton_MOUSE_BUTTON_LEFT, Steps: uint32(max(steps, 0)),
	}}}
}

// Scroll scrolls dx, dy notches at (x, y); positive dy scrolls down.
func Scroll(x, y, dx, dy int) *aciv1.Action {
	return &aciv1.Action{Action: &aciv1.Action_Scroll{Scroll: &aciv1.ScrollAction{
		At: pt(x, y), Dx: int32(dx), Dy: int32(dy),
	}}}
}

// Key presses and releases one key ("Return", "a", "F5"), or a combination
// when given several: Key("ctrl", "c") presses in order, releases in
// reverse.
func Key(keys ...string) *aciv1.Action {
	if len(keys) == 1 {
		return &aciv1.Action{Action: &aciv1.Action_KeyPress{KeyPress: &aciv1.KeyAction{Key: keys[0]}}}
	}
	return &aciv1.Action{Action: &aciv1.Action_KeyCombo{KeyCombo: &aciv1.KeyComboAction{Keys: append([]string(nil), keys...)}}}
}

// KeyDown presses key and holds it.
func KeyDown(key string) *aciv1.Action {
	return &aciv1.Action{Action: &aciv1.Action_KeyDown{KeyDown: &aciv1.KeyAction{Key: key}}}
}

// KeyUp releases key.
func KeyUp(key string) *aciv1.Action {
	return &aciv1.Action{Action: &aciv1.Action_KeyUp{KeyUp: &aciv1.KeyAction{Key: key}}}
}

// Type types UTF-8 text.
func Type(text string) *aciv1.Action {
	return &aciv1.Action{Action: &aciv1.Action_TypeText{TypeText: &aciv1.TypeTextAction{Text: text}}}
}

// Wait pauses the step for d (rounded down to milliseconds).
func Wait(d time.Duration) *aciv1.Action {
	return &aciv1.Action{Action: &aciv1.Action_Wait{Wait: &aciv1.WaitAction{Milliseconds: uint32(max(d.Milliseconds(), 0))}}}
}

// PNG requests a full-screen PNG observation.
func PNG() *aciv1.ScreenshotRequest {
	return &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_PNG}
}

// JPEG requests a full-screen JPEG observation at quality (1..100; 80 when 0).
func JPEG(quality int) *aciv1.ScreenshotRequest {
	return &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_JPEG, Quality: uint32(max(quality, 0))}
}

// HashOnly requests only the frame hash and geometry: a cheap "did the
// screen change" check.
func HashOnly() *aciv1.ScreenshotRequest {
	return &aciv1.ScreenshotRequest{Format: aciv1.ImageFormat_IMAGE_FORMAT_NONE}
}
