"""The client side of the ACI screencast (the Python side of
api/screencast): a Compositor applies ScreencastFrame events (keyframes and
delta tiles in PNG, JPEG or zlib records) onto a numpy framebuffer, detects
lost frames and asks for a keyframe.

    comp = Compositor(keyframe_requester=session_keyframes(session))
    sid = await session.screencast_start(delta=True)
    async for ev in session.events():
        if ev.WhichOneof("event") == "frame" and ev.frame.stream_id == sid:
            comp.apply(ev.frame)
            frame = comp.array            # (h, w, 4) uint8, updated in place

Offer the "screencast.zlib" capability (the default) to get zlib delta frames
on a lossless stream. Every size is checked before anything is allocated or
decoded: a keyframe's geometry against 32768 per edge, every tile and record
rectangle against the frame, every PNG/JPEG tile's header against its
rectangle, and zlib data is inflated only as far as the validated record
being read needs, so a hostile guestd cannot make the client allocate
without bound.
"""

from __future__ import annotations

import asyncio
import threading
import zlib
from typing import Callable

import numpy as np

from forkfleet import _imaging, errors
from forkfleet.aci.v1 import aci_pb2 as a

FORMAT_ZLIB = a.IMAGE_FORMAT_ZLIB_RECORDS
FORMAT_ZLIB_TILES = a.IMAGE_FORMAT_ZLIB_BGR
CAPABILITY_ZLIB = "screencast.zlib"

RGBA = "RGBA"  # R, G, B, 0xff per pixel
BGRX = "BGRX"  # B, G, R, 0xff per pixel (the X server's layout)

_OP_RAW, _OP_COPY, _OP_SOLID, _OP_END = 0, 1, 2, 3
_SYNC_FLUSH_TAIL = b"\x00\x00\xff\xff"


class Gap(errors.ForkfleetError):
    """Frames were lost (or the stream's compression context broke): the
    frame was dropped and a keyframe requested; later delta frames are
    ignored until it arrives."""


class AwaitingKeyframe(errors.ForkfleetError):
    """A delta frame arrived before any keyframe (or while a requested one
    is pending) and was ignored."""


class Corrupt(errors.ProtocolError):
    """A tile could not be decoded or lies outside the frame."""


class Stats:
    __slots__ = ("frames", "keyframes", "tiles", "bytes", "gaps", "dropped")

    def __init__(self) -> None:
        self.frames = self.keyframes = self.tiles = self.bytes = self.gaps = self.dropped = 0

    def __repr__(self) -> str:
        return "Stats(" + ", ".join(f"{k}={getattr(self, k)}" for k in self.__slots__) + ")"


def session_keyframes(session) -> Callable[[int], None]:
    """A keyframe requester that sends a ScreencastKeyframeRequest on an
    asyncio session without blocking the caller (errors are dropped: the
    next gap asks again, and keyframe_interval_ms is the backstop)."""
    def request(stream_id: int) -> None:
        task = asyncio.get_running_loop().create_task(session.screencast_keyframe(stream_id))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
    return request


