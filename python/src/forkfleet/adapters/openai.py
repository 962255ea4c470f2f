"""OpenAI's computer-use actions on an ACI session.

    computer = OpenAIComputer(session)
    tool = computer.tool_definition()      # {"type": "computer_use_preview", ...}
    for item in response.output:
        if item.type == "computer_call":
            result = await computer.execute(item.action)
            inputs.append({"type": "computer_call_output", "call_id": item.call_id,
                           "output": result.to_openai()})

Actions: click (left, right, wheel, back, forward), double_click, scroll
(scroll_x/scroll_y in pixels), type, keypress, drag (along a path), move,
wait, screenshot. Coordinates are in the model's resolution.
"""

from __future__ import annotations

from typing import Any, Mapping

from forkfleet import errors
from forkfleet.adapters._base import Adapter, Plan, paced_drag
from forkfleet.aci import actions as act

__all__ = ["OpenAIComputer"]

_BUTTONS = {"left": act.LEFT, "right": act.RIGHT, "wheel": act.MIDDLE, "middle": act.MIDDLE,
            "back": act.BACK, "forward": act.FORWARD}
# OpenAI's key names (upper case, DOM-like) as X keysyms.
_KEYS = {"ENTER": "Return", "RETURN": "Return", "ESC": "Escape", "ESCAPE": "Escape", "TAB": "Tab",
         "SPACE": "space", "BACKSPACE": "BackSpace", "DELETE": "Delete", "DEL": "Delete", "INSERT": "Insert",
         "HOME": "Home", "END": "End", "PAGEUP": "Prior", "PAGEDOWN": "Next", "CAPSLOCK": "Caps_Lock",
         "ARROWUP": "Up", "ARROWDOWN": "Down", "ARROWLEFT": "Left", "ARROWRIGHT": "Right",
         "UP": "Up", "DOWN": "Down", "LEFT": "Left", "RIGHT": "Right",
         "CTRL": "ctrl", "CONTROL": "ctrl", "ALT": "alt", "OPTION": "alt", "SHIFT": "shift",
         "CMD": "super", "COMMAND": "super", "META": "super", "SUPER": "super", "WIN": "super"}
_MAX_WAIT_MS = 60_000


def key_name(k: str) -> str:
    """An OpenAI key name as an X keysym name ("ARROWLEFT" -> "Left", "A" -> "a")."""
    up = k.upper()
    if up in _KEYS:
        return _KEYS[up]
    if len(up) >= 2 and up[0] == "F" and up[1:].isdigit():
        return up
    if len(k) == 1:
        return k.lower()
    return k


class OpenAIComputer(Adapter):
    """OpenAI's computer-use actions on a session. ``pixels_per_notch``
    turns scroll distances in pixels into wheel notches (X scrolls by
    notches; 100 px is one notch in Chromium)."""

    def __init__(self, session: Any = None, *, pixels_per_notch: int = 100, environment: str = "linux", **kw: Any):
        super().__init__(session, **kw)
        if pixels_per_notch <= 0:
            raise errors.InvalidArgument("pixels_per_notch must be positive")
        self.pixels_per_notch = pixels_per_notch
        self.environment = environment

    def tool_definition(self) -> dict:
        w, h = self.display_size
        return {"type": "computer_use_preview", "display_width": w, "display_height": h,
                "environment": self.environment}

    def _xy(self, action: Mapping[str, Any], x: str = "x", y: str = "y") -> tuple[int, int]:
        try:
            return self.scaler.to_screen(action[x], action[y])
        except (KeyError, TypeError, ValueError):
            raise errors.InvalidArgument(f"computer: {action.get('type')} needs numeric {x} and {y}", field=x) from None

    def _notches(self, px: Any) -> int:
        try:
            px = float(px or 0)
        except (TypeError, ValueError):
            raise errors.InvalidArgument("computer: scroll distances must be numbers", field="scroll_y") from None
        if px == 0:
            return 0
        # Pixels at the model's resolution are pixels on the screen scaled
        # like coordinates; at least one notch for any nonzero distance.
        n = round(abs(px) * self.scaler.screen_h / self.scaler.model_h / self.pixels_per_notch)
        return int(max(n, 1) * (1 if px > 0 else -1))

    def translate(self, action: Mapping[str, Any]) -> Plan:
        self._need()
        if not isinstance(action, Mapping):
            action = _as_dict(action)
        kind = action.get("type")
        obs = self._observe() if self.screenshot_after_action else None
        if kind == "screenshot":
            return Plan([], self._observe())
        if kind == "click":
            button = action.get("button", "left")
            if button not in _BUTTONS:
                raise errors.InvalidArgument(f"computer: click button {button!r}", field="button")
            x, y = self._xy(action)
            return Plan([act.click_button(x, y, _BUTTONS[button], 1)], obs)
        if kind == "double_click":
            x, y = self._xy(action)
            return Plan([act.double_click(x, y)], obs)
        if kind == "move":
            return Plan([act.move(*self._xy(action))], obs)
        if kind == "scroll":
            x, y = self._xy(action)
            dx, dy = self._notches(action.get("scroll_x")), self._notches(action.get("scroll_y"))
            return Plan([act.scroll(x, y, dx, dy)], obs)
        if kind == "type":
            text = action.get("text")
            if not isinstance(text, str):
                raise errors.InvalidArgument("computer: type needs text", field="text")
            return Plan([act.type_text(text)] if text else [], obs)
        if kind == "keypress":
            keys = action.get("keys")
            if not isinstance(keys, (list, tuple)) or not keys or not all(isinstance(k, str) and k for k in keys):
                raise errors.InvalidArgument("computer: keypress needs keys", field="keys")
            return Plan([act.key(*(key_name(k) for k in keys))], obs)
        if kind == "drag":
            path = action.get("path")
            if not isinstance(path, (list, tuple)) or len(path) < 2:
                raise errors.InvalidArgument("computer: drag needs a path of at least two points", field="path")
            pts = [self._xy(p if isinstance(p, Mapping) else _as_dict(p)) for p in path]
            return Plan(paced_drag(pts), obs)
        if kind == "wait":
            ms = action.get("ms", 1000)
            if not isinstance(ms, (int, float)) or not 0 <= ms <= _MAX_WAIT_MS:
                raise errors.InvalidArgument(f"computer: wait ms must be 0..{_MAX_WAIT_MS}", field="ms")
            return Plan([act.wait(ms / 1000)], obs)
        raise errors.InvalidArgument(f"computer: unknown action type {kind!r}", field="type")


def _as_dict(obj: Any) -> dict:
    """The SDK's action objects (attributes) as a dict."""
    if hasattr(obj, "model_dump"):
        return obj.model_dump()
    return {k: getattr(obj, k) for k in dir(obj) if not k.startswith("_") and not callable(getattr(obj, k))}
