"""The screencast Compositor on frames built here: PNG keyframes and tiles,
zlib records (raw, copy, solid), the legacy zlib tiles, gaps, and hostile
frames whose sizes must be refused before anything is allocated or decoded."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from forkfleet import screencast
from forkfleet.aci.v1 import aci_pb2 as a


def png(w: int, h: int, rgb: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (w, h), rgb).save(out, format="PNG")
    return out.getvalue()


def keyframe(w=64, h=48, rgb=(10, 20, 30), seq=1, stream=1) -> a.ScreencastFrame:
    return a.ScreencastFrame(stream_id=stream, seq=seq, keyframe=True, format=a.IMAGE_FORMAT_PNG, width=w, height=h,
                             captured_at_ns=5_000_000_000, frame_hash=b"k" * 16,
                             tiles=[a.Tile(rect=a.Rect(width=w, height=h), data=png(w, h, rgb))])


class Stream:
    """A zlib records encoder like guestd's: one raw DEFLATE stream, sync-flushed per frame."""

    def __init__(self):
        self.c = zlib.compressobj(6, zlib.DEFLATED, -15)

    def chunk(self, records: bytes) -> bytes:
        b = self.c.compress(records) + self.c.flush(zlib.Z_SYNC_FLUSH)
        assert b.endswith(b"\x00\x00\xff\xff")
        return b[:-4]


def rect(x, y, w, h) -> bytes:
    return struct.pack("<4H", x, y, w, h)


def test_keyframe_png_delta_and_zlib_records():
    requested = []
    c = screencast.Compositor(keyframe_requester=requested.append)
    with pytest.raises(screencast.AwaitingKeyframe):
        c.apply(a.ScreencastFrame(stream_id=1, seq=1, format=a.IMAGE_FORMAT_PNG))
    c.apply(keyframe())
    assert c.size == (64, 48) and c.synced and c.frame_hash == b"k" * 16
    assert tuple(c.array[0, 0]) == (10, 20, 30, 255)
    # A PNG delta tile.
    c.apply(a.ScreencastFrame(stream_id=1, seq=2, format=a.IMAGE_FORMAT_PNG, captured_at_delta_us=1000,
                              tiles=[a.Tile(rect=a.Rect(x=8, y=8, width=4, height=4), data=png(4, 4, (255, 0, 0)))]))
    assert tuple(c.array[9, 9]) == (255, 0, 0, 255) and tuple(c.array[0, 0]) == (10, 20, 30, 255)
    assert c.captured_at_us == 5_000_000 + 1000 and c.frame_hash is None
    # zlib records: raw B,G,R pixels, a solid fill, a copy, the end.
    z = Stream()
    raw = bytes([1, 2, 3]) * 6  # 3x2 pixels of B=1 G=2 R=3
    recs = (b"\x00" + rect(0, 0, 3, 2) + raw + b"\x02" + rect(20, 20, 5, 5) + bytes([9, 8, 7]) +
            b"\x01" + rect(40, 0, 3, 2) + struct.pack("<2H", 0, 0) + b"\x03")
    c.apply(a.ScreencastFrame(stream_id=1, seq=3, format=a.IMAGE_FORMAT_ZLIB_RECORDS, zlib_chunk=z.chunk(recs)))
    assert tuple(c.array[1, 2]) == (3, 2, 1, 255)
    assert tuple(c.array[22, 22]) == (7, 8, 9, 255)
    assert tuple(c.array[1, 41]) == (3, 2, 1, 255)
    # The deflate context persists across frames.
    c.apply(a.ScreencastFrame(stream_id=1, seq=4, format=a.IMAGE_FORMAT_ZLIB_RECORDS,
                              zlib_chunk=z.chunk(b"\x02" + rect(0, 40, 2, 2) + bytes([0, 0, 255]) + b"\x03")))
    assert tuple(c.array[41, 1]) == (255, 0, 0, 255)
    assert c.stats.frames == 4 and c.stats.keyframes == 1 and requested == []
    # A gap drops the frame and asks for a keyframe once.
    with pytest.raises(screencast.Gap):
        c.apply(a.ScreencastFrame(stream_id=1, seq=9, format=a.IMAGE_FORMAT_PNG))
    with pytest.raises(screencast.AwaitingKeyframe):
        c.apply(a.ScreencastFrame(stream_id=1, seq=10, format=a.IMAGE_FORMAT_PNG))
    assert requested == [1]
    c.apply(keyframe(seq=11, rgb=(1, 1, 1)))
    assert c.synced and tuple(c.array[9, 9]) == (1, 1, 1, 255)


