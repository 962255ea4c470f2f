"""What both adapters share: binding to a session, the plan of one action
(ACI actions + the observation, one step), and the result."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from forkfleet import _sync, errors
from forkfleet.adapters.scaling import Scaler, b64, scaler_for
from forkfleet.aci import actions as act
from forkfleet.aci import session as aci_session
from forkfleet.aci.v1 import aci_pb2 as a


@dataclasses.dataclass
class ToolResult:
    """What an action produced: ``output`` text (cursor position), an error
    text when an action failed in the sandbox, and the screenshot at the
    model's resolution (``image``, encoded)."""

    output: str = ""
    error: str = ""
    image: bytes | None = None
    media_type: str = "image/png"
    screenshot: aci_session.Screenshot | None = None

    @property
    def base64_image(self) -> str | None:
        return b64(self.image) if self.image is not None else None

    def to_anthropic(self) -> list[dict]:
        """The content blocks of a tool_result."""
        blocks: list[dict] = []
        if self.output or self.error:
            blocks.append({"type": "text", "text": self.error or self.output})
        if self.image is not None:
            blocks.append({"type": "image", "source": {"type": "base64", "media_type": self.media_type,
                                                        "data": self.base64_image}})
        return blocks

    def to_openai(self) -> dict:
        """The ``output`` of a computer_call_output item."""
        if self.image is None:
            raise errors.FailedPrecondition("adapter: no screenshot to return to the model")
        return {"type": "computer_screenshot", "image_url": f"data:{self.media_type};base64,{self.base64_image}"}


# A drag as a window manager follows it: X delivers the motions at once, but
# a WM that starts moving a window on the first motion past its threshold
# reads the pointer when it gets there; unpaced, the pointer is already at
# the end and the window does not move. So the press, every motion and the
# release are spaced out a little.
_DRAG_PAUSE = 0.05
_DRAG_STEP_PAUSE = 0.01
_DRAG_STEPS = 8  # motions per path segment


def paced_drag(points: list[tuple[int, int]], button: int = act.LEFT) -> list[a.Action]:
    """Press at the first point, move through the others (interpolated),
    release at the last."""
    out = [act.move(*points[0]), act.button_down(button), act.wait(_DRAG_PAUSE)]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        for i in range(1, _DRAG_STEPS + 1):
            out.append(act.move(x0 + (x1 - x0) * i // _DRAG_STEPS, y0 + (y1 - y0) * i // _DRAG_STEPS))
            out.append(act.wait(_DRAG_STEP_PAUSE))
    out += [act.wait(_DRAG_PAUSE), act.button_up(button)]
    return out


@dataclasses.dataclass
class Plan:
    """One model action as one ACI step."""

    actions: list[a.Action]
    observe: a.ScreenshotRequest | None
    # Called with the step's result; builds the ToolResult.
    finish: Callable[[aci_session.StepResult], ToolResult] | None = None
    # Asks for the pointer position after the step (cursor_position).
    cursor: bool = False


class Adapter:
    """Base of the adapters. ``display_width/height`` is the model's
    resolution (default: the screen scaled within Anthropic's image bounds,
    see model_size); ``screenshot_after_action`` returns a screenshot with
    every action, taken in the same round trip."""

    def __init__(self, session: Any = None, *, display_width: int | None = None, display_height: int | None = None,
                 screenshot_after_action: bool = True, image_format: str = "png", jpeg_quality: int = 80):
        if image_format not in ("png", "jpeg"):
            raise errors.InvalidArgument(f"adapter: image_format {image_format!r}: want png or jpeg")
        self._want = (display_width, display_height)
        self.screenshot_after_action = screenshot_after_action
        self.image_format = image_format
        self.jpeg_quality = jpeg_quality
        self.session: Any = None
        self.scaler: Scaler | None = None
        if session is not None:
            self.bind(session)

    def bind(self, session: Any) -> "Adapter":
        """Uses session (an asyncio Session or a SyncSession) and its screen."""
        self.session = session
        self.scaler = scaler_for(session, *self._want)
        return self

    @property
    def display_size(self) -> tuple[int, int]:
        """The model's resolution (give it to the model in the tool definition)."""
        self._need()
        return self.scaler.model_w, self.scaler.model_h

    def _need(self) -> None:
        if self.scaler is None:
            raise errors.FailedPrecondition("adapter: not bound to a session (bind() first)")

    def _observe(self) -> a.ScreenshotRequest:
        fmt = a.IMAGE_FORMAT_JPEG if self.image_format == "jpeg" else a.IMAGE_FORMAT_PNG
        return self.scaler.observe(fmt, self.jpeg_quality if fmt == a.IMAGE_FORMAT_JPEG else 0)

    def _shot_result(self, r: aci_session.StepResult, output: str = "") -> ToolResult:
        err = "; ".join(str(e) for _, e in r.errors())
        res = ToolResult(output=output, error=err)
        if r.observation is not None:
            res.screenshot = r.observation
            res.image = self.scaler.fit(r.observation, self.image_format)
            res.media_type = f"image/{self.image_format}"
        elif r.observation_error is not None and not err:
            res.error = str(r.observation_error)
        return res

    def translate(self, action: Mapping[str, Any]) -> Plan:
        raise NotImplementedError

    async def execute(self, action: Mapping[str, Any], session: Any = None) -> ToolResult:
        """Runs one model action in the sandbox (one step; the pointer
        position is asked in a pipelined second request when needed)."""
        if session is not None and session is not self.session:
            self.bind(session)
        self._need()
        s = self.session.aio if isinstance(self.session, _sync.SyncProxy) else self.session
        plan = self.translate(action)
        r = await s.step(plan.actions, plan.observe)
        res = plan.finish(r) if plan.finish is not None else self._shot_result(r)
        if plan.cursor:
            x, y = self.scaler.to_model(*await s.cursor_position())
            res.output = f"X={x},Y={y}"
        return res

    def execute_sync(self, action: Mapping[str, Any]) -> ToolResult:
        """execute, blocking (for a SyncSession)."""
        return _sync.run(self.execute(action))
