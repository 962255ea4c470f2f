"""Action and observation constructors, so a step reads
``await s.step([click(10, 20), type_text("hi"), key("Return")], observe=png())``."""

from __future__ import annotations

from forkfleet.aci.v1 import aci_pb2 as a

LEFT, MIDDLE, RIGHT, BACK, FORWARD = (a.MOUSE_BUTTON_LEFT, a.MOUSE_BUTTON_MIDDLE, a.MOUSE_BUTTON_RIGHT,
                                      a.MOUSE_BUTTON_BACK, a.MOUSE_BUTTON_FORWARD)


def _pt(x: int, y: int) -> a.Point:
    return a.Point(x=int(x), y=int(y))


def move(x: int, y: int) -> a.Action:
    """Moves the pointer to (x, y)."""
    return a.Action(move=a.MoveAction(to=_pt(x, y)))


def click_button(x: int | None, y: int | None, button: int = LEFT, count: int = 1) -> a.Action:
    """Clicks button count times at (x, y), or where the pointer is when x is None."""
    c = a.ClickAction(button=button, count=max(int(count), 1))
    if x is not None:
        c.at.CopyFrom(_pt(x, y))
    return a.Action(click=c)


def click(x: int, y: int) -> a.Action:
    """Left-clicks at (x, y)."""
    return click_button(x, y, LEFT, 1)


def double_click(x: int, y: int) -> a.Action:
    return click_button(x, y, LEFT, 2)


def triple_click(x: int, y: int) -> a.Action:
    return click_button(x, y, LEFT, 3)


def right_click(x: int, y: int) -> a.Action:
    return click_button(x, y, RIGHT, 1)


def middle_click(x: int, y: int) -> a.Action:
    return click_button(x, y, MIDDLE, 1)


def click_here(button: int = LEFT, count: int = 1) -> a.Action:
    """Clicks where the pointer is."""
    return click_button(None, None, button, count)


def button_down(button: int = LEFT) -> a.Action:
    """Presses button where the pointer is."""
    return a.Action(button_down=a.ButtonAction(button=button))


def button_up(button: int = LEFT) -> a.Action:
    return a.Action(button_up=a.ButtonAction(button=button))


def drag(x1: int, y1: int, x2: int, y2: int, steps: int = 0, button: int = LEFT) -> a.Action:
    """Presses button at (x1, y1), moves to (x2, y2) in steps intermediate
    motions, and releases."""
    return a.Action(drag=a.DragAction(**{"from": _pt(x1, y1)}, to=_pt(x2, y2), button=button, steps=max(int(steps), 0)))


def scroll(x: int | None, y: int | None, dx: int = 0, dy: int = 0) -> a.Action:
    """Scrolls dx, dy notches at (x, y) (where the pointer is when x is
    None); positive dy scrolls down, positive dx right."""
    s = a.ScrollAction(dx=int(dx), dy=int(dy))
    if x is not None:
        s.at.CopyFrom(_pt(x, y))
    return a.Action(scroll=s)


def key(*keys: str) -> a.Action:
    """Presses and releases one key ("Return", "a", "F5"), or a combination:
    key("ctrl", "c") presses in order and releases in reverse."""
    if len(keys) == 1:
        return a.Action(key_press=a.KeyAction(key=keys[0]))
    return a.Action(key_combo=a.KeyComboAction(keys=list(keys)))


def key_down(k: str) -> a.Action:
    return a.Action(key_down=a.KeyAction(key=k))


def key_up(k: str) -> a.Action:
    return a.Action(key_up=a.KeyAction(key=k))


def type_text(text: str) -> a.Action:
    """Types UTF-8 text."""
    return a.Action(type_text=a.TypeTextAction(text=text))


def wait(seconds: float) -> a.Action:
    """Pauses the step (rounded down to milliseconds)."""
    return a.Action(wait=a.WaitAction(milliseconds=max(int(seconds * 1000), 0)))


def png(**kw) -> a.ScreenshotRequest:
    """A full-screen PNG observation (ScreenshotRequest fields as keywords)."""
    return a.ScreenshotRequest(format=a.IMAGE_FORMAT_PNG, **kw)


def jpeg(quality: int = 80, **kw) -> a.ScreenshotRequest:
    """A JPEG observation at quality 1..100."""
    return a.ScreenshotRequest(format=a.IMAGE_FORMAT_JPEG, quality=max(int(quality), 0), **kw)


def hash_only(**kw) -> a.ScreenshotRequest:
    """Only the frame hash and geometry: a cheap "did the screen change" check."""
    return a.ScreenshotRequest(format=a.IMAGE_FORMAT_NONE, **kw)