def test_bgrx_and_legacy_zlib_tiles():
    c = screencast.Compositor(screencast.BGRX)
    c.apply(keyframe(rgb=(10, 20, 30)))
    assert tuple(c.array[0, 0]) == (30, 20, 10, 255)
    comp = zlib.compressobj(6, zlib.DEFLATED, -15)
    t1 = comp.compress(b"\x02" + bytes([1, 2, 3]))
    t2 = comp.compress(b"\x01" + struct.pack("<2i", 0, 0)) + comp.flush(zlib.Z_SYNC_FLUSH)
    c.apply(a.ScreencastFrame(stream_id=1, seq=2, format=a.IMAGE_FORMAT_ZLIB_BGR, tiles=[
        a.Tile(rect=a.Rect(x=0, y=0, width=2, height=2), data=t1),
        a.Tile(rect=a.Rect(x=10, y=10, width=2, height=2), data=t2)]))
    assert tuple(c.array[0, 0]) == (1, 2, 3, 255) and tuple(c.array[11, 11]) == (1, 2, 3, 255)


def test_hostile_sizes_are_refused_before_allocation():
    c = screencast.Compositor()
    # A keyframe claiming a gigantic frame: refused, nothing allocated.
    with pytest.raises(screencast.Corrupt):
        c.apply(a.ScreencastFrame(stream_id=1, seq=1, keyframe=True, format=a.IMAGE_FORMAT_PNG,
                                  width=1 << 20, height=1 << 20))
    assert c.array.size == 0
    c.apply(keyframe())
    # A PNG tile whose header says 100000x100000 inside a 4x4 rect: refused
    # from its header, never decoded.
    bomb = bytearray(png(4, 4, (0, 0, 0)))
    bomb[16:24] = struct.pack(">II", 100_000, 100_000)
    with pytest.raises(screencast.Corrupt, match="100000x100000"):
        c.apply(a.ScreencastFrame(stream_id=1, seq=2, format=a.IMAGE_FORMAT_PNG,
                                  tiles=[a.Tile(rect=a.Rect(width=4, height=4), data=bytes(bomb))]))
    c.apply(keyframe(seq=3))
    # A tile outside the frame.
    with pytest.raises(screencast.Corrupt, match="outside"):
        c.apply(a.ScreencastFrame(stream_id=1, seq=4, format=a.IMAGE_FORMAT_PNG,
                                  tiles=[a.Tile(rect=a.Rect(x=60, y=0, width=10, height=10), data=png(10, 10, (0, 0, 0)))]))
    c.apply(keyframe(seq=5))
    # A zlib record whose rect lies outside the frame is refused before its
    # pixels are inflated; a compressed bomb (a raw record of a valid rect,
    # then megabytes of zeros) is inflated only as far as the record needs
    # and then refused for its leftovers.
    z = Stream()
    with pytest.raises(screencast.Corrupt, match="outside"):
        c.apply(a.ScreencastFrame(stream_id=1, seq=6, format=a.IMAGE_FORMAT_ZLIB_RECORDS,
                                  zlib_chunk=z.chunk(b"\x00" + rect(0, 0, 60000, 60000) + b"\x00" * 1000)))
    c.apply(keyframe(seq=7))
    z = Stream()
    bomb = b"\x00" + rect(0, 0, 2, 2) + b"\x00" * 12 + b"\x03" + b"\x00" * (64 << 20)
    chunk = z.chunk(bomb)
    assert len(chunk) < 200_000
    with pytest.raises(screencast.Corrupt, match="left after"):
        c.apply(a.ScreencastFrame(stream_id=1, seq=8, format=a.IMAGE_FORMAT_ZLIB_RECORDS, zlib_chunk=chunk))
    c.apply(keyframe(seq=9))
    # A chunk that ends inside a record.
    z = Stream()
    with pytest.raises(screencast.Corrupt, match="ended early"):
        c.apply(a.ScreencastFrame(stream_id=1, seq=10, format=a.IMAGE_FORMAT_ZLIB_RECORDS,
                                  zlib_chunk=z.chunk(b"\x00" + rect(0, 0, 4, 4) + b"\x00" * 5)))
    # Zlib records on a keyframe, an unknown format.
    with pytest.raises(screencast.Corrupt):
        c.apply(a.ScreencastFrame(stream_id=1, seq=1, keyframe=True, width=4, height=4,
                                  format=a.IMAGE_FORMAT_ZLIB_RECORDS))
    with pytest.raises(screencast.Corrupt):
        c.apply(a.ScreencastFrame(stream_id=1, seq=1, keyframe=True, width=4, height=4, format=77))


def test_screenshot_image_checks_its_header():
    from forkfleet import _imaging, errors
    data = png(8, 8, (1, 2, 3))
    assert _imaging.image_size(data) == ("png", 8, 8)
    with pytest.raises(errors.ProtocolError):
        _imaging.open_image(data, 9, 8)
    jpg = io.BytesIO()
    Image.new("RGB", (17, 5)).save(jpg, format="JPEG")
    assert _imaging.image_size(jpg.getvalue()) == ("jpeg", 17, 5)
    with pytest.raises(errors.ProtocolError):
        _imaging.image_size(b"GIF89a....")
    arr = _imaging.to_array(_imaging.open_image(data, 8, 8))
    assert arr.shape == (8, 8, 3) and arr.dtype == np.uint8
