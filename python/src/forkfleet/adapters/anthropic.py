"""Anthropic's computer-use tool (``computer``) on an ACI session.

    computer = AnthropicComputer(session)            # model resolution from the screen
    tool = computer.tool_definition()                # {"type": "computer_20250124", ...}
    for block in response.content:
        if block.type == "tool_use":
            result = await computer.execute(block.input)
            tool_results.append({"type": "tool_result", "tool_use_id": block.id,
                                 "content": result.to_anthropic()})

Actions: screenshot, key, type, mouse_move, left_click, left_click_drag,
right_click, middle_click, double_click, triple_click, left_mouse_down,
left_mouse_up, scroll, hold_key, wait, zoom, cursor_position. Coordinates
are in the model's resolution and scaled to the screen; screenshots are
taken at the model's resolution.
"""

from __future__ import annotations

from typing import Any, Mapping

from forkfleet import errors
from forkfleet.adapters._base import Adapter, Plan, ToolResult, paced_drag
from forkfleet.aci import actions as act
from forkfleet.aci.v1 import aci_pb2 as a

__all__ = ["AnthropicComputer", "ToolResult"]

_BUTTONS = {"left_click": (act.LEFT, 1), "right_click": (act.RIGHT, 1), "middle_click": (act.MIDDLE, 1),
            "double_click": (act.LEFT, 2), "triple_click": (act.LEFT, 3)}
_SCROLL = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}
# xdotool-style names the model uses that X does not know by that name.
_KEY_ALIASES = {"cmd": "super", "command": "super", "win": "super", "windows": "super", "meta": "super",
                "option": "alt", "control": "ctrl", "esc": "Escape", "del": "Delete", "pgup": "Prior",
                "pgdn": "Next", "page_up": "Prior", "page_down": "Next", "enter": "Return"}
_MAX_WAIT = 60.0


def _key_name(k: str) -> str:
    return _KEY_ALIASES.get(k.lower(), k)


def key_actions(text: str) -> list[a.Action]:
    """xdotool key syntax: combos joined by "+", several separated by spaces
    ("ctrl+a Delete")."""
    out = []
    for combo in text.split():
        keys = [_key_name(k) for k in combo.split("+") if k]
        if not keys:
            raise errors.InvalidArgument(f"computer: key {text!r}: empty key", field="text")
        out.append(act.key(*keys))
    if not out:
        raise errors.InvalidArgument("computer: key needs text", field="text")
    return out


def _modifiers(action: Mapping[str, Any]) -> list[str]:
    t = action.get("text")
    return [_key_name(k) for k in t.split("+") if k] if t else []


