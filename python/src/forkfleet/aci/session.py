"""One ACI session to a sandbox's guestd (the Python side of api/aci):
pipelined typed requests over one WebSocket, pushed events, reconnection,
and fleet-wide observation dedup through a shared FrameCache."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
import random
import secrets
import ssl as ssl_mod
import time
import urllib.parse
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence

import numpy as np
from google.protobuf.message import DecodeError

from forkfleet import _imaging, _sync, errors
from forkfleet.aci import _ws, a11y
from forkfleet.aci.framecache import FrameCache, shape_of
from forkfleet.aci.v1 import aci_pb2 as a

SUBPROTOCOL = "forkfleet.aci.v1"
PROTOCOL_VERSION = 1
DEFAULT_READ_LIMIT = 64 << 20
DEFAULT_UNIX_PATH = "/aci"

# What this client understands and offers in its HelloRequest by default.
DEFAULT_CAPABILITIES = (
    "codec.png", "codec.jpeg", "codec.none", "dedup", "settle", "region", "downscale", "cursor",
    "input", "windows", "clipboard", "events.ready", "cancel", "memory", "exec", "launch",
    "files", "files.chunked", "screencast", "screencast.delta", "screencast.zlib", "checkpoint", "a11y",
)

# Requests the server can cut short (a CancelRequest follows an abandoned call).
_CANCELABLE = frozenset({"exec", "step", "screenshot"})

_MAX_CHUNK = 4 << 20
_ENVELOPE_ROOM = 64 << 10  # path, ids and framing around a chunk's bytes
_PUT_WINDOW = 4  # chunks in flight: overlaps transfer and disk writes


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Bounds automatic reconnection with full jitter: attempt n (from 0)
    waits a uniformly random time between 0 and min(``max``, ``initial`` *
    2**n) seconds, so sessions dropped together do not redial in lockstep;
    ``max_elapsed`` > 0 gives up after that long without a connection (0
    retries until close)."""

    def wait(self, attempt: int) -> float:
        return random.uniform(0.0, min(self.max, self.initial * 2.0 ** min(attempt, 62)))

    initial: float = 0.05
    max: float = 2.0
    max_elapsed: float = 0.0


class Screenshot:
    """One observation. ``data`` is the encoded image as bytes (shared with
    the FrameCache when it came from there: ``from_cache``); ``image()``
    decodes it with Pillow and ``array()`` gives the pixels as numpy, each
    after checking the encoded size against the frame's."""

    __slots__ = ("proto", "data", "from_cache")

    def __init__(self, proto: a.ScreenshotResponse, data: bytes, from_cache: bool = False):
        self.proto = proto
        self.data = data
        self.from_cache = from_cache

    format = property(lambda self: self.proto.format)
    width = property(lambda self: self.proto.width)
    height = property(lambda self: self.proto.height)
    frame_hash = property(lambda self: self.proto.frame_hash)
    not_modified = property(lambda self: self.proto.not_modified)
    region = property(lambda self: self.proto.region)
    captured_at_ns = property(lambda self: self.proto.captured_at_ns)

    def __repr__(self) -> str:
        fmt = a.ImageFormat.Name(self.proto.format) if self.proto.format in a.ImageFormat.values() else self.proto.format
        return (f"<Screenshot {fmt} {self.width}x{self.height} {len(self.data)} B"
                f"{' from cache' if self.from_cache else ''}{' not modified' if self.not_modified and not self.data else ''}>")

    def image(self):
        """The decoded PIL image."""
        if not self.data:
            raise errors.FailedPrecondition("aci: screenshot carries no image (format NONE or not_modified)")
        return _imaging.open_image(self.data, self.width, self.height, "screenshot")

    def array(self, mode: str = "RGB") -> np.ndarray:
        """The pixels as an (h, w, channels) uint8 array."""
        return _imaging.to_array(self.image(), mode)

    def save(self, path: str | os.PathLike) -> None:
        """Writes the encoded image as it came (no re-encoding)."""
        with open(path, "wb") as f:
            f.write(self.data)


class StepResult:
    """A step's reply: one ActionOutcome per action (``error`` set on the
    failed ones), and the observation or the error of its capture."""

    __slots__ = ("proto", "observation", "observation_error")

    def __init__(self, proto: a.StepResponse, observation: Screenshot | None):
        self.proto = proto
        self.observation = observation
        self.observation_error = errors.from_aci(proto.observation_error) if proto.HasField("observation_error") else None

    @property
    def outcomes(self) -> Sequence[a.ActionOutcome]:
        return self.proto.outcomes

    def errors(self) -> list[tuple[int, errors.ForkfleetError]]:
        """(index, error) of every failed action."""
        return [(i, errors.from_aci(o.error)) for i, o in enumerate(self.proto.outcomes) if o.HasField("error")]

    def raise_for_errors(self) -> "StepResult":
        """Raises the first action's error, then the observation's, if any."""
        for _, e in self.errors():
            raise e
        if self.observation_error is not None:
            raise self.observation_error
        return self


