"""Coordinates between the model's resolution and the sandbox's screen."""

from __future__ import annotations

import base64
import dataclasses
import io
import math
from typing import Any

from forkfleet import _sync, errors
from forkfleet.aci import session as aci_session
from forkfleet.aci.v1 import aci_pb2 as a

# Anthropic's guidance for the computer tool: images with a long edge above
# 1568 px or above ~1.15 megapixels are downscaled by the API, which then
# mis-scales the model's coordinates; sending them pre-scaled avoids that.
MAX_LONG_EDGE = 1568
MAX_PIXELS = 1_150_000


def model_size(width: int, height: int, max_long_edge: int = MAX_LONG_EDGE, max_pixels: int = MAX_PIXELS) -> tuple[int, int]:
    """The largest size of the screen's aspect ratio within both bounds."""
    s = min(1.0, max_long_edge / max(width, height), math.sqrt(max_pixels / (width * height)))
    return max(int(width * s), 1), max(int(height * s), 1)


@dataclasses.dataclass(frozen=True)
class Scaler:
    """Maps model coordinates to screen coordinates and back."""

    screen_w: int
    screen_h: int
    model_w: int
    model_h: int

    def to_screen(self, x: float, y: float) -> tuple[int, int]:
        """A model point on the screen (clamped onto it: an off-screen point
        is an INVALID_ARGUMENT in guestd, and models do aim at edges)."""
        if self.model_w <= 0 or self.model_h <= 0:
            raise errors.InvalidArgument("scaler: empty model size")
        sx = int(round(float(x) * self.screen_w / self.model_w))
        sy = int(round(float(y) * self.screen_h / self.model_h))
        return min(max(sx, 0), self.screen_w - 1), min(max(sy, 0), self.screen_h - 1)

    def to_model(self, x: int, y: int) -> tuple[int, int]:
        return (int(round(x * self.model_w / self.screen_w)), int(round(y * self.model_h / self.screen_h)))

    @property
    def identity(self) -> bool:
        return (self.screen_w, self.screen_h) == (self.model_w, self.model_h)

    def observe(self, fmt: int = a.IMAGE_FORMAT_PNG, quality: int = 0) -> a.ScreenshotRequest:
        """A screenshot request guestd answers at the model's resolution
        (its area-filter downscale) when the aspect ratios agree."""
        req = a.ScreenshotRequest(format=fmt, quality=quality)
        if not self.identity and self._same_aspect():
            req.max_long_edge = max(self.model_w, self.model_h)
        return req

    def _same_aspect(self) -> bool:
        return abs(self.model_w * self.screen_h - self.model_h * self.screen_w) <= max(self.screen_w, self.screen_h)

    def fit(self, shot: aci_session.Screenshot, media: str = "png") -> bytes:
        """The screenshot's bytes at exactly the model's resolution (resized
        here only when guestd could not do it)."""
        if (shot.width, shot.height) == (self.model_w, self.model_h) and media == _media(shot.format):
            return shot.data
        img = shot.image()
        if img.size != (self.model_w, self.model_h):
            from PIL import Image
            img = img.resize((self.model_w, self.model_h), Image.LANCZOS)
        out = io.BytesIO()
        img.convert("RGB").save(out, format="PNG" if media == "png" else "JPEG")
        return out.getvalue()


def _media(fmt: int) -> str:
    return "jpeg" if fmt == a.IMAGE_FORMAT_JPEG else "png"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def scaler_for(session: Any, model_w: int | None, model_h: int | None) -> Scaler:
    """A Scaler from the session's screen (its HelloResponse)."""
    s = session.aio if isinstance(session, _sync.SyncProxy) else session
    scr = s.welcome.screen
    if not scr.width or not scr.height:
        raise errors.Unavailable("adapter: the sandbox reports no screen yet (wait_ready first)")
    if model_w is None or model_h is None:
        model_w, model_h = model_size(scr.width, scr.height)
    return Scaler(scr.width, scr.height, int(model_w), int(model_h))
