"""Decoding images that a sandbox sent, without trusting their sizes.

The bytes come from guestd, which the host does not trust: before a PNG or
JPEG is handed to Pillow, its header's dimensions are read here and checked
against what the frame says it is (and an absolute bound), so a hostile
guestd cannot make the client allocate an arbitrarily large bitmap.
"""

from __future__ import annotations

import io
import struct

import numpy as np
from PIL import Image

from forkfleet import errors

# The largest edge accepted (the Go compositor's bound).
MAX_EDGE = 1 << 15

_PNG_SIG = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers (SOF0..SOF15 without DHT, JPG and DAC).
_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def image_size(data: bytes | memoryview) -> tuple[str, int, int]:
    """Returns (format, width, height) from a PNG or JPEG header; raises
    ProtocolError for anything else."""
    if bytes(data[:8]) == _PNG_SIG:
        if len(data) < 24 or bytes(data[12:16]) != b"IHDR":
            raise errors.ProtocolError("png: no IHDR chunk")
        w, h = struct.unpack(">II", bytes(data[16:24]))
        return "png", w, h
    if bytes(data[:2]) == b"\xff\xd8":
        i, n = 2, len(data)
        while i + 4 <= n:
            if data[i] != 0xFF:
                raise errors.ProtocolError("jpeg: bad marker")
            marker = data[i + 1]
            if marker == 0xFF:  # fill byte
                i += 1
                continue
            if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
                i += 2
                continue
            seglen = (data[i + 2] << 8) | data[i + 3]
            if seglen < 2:
                raise errors.ProtocolError("jpeg: bad segment length")
            if marker in _SOF:
                if i + 9 > n:
                    break
                h = (data[i + 5] << 8) | data[i + 6]
                w = (data[i + 7] << 8) | data[i + 8]
                return "jpeg", w, h
            if marker == 0xDA:  # start of scan before any frame header
                break
            i += 2 + seglen
        raise errors.ProtocolError("jpeg: no frame header")
    raise errors.ProtocolError("not a PNG or JPEG image")


def check_size(data: bytes | memoryview, width: int, height: int, what: str) -> None:
    """Raises ProtocolError unless the encoded image is width x height (and
    within MAX_EDGE)."""
    _, w, h = image_size(data)
    if w != width or h != height:
        raise errors.ProtocolError(f"{what}: image is {w}x{h}, expected {width}x{height}")
    if not (0 < w <= MAX_EDGE and 0 < h <= MAX_EDGE):
        raise errors.ProtocolError(f"{what}: image size {w}x{h} out of range")


def open_image(data: bytes, width: int, height: int, what: str = "image") -> Image.Image:
    """Decodes data (checked to be width x height first) with Pillow. The
    bytes are read in place (BytesIO over bytes does not copy them)."""
    check_size(data, width, height, what)
    img = Image.open(io.BytesIO(data))
    try:
        img.load()
    except (OSError, SyntaxError, ValueError) as e:
        raise errors.ProtocolError(f"{what}: {e}") from None
    return img


def to_array(img: Image.Image, mode: str = "RGB") -> np.ndarray:
    """The pixels as an (h, w, channels) uint8 array (read-only: Pillow's
    decoded pixels are the one copy made)."""
    if img.mode != mode:
        img = img.convert(mode)
    return np.asarray(img)