class Call:
    """A request on the wire whose reply was not collected yet (pipelining)."""

    __slots__ = ("_session", "_conn", "id", "_fut", "_cancelable")

    def __init__(self, session: "Session", conn: "_Conn", id: int, fut: asyncio.Future, cancelable: bool):
        self._session, self._conn, self.id, self._fut, self._cancelable = session, conn, id, fut, cancelable

    def __await__(self):
        return self.result().__await__()

    async def result(self, timeout: float | None = None) -> a.ServerMessage:
        """The reply. A timeout raises DeadlineExceeded and a cancelled task
        CancelledError; either way a cancelable request is abandoned on the
        server (CancelRequest) and its late reply discarded."""
        try:
            if timeout is None:
                m = await self._fut
            else:
                m = await asyncio.wait_for(self._fut, timeout)
        except asyncio.TimeoutError:
            self._abandon()
            raise errors.DeadlineExceeded(f"aci: no reply within {timeout:g}s") from None
        except asyncio.CancelledError:
            self._abandon()
            raise
        if m.WhichOneof("reply") == "error":
            raise errors.from_aci(m.error)
        return m

    def _abandon(self) -> None:
        c = self._conn
        if c.pending.pop(self.id, None) is not None and self._cancelable and "cancel" in c.caps and not c.dead:
            c.send_nowait(a.ClientMessage(id=self._session._new_id(), cancel=a.CancelRequest(target_id=self.id)))


class _Conn:
    """One WebSocket connection of a Session; a reconnect replaces it."""

    def __init__(self, session: "Session"):
        self.session = session
        self.ws: _ws.Protocol | None = None
        self.hello: a.HelloResponse = a.HelloResponse()
        self.caps: frozenset[str] = frozenset()
        self.pending: dict[int, asyncio.Future] = {}
        self.dead = False
        self.err = ""

    def on_message(self, view: memoryview) -> None:
        try:
            m = a.ServerMessage.FromString(view)
        except DecodeError as e:
            raise errors.ProtocolError(f"aci: undecodable message: {e}") from None
        mid = m.id
        if mid == 0:
            if m.WhichOneof("reply") == "event":
                self.session._dispatch(m.event)
            return
        fut = self.pending.pop(mid, None)
        if fut is not None and not fut.done():
            fut.set_result(m)
        # No waiter: the reply to an abandoned call or to a CancelRequest.

    def on_close(self, code: int, reason: str, exc: BaseException | None) -> None:
        self.dead = True
        if self.ws is not None and self.ws.protocol_error:
            self.err = f"protocol violation: {self.ws.protocol_error}"
        elif code:
            self.err = f"closed by server ({code} {reason})".strip()
        else:
            self.err = str(exc) if exc else "connection closed"
        pending, self.pending = self.pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(self.lost())
                fut.exception()  # mark retrieved: its caller may be gone
        self.session._lost(self)

    def lost(self) -> errors.ForkfleetError:
        if self.ws is not None and self.ws.protocol_error:
            return errors.ProtocolError(f"aci: {self.err}")
        return errors.ConnectionLost(f"aci: connection lost: {self.err}")

    def send_nowait(self, msg: a.ClientMessage) -> None:
        b = msg.SerializeToString()
        limit = self.hello.max_message_bytes
        if limit and len(b) > limit:
            raise errors.InvalidArgument(f"aci: request is {len(b)} bytes, server accepts at most {limit}")
        if self.dead or self.ws.transport.is_closing():
            raise self.lost()
        self.ws.send(b)


async def dial(url: str, token: str = "", *, unix_socket: str | None = None, client_name: str = "forkfleet-python",
               capabilities: Iterable[str] = DEFAULT_CAPABILITIES, read_limit: int = DEFAULT_READ_LIMIT,
               frame_cache: FrameCache | None = None, reconnect: Backoff | bool | None = None,
               on_reconnect: Callable[["Session"], Any] | None = None,
               token_source: Callable[[], Awaitable[str]] | None = None, event_buffer: int = 256,
               headers: Mapping[str, str] | None = None, ssl: ssl_mod.SSLContext | None = None,
               server_name: str = "", insecure: bool = False, timeout: float | None = 10.0) -> "Session":
    """Opens an ACI session and performs the Hello handshake.

    Args:
        url: ``ws://host:port/path`` or ``wss://...``; with ``unix_socket``
            only its path is used (``ws://guestd/aci``).
        token: bearer token (empty for a server without auth).
        unix_socket: a socket path the caller trusts (a guestd it started, a
            test server), never a sandbox's /proc/<pid>/root path.
        frame_cache: share one FrameCache between sessions for dedup.
        reconnect: redial with backoff when the connection drops (True for
            the default Backoff). Calls in flight then fail with
            ConnectionLost; calls made while reconnecting wait.
        on_reconnect: called (sync or async) after every reconnect; a changed
            ``session.generation`` means a restored replica.
        token_source: async callable giving the token on every dial and redial.
        server_name: with TLS, the name the certificate must carry instead of
            the URL's host (a gateway reached by its address, whose
            certificate names the DNS name the client resolved).
        insecure: allow a token over plaintext ws:// to a non-loopback host.
        timeout: bounds the connect and handshake (seconds).
    """
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("ws", "wss", "http", "https"):
        raise errors.InvalidArgument(f"aci: dial {url!r}: scheme must be ws or wss")
    if u.hostname is None and unix_socket is None:
        raise errors.InvalidArgument(f"aci: dial {url!r}: no host")
    if reconnect is True:
        reconnect = Backoff()
    s = Session(url=url, token=token, unix_socket=unix_socket, client_name=client_name,
                capabilities=tuple(capabilities), read_limit=read_limit, frame_cache=frame_cache,
                reconnect=reconnect or None, on_reconnect=on_reconnect, token_source=token_source,
                event_buffer=max(int(event_buffer), 1), headers=dict(headers or {}), ssl=ssl,
                server_name=server_name, insecure=insecure)
    conn = await s._dial(timeout)
    s._install(conn)
    return s