class AnthropicComputer(Adapter):
    """Anthropic's computer-use tool on a session."""

    tool_type = "computer_20250124"

    def tool_definition(self, name: str = "computer") -> dict:
        """The tool entry of a Messages API request."""
        w, h = self.display_size
        return {"type": self.tool_type, "name": name, "display_width_px": w, "display_height_px": h}

    def _point(self, action: Mapping[str, Any], key: str = "coordinate") -> tuple[int, int]:
        c = action.get(key)
        if not isinstance(c, (list, tuple)) or len(c) != 2:
            raise errors.InvalidArgument(f"computer: {action.get('action')}: {key} must be [x, y]", field=key)
        try:
            return self.scaler.to_screen(c[0], c[1])
        except (TypeError, ValueError):
            raise errors.InvalidArgument(f"computer: {key} {c!r} is not a point", field=key) from None

    def translate(self, action: Mapping[str, Any]) -> Plan:
        self._need()
        kind = action.get("action")
        obs = self._observe() if self.screenshot_after_action else None
        held = _modifiers(action) if kind in _BUTTONS or kind == "scroll" else []
        down = [act.key_down(k) for k in held]
        up = [act.key_up(k) for k in reversed(held)]

        if kind == "screenshot":
            return Plan([], self._observe())
        if kind == "key":
            return Plan(key_actions(str(action.get("text", ""))), obs)
        if kind == "type":
            text = action.get("text")
            if not isinstance(text, str) or not text:
                raise errors.InvalidArgument("computer: type needs text", field="text")
            return Plan([act.type_text(text)], obs)
        if kind == "mouse_move":
            return Plan([act.move(*self._point(action))], obs)
        if kind in _BUTTONS:
            button, count = _BUTTONS[kind]
            if action.get("coordinate") is not None:
                x, y = self._point(action)
                click = [act.click_button(x, y, button, count)]
            else:
                click = [act.click_here(button, count)]
            return Plan(down + click + up, obs)
        if kind == "left_click_drag":
            x1, y1 = self._point(action, "start_coordinate")
            x2, y2 = self._point(action)
            return Plan(paced_drag([(x1, y1), (x2, y2)]), obs)
        if kind == "left_mouse_down":
            pre = [act.move(*self._point(action))] if action.get("coordinate") is not None else []
            return Plan(pre + [act.button_down(act.LEFT)], obs)
        if kind == "left_mouse_up":
            pre = [act.move(*self._point(action))] if action.get("coordinate") is not None else []
            return Plan(pre + [act.button_up(act.LEFT)], obs)
        if kind == "scroll":
            direction = action.get("scroll_direction")
            if direction not in _SCROLL:
                raise errors.InvalidArgument(f"computer: scroll_direction {direction!r}: want up, down, left or right",
                                             field="scroll_direction")
            amount = action.get("scroll_amount", 3)
            if not isinstance(amount, int) or amount < 0:
                raise errors.InvalidArgument("computer: scroll_amount must be a non-negative integer",
                                             field="scroll_amount")
            dx, dy = _SCROLL[direction]
            if action.get("coordinate") is not None:
                x, y = self._point(action)
                sc = act.scroll(x, y, dx * amount, dy * amount)
            else:
                sc = act.scroll(None, None, dx * amount, dy * amount)
            return Plan(down + [sc] + up, obs)
        if kind == "hold_key":
            keys = [_key_name(k) for k in str(action.get("text", "")).split("+") if k]
            if not keys:
                raise errors.InvalidArgument("computer: hold_key needs text", field="text")
            duration = _seconds(action.get("duration"), "duration")
            return Plan([act.key_down(k) for k in keys] + [act.wait(duration)] +
                        [act.key_up(k) for k in reversed(keys)], obs)
        if kind == "wait":
            return Plan([act.wait(_seconds(action.get("duration", 1), "duration"))], obs)
        if kind == "cursor_position":
            return Plan([], None, finish=lambda r: ToolResult(), cursor=True)
        if kind == "zoom":
            region = action.get("region")
            if not isinstance(region, (list, tuple)) or len(region) != 4:
                raise errors.InvalidArgument("computer: zoom needs region [x0, y0, x1, y1]", field="region")
            x0, y0 = self.scaler.to_screen(region[0], region[1])
            x1, y1 = self.scaler.to_screen(region[2], region[3])
            if x1 <= x0 or y1 <= y0:
                raise errors.InvalidArgument("computer: zoom region is empty", field="region")
            req = self._observe()
            req.region.CopyFrom(a.Rect(x=x0, y=y0, width=x1 - x0, height=y1 - y0))
            req.max_long_edge = max(self.scaler.model_w, self.scaler.model_h)
            return Plan([], req, finish=self._zoom_result)
        raise errors.InvalidArgument(f"computer: unknown action {kind!r}", field="action")

    def _zoom_result(self, r) -> ToolResult:
        """A zoomed region comes back at its own size (up to the model's
        long edge), not scaled to the screen's model size."""
        res = ToolResult(error="; ".join(str(e) for _, e in r.errors()))
        if r.observation is not None:
            res.screenshot = r.observation
            res.image = r.observation.data
            res.media_type = "image/jpeg" if r.observation.format == a.IMAGE_FORMAT_JPEG else "image/png"
        elif r.observation_error is not None:
            res.error = str(r.observation_error)
        return res


def _seconds(v: Any, field: str) -> float:
    try:
        s = float(v)
    except (TypeError, ValueError):
        raise errors.InvalidArgument(f"computer: {field} must be a number of seconds", field=field) from None
    if not 0 <= s <= _MAX_WAIT:
        raise errors.InvalidArgument(f"computer: {field} must be 0..{_MAX_WAIT:g} seconds", field=field)
    return s
