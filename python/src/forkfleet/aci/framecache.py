"""FrameCache: fleet-wide observation dedup (the Python side of
api/aci/framecache.go, same policy).

Sessions sharing one cache ask for screenshots with ``if_none_match``; when
the server answers ``not_modified`` the image comes from the cache. Shared by
the sessions of a forked fleet, N replicas showing the same screen cost one
full frame per round and a ~100-byte ``not_modified`` for the rest.
"""

from __future__ import annotations

import collections
import dataclasses
import threading

from forkfleet.aci.v1 import aci_pb2

DEFAULT_FRAME_CACHE_BYTES = 256 << 20

_PNG = aci_pb2.IMAGE_FORMAT_PNG
_JPEG = aci_pb2.IMAGE_FORMAT_JPEG


@dataclasses.dataclass(frozen=True)
class FrameCacheStats:
    hits: int  # not_modified replies answered from the cache
    misses: int  # full frames received for requests that went through the cache
    bytes_saved: int  # image bytes the hits did not transfer
    evictions: int
    entries: int
    bytes: int


def shape_of(r: aci_pb2.ScreenshotRequest) -> tuple:
    """What makes two screenshot requests return the same bytes for the same pixels."""
    fmt = r.format or _PNG
    quality = (r.quality or 80) if fmt == _JPEG else 0
    region = (r.region.x, r.region.y, r.region.width, r.region.height) if r.HasField("region") else None
    return (fmt, quality, region, r.max_long_edge, r.include_cursor)


class _Entry:
    __slots__ = ("key", "shape", "seq", "seen", "data", "width", "height", "region")

    def __init__(self, key: tuple, shape: tuple, seq: int, data: bytes, width: int, height: int,
                 region: aci_pb2.Rect | None):
        self.key, self.shape, self.seq, self.seen = key, shape, seq, 1
        self.data, self.width, self.height, self.region = data, width, height, region


class FrameCache:
    """Recent full frames by content hash, bounded by bytes (LRU), safe for
    concurrent use. Image bytes served from it are shared: treat them as
    read-only (``bytes`` are immutable anyway)."""

    def __init__(self, max_bytes: int = 0):
        self._max = max_bytes if max_bytes > 0 else DEFAULT_FRAME_CACHE_BYTES
        self._mu = threading.Lock()
        self._size = 0
        self._entries: collections.OrderedDict[tuple, _Entry] = collections.OrderedDict()  # LRU order, newest last
        self._latest: dict[tuple, bytes] = {}  # the fleet's most recent hash per shape
        self._seq = 0
        self._hits = self._misses = self._saved = self._evictions = 0

    def stats(self) -> FrameCacheStats:
        with self._mu:
            return FrameCacheStats(self._hits, self._misses, self._saved, self._evictions,
                                   len(self._entries), self._size)

    @staticmethod
    def _key(shape: tuple, h: bytes) -> tuple:
        return (h, shape[0], shape[1])

    def candidate(self, shape: tuple, own_hash: bytes, own_seq: int) -> _Entry | None:
        """The frame whose hash goes out as if_none_match: the session's own
        last frame, unless the fleet has demonstrably moved on since the
        session last looked (the fleet's latest frame for the shape is newer
        and at least two observations confirmed it); without an own frame,
        the fleet's latest."""
        with self._mu:
            own = self._entries.get(self._key(shape, own_hash)) if own_hash else None
            latest = None
            h = self._latest.get(shape)
            if h is not None:
                latest = self._entries.get(self._key(shape, h))
            pick = own
            if latest is not None and (own is None or (latest is not own and latest.seen >= 2 and latest.seq > own_seq)):
                pick = latest
            if pick is not None:
                self._entries.move_to_end(pick.key)
            return pick

    def lookup(self, shape: tuple, h: bytes) -> _Entry | None:
        with self._mu:
            e = self._entries.get(self._key(shape, h))
            if e is not None:
                self._entries.move_to_end(e.key)
            return e

    def record_hit(self, e: _Entry) -> int:
        with self._mu:
            self._hits += 1
            self._saved += len(e.data)
            if e.seen < 1 << 20:
                e.seen += 1
            self._seq += 1
            return self._seq

    def store(self, shape: tuple, data: bytes, frame_hash: bytes, width: int, height: int,
              region: aci_pb2.Rect | None) -> int:
        """Records a full frame and makes it the fleet's latest for shape."""
        with self._mu:
            self._misses += 1
            self._seq += 1
            n = len(data)
            if n == 0 or not frame_hash or n > self._max:
                return self._seq
            key = self._key(shape, frame_hash)
            self._latest[shape] = frame_hash
            e = self._entries.get(key)
            if e is not None:
                self._entries.move_to_end(key)
                if e.seen < 1 << 20:
                    e.seen += 1
                return self._seq
            self._entries[key] = _Entry(key, shape, self._seq, data, width, height, region)
            self._size += n
            while self._size > self._max:
                _, old = self._entries.popitem(last=False)
                self._size -= len(old.data)
                self._evictions += 1
                if self._latest.get(old.shape) == old.key[0]:
                    del self._latest[old.shape]
            return self._seq