async def dial_unix(socket_path: str, token: str = "", *, path: str = DEFAULT_UNIX_PATH, **kw: Any) -> "Session":
    """Opens an ACI session over a unix socket at a path the caller trusts."""
    if not socket_path:
        raise errors.InvalidArgument("aci: dial unix: empty socket path")
    return await dial("ws://guestd" + (path if path.startswith("/") else "/" + path), token,
                      unix_socket=socket_path, **kw)


class _Sub:
    __slots__ = ("q", "waiter")

    def __init__(self, n: int):
        self.q: collections.deque = collections.deque(maxlen=n)
        self.waiter: asyncio.Future | None = None


class Session:
    """One ACI session (asyncio). Requests from any number of tasks may be
    in flight at once (pipelining); replies are matched by id. Use
    :func:`dial` to make one; close it with :meth:`close` or ``async with``."""

    def __init__(self, *, url: str, token: str, unix_socket: str | None, client_name: str,
                 capabilities: tuple[str, ...], read_limit: int, frame_cache: FrameCache | None,
                 reconnect: Backoff | None, on_reconnect: Callable | None, token_source: Callable | None,
                 event_buffer: int, headers: dict[str, str], ssl: ssl_mod.SSLContext | None,
                 server_name: str, insecure: bool):
        self.url = url
        self._token = token
        self._unix = unix_socket
        self._client_name = client_name
        self._caps_offered = capabilities
        self._read_limit = read_limit
        self.frame_cache = frame_cache
        self._reconnect = reconnect
        self._on_reconnect = on_reconnect
        self._token_source = token_source
        self._event_buffer = event_buffer
        self._headers = headers
        self._ssl = ssl
        self._server_name = server_name
        self._insecure = insecure
        self._next_id = 0
        self._conn: _Conn | None = None
        self._installed = asyncio.Event()
        self._closed = False
        self._failed: errors.ForkfleetError | None = None
        self._reconnect_task: asyncio.Task | None = None
        self._dial_lock = asyncio.Lock()
        self._subs: set[_Sub] = set()
        self.events_dropped = 0
        self.reconnects = 0
        self._last_frame: dict[tuple, tuple[bytes, int]] = {}  # per shape: own last hash, cache seq

    # ---- connection management

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    async def _dial(self, timeout: float | None) -> _Conn:
        token = self._token
        if self._token_source is not None:
            try:
                token = await self._token_source()
            except errors.ForkfleetError:
                raise
            except Exception as e:  # noqa: BLE001 - the caller's callable
                raise errors.Unavailable(f"aci: token source: {e}") from e
        u = urllib.parse.urlsplit(self.url)
        tls = u.scheme in ("wss", "https")
        host = u.hostname or "guestd"
        if token and self._unix is None and not tls and not self._insecure:
            from forkfleet.client import is_loopback_host
            if not is_loopback_host(host):
                raise errors.InvalidArgument(
                    f"aci: refusing to send a token in plaintext to {host} (use wss://, or insecure=True on a trusted network)")
        port = u.port or (443 if tls else 80)
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        hdrs = dict(self._headers)
        if token:
            hdrs["Authorization"] = "Bearer " + token
        conn = _Conn(self)
        ctx = self._ssl if self._ssl is not None else (ssl_mod.create_default_context() if tls else None)
        host_header = u.netloc.rpartition("@")[2] or host
        try:
            ws = await asyncio.wait_for(_ws.connect(
                host, port, path, subprotocol=SUBPROTOCOL, headers=hdrs, on_message=conn.on_message,
                on_close=conn.on_close, read_limit=self._read_limit, ssl=ctx, unix_socket=self._unix,
                host_header=host_header, server_hostname=self._server_name or None), timeout)
        except asyncio.TimeoutError:
            raise errors.Unavailable(f"aci: dial {self.url}: no connection within {timeout:g}s") from None
        except _ws.HandshakeError as e:
            if e.status in (401, 403):
                raise errors.PermissionDenied(f"aci: dial {self.url}: {e}") from None
            if e.status == 404:
                raise errors.NotFound(f"aci: dial {self.url}: {e}") from None
            if e.status:
                raise errors.Unavailable(f"aci: dial {self.url}: {e}") from None
            raise errors.ProtocolError(f"aci: dial {self.url}: {e}") from None
        except OSError as e:
            raise errors.Unavailable(f"aci: dial {self.url}: {e}") from None
        conn.ws = ws
        try:
            await self._handshake(conn, timeout)
        except BaseException:
            ws.transport.abort()
            raise
        return conn

    async def _handshake(self, conn: _Conn, timeout: float | None) -> None:
        hid = self._new_id()
        fut = asyncio.get_running_loop().create_future()
        conn.pending[hid] = fut
        conn.send_nowait(a.ClientMessage(id=hid, hello=a.HelloRequest(
            protocol_version=PROTOCOL_VERSION, client_name=self._client_name, capabilities=self._caps_offered)))
        try:
            m = await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise errors.Unavailable(f"aci: hello {self.url}: no reply within {timeout:g}s") from None
        except errors.ConnectionLost as e:
            raise errors.Unavailable(f"aci: hello {self.url}: {e}") from None
        kind = m.WhichOneof("reply")
        if kind == "error":
            raise errors.from_aci(m.error)
        if kind != "hello":
            raise errors.ProtocolError(f"aci: hello {self.url}: first reply is {kind}, not the hello response")
        h = m.hello
        if h.protocol_version == 0 or h.protocol_version > PROTOCOL_VERSION:
            raise errors.ProtocolError(f"aci: hello {self.url}: server speaks protocol version {h.protocol_version}, "
                                       f"client {PROTOCOL_VERSION}")
        conn.hello = h
        # A capability is in use only when both sides list it.
        conn.caps = frozenset(h.capabilities) & frozenset(self._caps_offered)

    def _install(self, conn: _Conn) -> None:
        if self._closed:
            conn.ws.transport.abort()
            return
        old, self._conn = self._conn, conn
        self._failed = None
        self._installed.set()
        self._installed = asyncio.Event()
        if old is not None and not old.dead:
            old.ws.transport.abort()

    def _lost(self, conn: _Conn) -> None:
        if conn is self._conn and not self._closed and self._reconnect is not None and \
                (self._reconnect_task is None or self._reconnect_task.done()):
            self._reconnect_task = asyncio.get_running_loop().create_task(self._reconnect_loop())

    async def _reconnect_loop(self) -> None:
        b = self._reconnect
        start = time.monotonic()
        attempt = 0
        last = ""
        while not self._closed:
            await asyncio.sleep(b.wait(attempt))  # full jitter, the first attempt too
            attempt += 1
            async with self._dial_lock:
                if self._closed or not self._conn.dead:
                    return
                try:
                    conn = await self._dial(10.0)
                except errors.ForkfleetError as e:
                    last = str(e)
                else:
                    self._install(conn)
                    self.reconnects += 1
                    if self._on_reconnect is not None:
                        r = self._on_reconnect(self)
                        if asyncio.iscoroutine(r):
                            await r
                    return
            if b.max_elapsed > 0 and time.monotonic() - start >= b.max_elapsed:
                self._failed = errors.ConnectionLost(
                    f"aci: reconnect gave up after {time.monotonic() - start:.1f}s: {last}")
                self._installed.set()
                self._installed = asyncio.Event()
                return

    async def _current(self, timeout: float | None = None) -> _Conn:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._closed:
                raise errors.SessionClosed("aci: session closed")
            if self._failed is not None:
                raise self._failed
            c = self._conn
            if not c.dead:
                return c
            if self._reconnect is None:
                raise c.lost()
            wait = self._installed
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise errors.DeadlineExceeded("aci: no connection within the timeout (reconnecting)")
            try:
                await asyncio.wait_for(wait.wait(), left)
            except asyncio.TimeoutError:
                raise errors.DeadlineExceeded("aci: no connection within the timeout (reconnecting)") from None

    async def reconnect(self, timeout: float | None = 10.0) -> None:
        """Replaces the connection with a fresh one (a new handshake;
        ``welcome`` then describes it). Calls in flight on the old one fail
        with ConnectionLost."""
        async with self._dial_lock:
            if self._closed:
                raise errors.SessionClosed("aci: session closed")
            self._install(await self._dial(timeout))

    async def close(self) -> None:
        """Ends the session: the connection closes (closing handshake, bounded
        to a second), calls in flight fail, event iterators end."""
        if self._closed:
            return
        self._closed = True
        if self._reconnect_task is not None:
            self._reconnect_task.cancel()
        c = self._conn
        if c is not None and not c.dead:
            await c.ws.close()
        self._installed.set()
        for sub in list(self._subs):
            if sub.waiter is not None and not sub.waiter.done():
                sub.waiter.set_result(None)

    async def __aenter__(self) -> "Session":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def welcome(self) -> a.HelloResponse:
        """The server's HelloResponse of the current connection (version,
        capabilities, restore generation, sandbox id, screen, boot id)."""
        return self._conn.hello

    @property
    def generation(self) -> int:
        """The restore generation of the current connection's guest: it
        changes when the session reconnected to a restored replica."""
        return self._conn.hello.generation

    def has_capability(self, name: str) -> bool:
        """Whether both sides listed capability name in the current handshake."""
        return name in self._conn.caps

    # ---- requests

    async def start(self, msg: a.ClientMessage, timeout: float | None = None) -> Call:
        """Sends one request without waiting for its reply (pipelining: the
        server runs a session's requests in the order received). The id is
        assigned here. Await the returned Call (or ``call.result()``)."""
        kind = msg.WhichOneof("request")
        if kind is None:
            raise errors.InvalidArgument("aci: empty request")
        if kind == "hello":
            raise errors.InvalidArgument("aci: hello is sent by dial")
        conn = self._conn
        if conn is None or conn.dead:
            conn = await self._current(timeout)
        self._next_id += 1
        mid = msg.id = self._next_id
        fut = asyncio.get_running_loop().create_future()
        conn.pending[mid] = fut
        try:
            conn.send_nowait(msg)
        except BaseException:
            conn.pending.pop(mid, None)
            raise
        if conn.ws._drain is not None:
            await conn.ws.drain()
        return Call(self, conn, mid, fut, kind in _CANCELABLE)

    async def request(self, msg: a.ClientMessage, timeout: float | None = None) -> a.ServerMessage:
        """Sends one request and returns its reply; an ACI Error reply raises
        its class. A timeout (DeadlineExceeded) or a cancelled task abandons
        a cancelable request (exec, step, screenshot) on the server."""
        call = await self.start(msg, timeout)
        return await call.result(timeout)

    async def _expect(self, msg: a.ClientMessage, kind: str, timeout: float | None) -> Any:
        m = await self.request(msg, timeout)
        if m.WhichOneof("reply") != kind:
            raise errors.ProtocolError(f"aci: want a {kind} reply, got {m.WhichOneof('reply')}")
        return getattr(m, kind)

    async def ping(self, payload: bytes = b"", *, timeout: float | None = None) -> bytes:
        """Round-trips payload through the server."""
        return (await self._expect(a.ClientMessage(ping=a.PingRequest(payload=payload)), "ping", timeout)).payload

    async def rtt(self, *, timeout: float | None = None) -> float:
        """One empty ping round trip, in seconds."""
        t = time.perf_counter()
        await self.ping(timeout=timeout)
        return time.perf_counter() - t

    async def step(self, actions: Sequence[a.Action], observe: a.ScreenshotRequest | None = None, *,
                   stop_on_error: bool = False, observe_tree: a.A11yTreeRequest | None = None,
                   timeout: float | None = None) -> StepResult:
        """Runs actions in order, then the observation (none when observe is
        None) and the accessibility tree (``observe_tree``, capability
        "a11y"), in one round trip. Per-action failures are in the result's
        outcomes, not raised (``raise_for_errors()`` raises them)."""
        obs_req, ob = self._prepare_observe(observe)
        req = a.StepRequest(actions=actions, stop_on_error=stop_on_error)
        if obs_req is not None:
            req.observe.CopyFrom(obs_req)
        if observe_tree is not None:
            req.observe_tree.CopyFrom(observe_tree)
        r = await self._expect(a.ClientMessage(step=req), "step", timeout)
        if r.HasField("tree"):
            a11y.check_tree(r.tree)
        obs = self._finish_observe(ob, r.observation) if r.HasField("observation") else None
        return StepResult(r, obs)

    async def screenshot(self, req: a.ScreenshotRequest | None = None, *, timeout: float | None = None,
                         **fields: Any) -> Screenshot:
        """Captures the screen (PNG unless ``req`` or fields say otherwise,
        e.g. ``format=aci.JPEG, quality=80``). With a FrameCache and a server
        that does dedup, an unchanged screen costs a not_modified reply and
        the image comes from the cache (``from_cache``)."""
        if req is None:
            req = a.ScreenshotRequest(**fields)
        send, ob = self._prepare_observe(req)
        r = await self._expect(a.ClientMessage(screenshot=send), "screenshot", timeout)
        return self._finish_observe(ob, r)

    def _prepare_observe(self, req: a.ScreenshotRequest | None):
        fc = self.frame_cache
        if fc is None or req is None or req.format == a.IMAGE_FORMAT_NONE or "dedup" not in self._conn.caps:
            return req, None
        shape = shape_of(req)
        if req.if_none_match:
            # The caller chose the hash; fill from the cache only if it holds it.
            return req, (shape, fc.lookup(shape, req.if_none_match))
        own_hash, own_seq = self._last_frame.get(shape, (b"", 0))
        e = fc.candidate(shape, own_hash, own_seq)
        if e is None:
            return req, (shape, None)
        out = a.ScreenshotRequest()
        out.CopyFrom(req)
        out.if_none_match = e.key[0]
        return out, (shape, e)

    def _finish_observe(self, ob, r: a.ScreenshotResponse) -> Screenshot:
        data = r.data  # one copy out of the message; every later use shares it
        if ob is None:
            return Screenshot(r, data)
        shape, e = ob
        fc = self.frame_cache
        if r.not_modified:
            if e is None or (r.frame_hash and r.frame_hash != e.key[0]):
                return Screenshot(r, data)  # the caller's own if_none_match
            if not r.frame_hash:
                r.frame_hash = e.key[0]
            if r.width == 0:
                r.width, r.height = e.width, e.height
            if not r.HasField("region") and e.region is not None:
                r.region.CopyFrom(e.region)
            r.format = e.key[1]
            seq = fc.record_hit(e)
            shot = Screenshot(r, e.data, from_cache=True)
        elif data:
            seq = fc.store(shape, data, r.frame_hash, r.width, r.height, r.region if r.HasField("region") else None)
            shot = Screenshot(r, data)
        else:
            return Screenshot(r, data)
        self._last_frame[shape] = (r.frame_hash, seq)
        return shot

    async def ready(self, *, timeout: float | None = None) -> a.ReadyResponse:
        """The desktop's readiness now."""
        return await self._expect(a.ClientMessage(ready=a.ReadyRequest()), "ready", timeout)

    async def wait_ready(self, *, timeout: float | None = None) -> a.ReadyResponse:
        """Returns once the desktop is ready: listens for the pushed
        ReadyEvent and re-asks with a growing interval for servers that do
        not push."""
        async def wait() -> a.ReadyResponse:
            sub = self._subscribe()
            try:
                poll = 0.05
                while True:
                    r = await self.ready()
                    if r.ready:
                        return r
                    end = time.monotonic() + poll
                    while (left := end - time.monotonic()) > 0:
                        ev = await self._next_event(sub, left)
                        if ev is not None and ev.WhichOneof("event") == "ready" and ev.ready.state.ready:
                            return ev.ready.state
                        if self._closed:
                            raise errors.SessionClosed("aci: session closed")
                    poll = min(poll * 2, 1.0)
            finally:
                self._subs.discard(sub)
        try:
            return await asyncio.wait_for(wait(), timeout)
        except asyncio.TimeoutError:
            raise errors.DeadlineExceeded(f"aci: desktop not ready within {timeout:g}s") from None

    async def cursor_position(self, *, timeout: float | None = None) -> tuple[int, int]:
        p = (await self._expect(a.ClientMessage(cursor_position=a.CursorPositionRequest()), "cursor_position",
                                timeout)).position
        return p.x, p.y

    async def screen_size(self, *, timeout: float | None = None) -> tuple[int, int]:
        r = await self._expect(a.ClientMessage(screen_size=a.ScreenSizeRequest()), "screen_size", timeout)
        return r.width, r.height

    async def a11y_tree(self, req: a.A11yTreeRequest | None = None, *, timeout: float | None = None,
                        **fields: Any) -> a.A11yTreeResponse:
        """The accessibility tree (capability "a11y"; ``root=``, ``max_nodes=``,
        ``showing_only=``, ``if_none_match=`` ... as in A11yTreeRequest). Applications
        that did not answer in time are marked in ``apps`` and the tree has
        ``partial``; ``aci.render_tree`` makes the prompt text."""
        if req is None:
            req = a.A11yTreeRequest(**fields)
        return a11y.check_tree(await self._expect(a.ClientMessage(a11y_tree=req), "a11y_tree", timeout))

    async def a11y_action(self, req: a.A11yActionRequest, *, timeout: float | None = None) -> None:
        """Acts on one element (``aci.do_action(ref, "press")``, ``focus``,
        ``set_text``, ``set_value``, ``scroll_into_view``)."""
        await self._expect(a.ClientMessage(a11y_action=req), "a11y_action", timeout)

    async def list_windows(self, *, timeout: float | None = None) -> list[a.Window]:
        return list((await self._expect(a.ClientMessage(list_windows=a.ListWindowsRequest()), "list_windows",
                                        timeout)).windows)

    async def window_action(self, window_id: int, op: int, geometry: tuple[int, int, int, int] | None = None, *,
                            timeout: float | None = None) -> None:
        """Activates, closes, moves/resizes (geometry x, y, w, h), maximizes... a window (WindowOp)."""
        req = a.WindowActionRequest(window_id=window_id, op=op)
        if geometry is not None:
            req.geometry.CopyFrom(a.Rect(x=geometry[0], y=geometry[1], width=geometry[2], height=geometry[3]))
        await self._expect(a.ClientMessage(window_action=req), "window_action", timeout)

    async def launch(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str = "",
                     timeout: float | None = None) -> int:
        """Starts a program detached on the desktop; returns its pid."""
        req = a.LaunchRequest(argv=list(argv), env=dict(env or {}), cwd=cwd)
        return (await self._expect(a.ClientMessage(launch=req), "launch", timeout)).pid

    async def clipboard_get(self, *, timeout: float | None = None) -> str:
        return (await self._expect(a.ClientMessage(clipboard_get=a.ClipboardGetRequest()), "clipboard_get",
                                   timeout)).text

    async def clipboard_set(self, text: str, *, timeout: float | None = None) -> None:
        await self._expect(a.ClientMessage(clipboard_set=a.ClipboardSetRequest(text=text)), "clipboard_set", timeout)

    async def exec(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str = "",
                   stdin: bytes = b"", exec_timeout: float = 0, max_output_bytes: int = 0,
                   timeout: float | None = None) -> a.ExecResponse:
        """Runs a command to completion. A nonzero exit status is not an
        error (check exit_code, signal, timed_out); ``exec_timeout`` is the
        server's kill timer, ``timeout`` the call's (it kills the command)."""
        if not argv:
            raise errors.InvalidArgument("aci: exec: empty argv", field="exec.argv")
        req = a.ExecRequest(argv=list(argv), env=dict(env or {}), cwd=cwd, stdin=stdin,
                            timeout_ms=int(exec_timeout * 1000), max_output_bytes=max_output_bytes)
        return await self._expect(a.ClientMessage(exec=req), "exec", timeout)

    async def run(self, *argv: str, timeout: float | None = None) -> a.ExecResponse:
        """exec with default limits."""
        return await self.exec(argv, timeout=timeout)

    async def cancel(self, target: int | Call, *, timeout: float | None = None) -> bool:
        """Asks the server to abandon an in-flight request; returns whether it was still running."""
        tid = target.id if isinstance(target, Call) else target
        return (await self._expect(a.ClientMessage(cancel=a.CancelRequest(target_id=tid)), "cancel", timeout)).found

    async def screencast_start(self, req: a.ScreencastStartRequest | None = None, *, timeout: float | None = None,
                               **fields: Any) -> int:
        """Starts pushing ScreencastFrame events (read them with events(),
        apply them with forkfleet.screencast.Compositor); returns the stream id."""
        if req is None:
            req = a.ScreencastStartRequest(**fields)
        return (await self._expect(a.ClientMessage(screencast_start=req), "screencast_start", timeout)).stream_id

    async def screencast_stop(self, stream_id: int, *, timeout: float | None = None) -> None:
        await self._expect(a.ClientMessage(screencast_stop=a.ScreencastStopRequest(stream_id=stream_id)),
                           "screencast_stop", timeout)

    async def screencast_keyframe(self, stream_id: int, *, timeout: float | None = None) -> None:
        """Asks for a keyframe (after a seq gap)."""
        await self._expect(a.ClientMessage(screencast_keyframe=a.ScreencastKeyframeRequest(stream_id=stream_id)),
                           "screencast_keyframe", timeout)

    async def memory_mark(self, value: bytes, *, timeout: float | None = None) -> None:
        """Stores value in guestd's heap for the fork memory verifier (admin token only)."""
        await self._expect(a.ClientMessage(memory_mark=a.MemoryMarkRequest(value=value)), "memory_mark", timeout)

    async def memory_challenge(self, nonce: bytes, *, timeout: float | None = None) -> bytes:
        """HMAC-SHA256(key = the marked value, nonce)."""
        return (await self._expect(a.ClientMessage(memory_challenge=a.MemoryChallengeRequest(nonce=nonce)),
                                   "memory_challenge", timeout)).mac

    async def restored(self, *, sandbox_id: str, token: str, admin_token: str, generation: int,
                       entropy: bytes | None = None, hold_apps: bool = False,
                       timeout: float | None = None) -> a.RestoredResponse:
        """Tells a freshly restored replica its identity, its tokens (both
        roles), generation and fresh entropy (controld's job; admin token only).
        With ``hold_apps`` its apps stay stopped, as dumped, until resume_apps."""
        req = a.RestoredRequest(sandbox_id=sandbox_id, token=token, admin_token=admin_token, generation=generation,
                                entropy=entropy if entropy is not None else secrets.token_bytes(32), hold_apps=hold_apps)
        return await self._expect(a.ClientMessage(restored=req), "restored", timeout)

    async def checkpoint_prepare(self, hold: float = 0, *, settle: float = 0, settle_timeout: float = 0,
                                 timeout: float | None = None) -> a.CheckpointPrepareResponse:
        """Closes every other session and holds new agent sessions off for
        ``hold`` seconds (controld's job before a CRIU dump; admin token only)."""
        req = a.CheckpointPrepareRequest(hold_ms=int(hold * 1000), settle_ms=int(settle * 1000),
                                         settle_timeout_ms=int(settle_timeout * 1000))
        return await self._expect(a.ClientMessage(checkpoint_prepare=req), "checkpoint_prepare", timeout)

    async def checkpoint_done(self, *, timeout: float | None = None) -> None:
        await self._expect(a.ClientMessage(checkpoint_done=a.CheckpointDoneRequest()), "checkpoint_done", timeout)

    async def resume_apps(self, *, timeout: float | None = None) -> int:
        """Lets the apps restored(hold_apps=True) kept stopped run (admin token
        only); returns how many processes were continued."""
        return (await self._expect(a.ClientMessage(resume_apps=a.ResumeAppsRequest()), "resume_apps",
                                   timeout)).resumed

    async def release_scratch(self, *, timeout: float | None = None) -> int:
        """Gives guestd's idle scratch memory back to the kernel (admin token
        only); returns the capture-segment bytes released."""
        return (await self._expect(a.ClientMessage(release_scratch=a.ReleaseScratchRequest()), "release_scratch",
                                   timeout)).released_bytes

    # ---- files

    def _chunk_size(self, want: int = 0) -> int:
        n = want if want > 0 else _MAX_CHUNK
        m = self._conn.hello.max_message_bytes
        if m:
            limit = min(m, 1 << 40)
            limit = limit - _ENVELOPE_ROOM if limit > 2 * _ENVELOPE_ROOM else limit // 2
            n = min(n, limit)
        return max(n, 1)

    async def put_file(self, path: str, data: bytes, *, mode: int = 0, make_parents: bool = False,
                       chunk_size: int = 0, timeout: float | None = None) -> None:
        """Writes data to path atomically (it appears complete or not at
        all); data larger than one message goes in pipelined chunks of one
        upload that the last chunk publishes."""
        if not path:
            raise errors.InvalidArgument("aci: put file: empty path", field="file_put.path")
        chunk = self._chunk_size(chunk_size)
        mode &= 0o7777
        if len(data) <= chunk:
            req = a.FilePutRequest(path=path, data=data, mode=mode, make_parents=make_parents)
            await self._expect(a.ClientMessage(file_put=req), "file_put", timeout)
            return
        if not self.has_capability("files.chunked"):
            raise errors.FailedPrecondition(f"aci: put file {path}: {len(data)} bytes need a chunked upload and the "
                                            f"server does not offer files.chunked (limit {chunk} bytes per message)")
        upload_id = secrets.token_hex(16)
        inflight: collections.deque[Call] = collections.deque()
        view = memoryview(data)
        try:
            for off in range(0, len(data), chunk):
                end = min(off + chunk, len(data))
                req = a.FilePutRequest(path=path, data=bytes(view[off:end]), mode=mode, make_parents=make_parents,
                                       upload_id=upload_id, offset=off, last=end == len(data))
                inflight.append(await self.start(a.ClientMessage(file_put=req), timeout))
                if len(inflight) == _PUT_WINDOW:
                    await inflight.popleft().result(timeout)
            while inflight:
                await inflight.popleft().result(timeout)
        finally:
            for call in inflight:
                call._abandon()

    async def get_file(self, path: str, *, max_bytes: int = 1 << 32, timeout: float | None = None) -> bytes:
        """Reads a whole file, in as many replies as it takes; a file (or a
        guestd claiming one) larger than max_bytes is ResourceExhausted
        before it is read."""
        if not path:
            raise errors.InvalidArgument("aci: get file: empty path", field="file_get.path")
        chunk = self._chunk_size()
        out: bytearray | None = None
        while True:
            r = await self._expect(a.ClientMessage(file_get=a.FileGetRequest(
                path=path, offset=len(out) if out is not None else 0, length=chunk)), "file_get", timeout)
            data = r.data
            if r.size > max_bytes or (out is not None and len(out) + len(data) > max_bytes):
                raise errors.ResourceExhausted(f"aci: get file {path}: {r.size} bytes, more than max_bytes {max_bytes}")
            if out is None:
                if r.eof:
                    return data
                out = bytearray()
            out += data
            if r.eof:
                return bytes(out)
            if not data:
                raise errors.ProtocolError(f"aci: get file {path}: empty chunk before eof")
            if len(out) > r.size:
                raise errors.ProtocolError(f"aci: get file {path}: more data than the file's size {r.size}")

    async def stat(self, path: str, *, timeout: float | None = None) -> a.FileInfo:
        return (await self._expect(a.ClientMessage(file_stat=a.FileStatRequest(path=path)), "file_stat",
                                   timeout)).info

    async def list_dir(self, path: str, *, timeout: float | None = None) -> list[a.FileInfo]:
        return list((await self._expect(a.ClientMessage(file_list=a.FileListRequest(path=path)), "file_list",
                                        timeout)).entries)

    async def mkdir(self, path: str, *, parents: bool = False, mode: int = 0, timeout: float | None = None) -> None:
        await self._expect(a.ClientMessage(file_mkdir=a.FileMkdirRequest(path=path, parents=parents,
                                                                          mode=mode & 0o7777)), "file_mkdir", timeout)

    async def delete(self, path: str, *, recursive: bool = False, timeout: float | None = None) -> None:
        await self._expect(a.ClientMessage(file_delete=a.FileDeleteRequest(path=path, recursive=recursive)),
                           "file_delete", timeout)

    # ---- events

    def _subscribe(self) -> _Sub:
        sub = _Sub(self._event_buffer)
        self._subs.add(sub)
        return sub

    async def _next_event(self, sub: _Sub, timeout: float | None) -> a.Event | None:
        if not sub.q:
            if self._closed:
                return None
            sub.waiter = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(sub.waiter, timeout)
            except asyncio.TimeoutError:
                return None
            finally:
                sub.waiter = None
        return sub.q.popleft() if sub.q else None

    def events(self) -> "EventStream":
        """Pushed events (readiness, screencast frames, cursor), from this
        call on, spanning reconnects, until the session closes or the stream
        is closed (``aclose()``). A subscriber that falls behind loses its
        oldest events (counted in ``events_dropped``); the session never
        waits for one."""
        return EventStream(self, self._subscribe())

    def on_event(self, fn: Callable[[a.Event], Any]) -> Callable[[], None]:
        """Calls fn (sync or async) for every pushed event, in order, from a
        task of its own; returns a function that stops it."""
        async def pump() -> None:
            async for ev in self.events():
                r = fn(ev)
                if asyncio.iscoroutine(r):
                    await r
        task = asyncio.get_running_loop().create_task(pump())
        return task.cancel

    def _dispatch(self, ev: a.Event) -> None:
        for sub in self._subs:
            if len(sub.q) == sub.q.maxlen:
                self.events_dropped += 1
            sub.q.append(ev)
            w = sub.waiter
            if w is not None and not w.done():
                w.set_result(None)


class EventStream:
    """An async iterator of a session's pushed events (see Session.events)."""

    def __init__(self, session: Session, sub: _Sub):
        self._s, self._sub = session, sub

    def __aiter__(self) -> "EventStream":
        return self

    async def __anext__(self) -> a.Event:
        while True:
            if self._sub not in self._s._subs:
                raise StopAsyncIteration
            ev = await self._s._next_event(self._sub, None)
            if ev is not None:
                return ev
            if self._s._closed:
                await self.aclose()
                raise StopAsyncIteration

    async def aclose(self) -> None:
        self._s._subs.discard(self._sub)
        w = self._sub.waiter
        if w is not None and not w.done():
            w.set_result(None)


class SyncSession(_sync.SyncProxy):
    """The blocking :class:`Session` (run on the SDK's background loop):
    same methods; ``events()`` is a plain iterator."""


async def _dial_sync(*args: Any, **kw: Any) -> Session:
    return await dial(*args, **kw)


def dial_sync(url: str, token: str = "", **kw: Any) -> SyncSession:
    """:func:`dial`, blocking; returns a SyncSession."""
    return SyncSession(_sync.run(_dial_sync(url, token, **kw)))


_sync.register(Session, SyncSession)
