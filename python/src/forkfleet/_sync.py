"""The synchronous facade: one background event loop per process runs the
asyncio implementation, and thin proxies turn its coroutines into blocking
calls. There is one implementation of every operation (the async one); the
sync classes only wait for it.

One loop thread serves every sync client and session of the process, so N
sync sessions cost no thread each.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import threading
from typing import Any, Awaitable, TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def loop() -> asyncio.AbstractEventLoop:
    """The process's background loop, started on first use (a daemon thread)."""
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            ready = threading.Event()
            lp = asyncio.new_event_loop()

            def run() -> None:
                asyncio.set_event_loop(lp)
                ready.set()
                lp.run_forever()

            threading.Thread(target=run, name="forkfleet-loop", daemon=True).start()
            ready.wait()
            _loop = lp
        return _loop


def run(aw: Awaitable[T]) -> T:
    """Runs aw on the background loop and waits for it. An interrupt
    (KeyboardInterrupt) cancels it there, which cancels the RPC or sends an
    ACI cancel, and is re-raised."""
    lp = loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is lp:
        raise RuntimeError("forkfleet: a sync call from the SDK's own loop thread would deadlock; use the async API")
    fut = asyncio.run_coroutine_threadsafe(_as_coro(aw), lp)
    try:
        return fut.result()
    except BaseException:
        fut.cancel()
        raise


async def _as_coro(aw: Awaitable[T]) -> T:
    return await aw


class SyncProxy:
    """Wraps an async object: its coroutine methods become blocking methods,
    its async iterators become iterators, and results that are async SDK
    objects come back wrapped in their sync class (see ``wrap``)."""

    __slots__ = ("_async",)

    def __init__(self, async_obj: Any):
        object.__setattr__(self, "_async", async_obj)

    @property
    def aio(self) -> Any:
        """The underlying asyncio object (use it on the SDK's loop only)."""
        return self._async

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._async, name)
        if inspect.iscoroutinefunction(attr):
            @functools.wraps(attr)
            def call(*args: Any, **kwargs: Any) -> Any:
                return wrap(run(attr(*args, **kwargs)))
            return call
        if inspect.isasyncgenfunction(attr):
            @functools.wraps(attr)
            def gen(*args: Any, **kwargs: Any) -> Any:
                return _iterate(attr(*args, **kwargs))
            return gen
        if callable(attr) and not isinstance(attr, type):
            @functools.wraps(attr)
            def plain(*args: Any, **kwargs: Any) -> Any:
                r = attr(*args, **kwargs)
                if hasattr(r, "__anext__"):
                    return _iterate(r)
                return wrap(r)
            return plain
        return wrap(attr)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._async, name, value)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._async!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SyncProxy):
            return self._async is other._async
        return NotImplemented

    def __hash__(self) -> int:
        return id(self._async)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# Async class -> sync proxy class, filled by the modules defining them.
_SYNC_OF: dict[type, type[SyncProxy]] = {}


def register(async_cls: type, sync_cls: type[SyncProxy]) -> None:
    _SYNC_OF[async_cls] = sync_cls


def wrap(v: Any) -> Any:
    """Wraps async SDK objects (also inside lists and tuples) in their sync class."""
    cls = _SYNC_OF.get(type(v))
    if cls is not None:
        return cls(v)
    if isinstance(v, list) and v and any(type(x) in _SYNC_OF or _has_async(x) for x in v):
        return [wrap(x) for x in v]
    if isinstance(v, tuple) and any(type(x) in _SYNC_OF for x in v):
        return tuple(wrap(x) for x in v)
    if _has_async(v):
        return v.to_sync()
    return v


def _has_async(v: Any) -> bool:
    return hasattr(v, "to_sync") and not isinstance(v, type)


def _iterate(agen: Any):
    """Drives an async generator on the background loop, one item at a time."""
    try:
        while True:
            try:
                item = run(agen.__anext__())
            except StopAsyncIteration:
                return
            yield wrap(item)
    finally:
        try:
            run(agen.aclose())
        except (RuntimeError, concurrent.futures.CancelledError):
            pass