class _Inflater:
    """One stream's raw DEFLATE context, read record by record: it inflates
    only as many bytes as the caller asks for, after the caller validated
    what it asks for."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.d = zlib.decompressobj(-15)
        self.pending = b""  # compressed input zlib has not consumed yet
        self.out = b""  # inflated bytes not read yet

    def feed(self, *parts: bytes) -> None:
        self.pending += b"".join(parts)

    def read(self, n: int) -> bytes:
        while len(self.out) < n:
            if not self.pending or self.d.eof:
                raise Corrupt("zlib chunk ended early")
            try:
                got = self.d.decompress(self.pending, n - len(self.out))
            except zlib.error as e:
                raise Corrupt(f"zlib: {e}") from None
            self.pending = self.d.unconsumed_tail
            self.out += got
        b, self.out = self.out[:n], self.out[n:]
        return b

    def remaining(self) -> int:
        return len(self.pending)


class Compositor:
    """Reconstructs one stream's frames into ``array`` (h, w, 4) uint8 in
    ``pixel_format`` (RGBA or BGRX). Safe to call from several threads."""

    def __init__(self, pixel_format: str = RGBA, *, keyframe_requester: Callable[[int], None] | None = None):
        if pixel_format not in (RGBA, BGRX):
            raise errors.InvalidArgument(f"pixel format {pixel_format!r}: want RGBA or BGRX")
        self.pixel_format = pixel_format
        self._rgb_index = [0, 1, 2] if pixel_format == RGBA else [2, 1, 0]
        self._request_key = keyframe_requester
        self._mu = threading.Lock()
        self.array = np.zeros((0, 0, 4), np.uint8)
        self.stream = 0
        self.seq = 0
        self.synced = False
        self._hash = b""
        self._captured_us = 0
        self._zl = _Inflater()
        self.stats = Stats()

    @property
    def size(self) -> tuple[int, int]:
        """(width, height); (0, 0) before the first keyframe."""
        return self.array.shape[1], self.array.shape[0]

    @property
    def frame_hash(self) -> bytes | None:
        """The server's frame_hash of the last applied frame (None when it carried none)."""
        return self._hash or None

    @property
    def captured_at_us(self) -> int:
        """When the server captured the last applied frame (Unix µs; 0 before
        the first keyframe), rebuilt from the deltas."""
        return self._captured_us

    def snapshot(self) -> np.ndarray:
        """A copy of the framebuffer."""
        with self._mu:
            return self.array.copy()

    def apply(self, f: a.ScreencastFrame) -> None:
        """Applies f. Raises Gap (after requesting a keyframe) for a delta
        frame that does not follow the previous one, AwaitingKeyframe for
        delta frames until a keyframe arrives, Corrupt for a frame that
        cannot be applied (the framebuffer may be partly updated; a
        keyframe is requested as for a gap)."""
        with self._mu:
            if f.keyframe:
                try:
                    self._apply_keyframe(f)
                except Corrupt:
                    self._lose(f.stream_id)
                    raise
                return
            if not self.synced:
                self.stats.dropped += 1
                raise AwaitingKeyframe("screencast: awaiting keyframe")
            if f.stream_id != self.stream or f.seq != self.seq + 1:
                self.stats.gaps += 1
                self.stats.dropped += 1
                self._lose(f.stream_id)
                raise Gap(f"screencast: stream {f.stream_id} seq {f.seq} after {self.seq}")
            h, w = self.array.shape[:2]
            if (f.width or f.height) and (f.width != w or f.height != h):
                self._lose(f.stream_id)
                raise Corrupt(f"screencast: delta frame {f.width}x{f.height} on a {w}x{h} framebuffer")
            try:
                self._apply_tiles(f)
            except Corrupt:
                self._lose(f.stream_id)
                raise
            self.seq = f.seq
            self._hash = bytes(f.frame_hash)
            if f.captured_at_ns:
                self._captured_us = f.captured_at_ns // 1000
            else:
                self._captured_us += f.captured_at_delta_us
            self.stats.frames += 1

    def _lose(self, stream: int) -> None:
        if not self.synced:
            return
        self.synced = False
        if self._request_key is not None:
            self._request_key(stream)

    def _apply_keyframe(self, f: a.ScreencastFrame) -> None:
        w, h = f.width, f.height
        if not (0 < w <= _imaging.MAX_EDGE and 0 < h <= _imaging.MAX_EDGE):
            raise Corrupt(f"screencast: keyframe size {w}x{h}")
        if self.array.shape[:2] != (h, w):
            self.array = np.zeros((h, w, 4), np.uint8)
        self._zl.reset()
        self._apply_tiles(f)
        self.stream, self.seq, self.synced = f.stream_id, f.seq, True
        self._hash = bytes(f.frame_hash)
        self._captured_us = f.captured_at_ns // 1000
        self.stats.frames += 1
        self.stats.keyframes += 1

    def _apply_tiles(self, f: a.ScreencastFrame) -> None:
        h, w = self.array.shape[:2]
        tiles = f.tiles
        rects = []
        for i, t in enumerate(tiles):
            r = t.rect
            if r.width <= 0 or r.height <= 0 or r.x < 0 or r.y < 0 or r.x + r.width > w or r.y + r.height > h:
                raise Corrupt(f"screencast: tile {i} rect ({r.x},{r.y} {r.width}x{r.height}) outside the {w}x{h} frame")
            rects.append((r.x, r.y, r.width, r.height))
        self.stats.tiles += len(tiles)
        fmt = f.format
        if fmt == FORMAT_ZLIB:
            if f.keyframe or tiles:
                raise Corrupt("screencast: a zlib records frame must be a delta frame without tiles")
            chunk = f.zlib_chunk
            self.stats.bytes += len(chunk)
            self._apply_records(chunk)
        elif fmt == FORMAT_ZLIB_TILES:
            if f.keyframe:
                raise Corrupt("screencast: a keyframe cannot use zlib tiles")
            datas = [t.data for t in tiles]
            self.stats.bytes += sum(map(len, datas))
            self._apply_zlib_tiles(datas, rects)
        elif fmt == a.IMAGE_FORMAT_NONE:
            return
        elif fmt in (a.IMAGE_FORMAT_UNSPECIFIED, a.IMAGE_FORMAT_PNG, a.IMAGE_FORMAT_JPEG):
            for i, t in enumerate(tiles):
                x, y, tw, th = rects[i]
                data = t.data
                self.stats.bytes += len(data)
                try:
                    img = _imaging.open_image(data, tw, th, f"screencast: tile {i}")
                except errors.ProtocolError as e:
                    raise Corrupt(str(e)) from None
                px = _imaging.to_array(img, "RGB")
                dst = self.array[y:y + th, x:x + tw]
                dst[..., :3] = px[..., self._rgb_index]
                dst[..., 3] = 0xFF
        else:
            raise Corrupt(f"screencast: unknown tile format {fmt}")

    # ---- zlib

    def _apply_records(self, chunk: bytes) -> None:
        zl = self._zl
        zl.feed(chunk, _SYNC_FLUSH_TAIL)
        h, w = self.array.shape[:2]
        i = 0
        while True:
            op = zl.read(1)[0]
            if op == _OP_END:
                break
            hdr = np.frombuffer(zl.read(8), "<u2")
            x, y, rw, rh = (int(v) for v in hdr)
            if rw == 0 or rh == 0 or x + rw > w or y + rh > h:
                zl.reset()
                raise Corrupt(f"screencast: zlib record {i}: rect ({x},{y} {rw}x{rh}) outside the {w}x{h} frame")
            self._record(op, x, y, rw, rh, legacy=False, index=i)
            i += 1
            self.stats.tiles += 1
        self._done(i)

    def _apply_zlib_tiles(self, datas: list[bytes], rects: list[tuple[int, int, int, int]]) -> None:
        zl = self._zl
        zl.feed(*datas)
        for i, (x, y, rw, rh) in enumerate(rects):
            op = zl.read(1)[0]
            self._record(op, x, y, rw, rh, legacy=True, index=i)
        self._done(len(rects) - 1)

    def _done(self, i: int) -> None:
        # Only the sync flush's empty stored block may be left (up to its 5
        # bytes, plus a partial byte); inflated leftovers mean bad framing.
        zl = self._zl
        if zl.out or zl.remaining() > 6:
            n = zl.remaining()
            zl.reset()
            raise Corrupt(f"screencast: zlib record {i}: {n} bytes left after the last record")

    def _record(self, op: int, x: int, y: int, rw: int, rh: int, *, legacy: bool, index: int) -> None:
        zl = self._zl
        fb = self.array
        try:
            if op == _OP_RAW:
                px = np.frombuffer(zl.read(rw * rh * 3), np.uint8).reshape(rh, rw, 3)  # B, G, R
                dst = fb[y:y + rh, x:x + rw]
                dst[..., :3] = px[..., [2, 1, 0]] if self.pixel_format == RGBA else px
                dst[..., 3] = 0xFF
            elif op == _OP_SOLID:
                b, g, r = zl.read(3)
                fb[y:y + rh, x:x + rw] = (r, g, b, 0xFF) if self.pixel_format == RGBA else (b, g, r, 0xFF)
            elif op == _OP_COPY:
                if legacy:
                    sx, sy = (int(v) for v in np.frombuffer(zl.read(8), "<i4"))
                else:
                    sx, sy = (int(v) for v in np.frombuffer(zl.read(4), "<u2"))
                h, w = fb.shape[:2]
                if sx < 0 or sy < 0 or sx + rw > w or sy + rh > h:
                    raise Corrupt(f"copy source ({sx},{sy} {rw}x{rh}) outside the frame")
                fb[y:y + rh, x:x + rw] = fb[sy:sy + rh, sx:sx + rw].copy()  # overlap-safe
            else:
                raise Corrupt(f"unknown op {op}")
        except Corrupt as e:
            zl.reset()
            raise Corrupt(f"screencast: zlib record {index}: {e}") from None
