"""One client over many controlds: the rules of the Go client's
api/client/hosts.go (controld/docs/hosts.md).

New sandboxes, image pools and imports go to the host with the most room
(GetHostStatus before each placement, :func:`spread`); every later call for
a sandbox, checkpoint or pool goes to the host that owns it, learned from the
records' ``host`` field or, for an id not seen yet, by asking every host.
Lists and watches cover every host. The client only ever talks to the
endpoints it was given or that its ``dns:///`` names resolve to: a record's
host field selects among them, never an address.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import time
from typing import Any, Callable, Sequence

import grpc
import grpc.aio

from forkfleet import errors
from forkfleet.controld.v1 import controld_pb2 as pb
from forkfleet.controld.v1 import controld_pb2_grpc as pbg

REASON_HOST_UNREACHABLE = "HOST_UNREACHABLE"
REASON_AMBIGUOUS_NAME = "NAME_ON_MANY_HOSTS"
RESOLVE_INTERVAL = 30.0
_STATUS_TIMEOUT = 3.0
_MAX_OWNERS = 1 << 20
_TOKEN_PREFIX = "hosts."
_PREFIXES = ("sb-", "ck-", "pl-", "rc-")
_STUBS = {"SandboxService": pbg.SandboxServiceStub, "CheckpointService": pbg.CheckpointServiceStub,
          "PoolService": pbg.PoolServiceStub, "HostService": pbg.HostServiceStub}
_LISTS = {"ListSandboxes": "sandboxes", "ListCheckpoints": "checkpoints", "ListPools": "pools",
          "ListRecordings": "recordings"}
_RECORDS = ("forkfleet.controld.v1.Sandbox", "forkfleet.controld.v1.Checkpoint", "forkfleet.controld.v1.Pool",
            "forkfleet.controld.v1.Recording")


def spread(hosts: Sequence[pb.GetHostStatusResponse], memory_bytes: int, n: int) -> list[int]:
    """Assigns n new sandboxes of ``memory_bytes`` each (0: a host's default)
    to hosts by their status, as the Go client's ``client.Spread``: each to
    the host with the most room left (the lesser of the admission memory
    left and the memory available), counting those already assigned; a host
    without a slot or admission memory for one more is passed over while
    another has both; when none has, the one with the most admission room;
    ties to the host with fewer assigned, then the earlier one. Returns an
    index into hosts per sandbox."""
    assigned = [0] * len(hosts)
    used = [0] * len(hosts)
    out = []
    for _ in range(n):
        best, best_room, best_fits = -1, 0, False
        for i, h in enumerate(hosts):
            need = memory_bytes if memory_bytes > 0 else h.default_memory_bytes
            admission = h.max_memory_bytes - h.admitted_memory_bytes - used[i]
            room = min(admission, h.memory_available_bytes - used[i])
            fits = h.sandboxes + assigned[i] < h.max_sandboxes and admission >= need
            if not fits:
                room = admission
            better = (best < 0 or (fits and not best_fits) or
                      (fits == best_fits and (room > best_room or (room == best_room and assigned[i] < assigned[best]))))
            if better:
                best, best_room, best_fits = i, room, fits
        need = memory_bytes if memory_bytes > 0 else hosts[best].default_memory_bytes
        assigned[best] += 1
        used[best] += need
        out.append(best)
    return out


def _dns_target(t: str) -> tuple[str, str] | None:
    if not t.startswith("dns:"):
        return None
    rest = t[len("dns:"):].removeprefix("///")
    name, sep, port = rest.rpartition(":")
    if not sep or not name or not port:
        return None
    return name, port


def _is_id(s: str) -> bool:
    return len(s) == 19 and s[:3] in _PREFIXES


def unreachable(msg: str) -> errors.Unavailable:
    return errors.Unavailable(msg, reason=REASON_HOST_UNREACHABLE, grpc_code=grpc.StatusCode.UNAVAILABLE)


class Endpoint:
    """One controld of the fleet."""

    def __init__(self, target: str, channel: grpc.aio.Channel, server_name: str = ""):
        self.target = target
        self.channel = channel
        self.server_name = server_name
        self.local = target.startswith("unix")
        self.host = ""
        self.stubs = {name: cls(channel) for name, cls in _STUBS.items()}

    def method(self, service: str, name: str) -> Callable[..., Any]:
        return getattr(self.stubs[service], name)


class Router:
    """The endpoints, who owns what, and the routed calls (see the module)."""

    def __init__(self, targets: Sequence[str], make_channel: Callable[[str, str], grpc.aio.Channel],
                 lookup: Callable[[str], Any] | None = None):
        if not targets:
            raise errors.InvalidArgument("at least one controld address", field="targets")
        self.targets = list(targets)
        self._make_channel = make_channel
        self._lookup = lookup or self._resolve_name
        self.endpoints: dict[str, Endpoint] = {}
        self.order: list[str] = []
        self.owners: dict[str, str] = {}
        self.placed: dict[str, str] = {}
        self.pushed: dict[str, str] = {}
        self.resolved_at = 0.0
        self.metadata: tuple = ()

    @staticmethod
    async def _resolve_name(name: str) -> list[str]:
        infos = await asyncio.get_running_loop().getaddrinfo(name, None, type=socket.SOCK_STREAM)
        return sorted({info[4][0] for info in infos})

    def has_dns(self) -> bool:
        return any(_dns_target(t) for t in self.targets)

    async def resolve(self) -> None:
        want: list[tuple[str, str]] = []
        for t in self.targets:
            d = _dns_target(t)
            if d is None:
                want.append((t, ""))
                continue
            name, port = d
            try:
                ips = await self._lookup(name)
            except OSError as e:
                raise unreachable(f"resolve {name}: {e}") from None
            for ip in sorted(ips):
                want.append((f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}", name))
        order, keep = [], set()
        for target, server_name in want:
            if target in keep:
                continue
            keep.add(target)
            order.append(target)
            if target not in self.endpoints:
                self.endpoints[target] = Endpoint(target, self._make_channel(target, server_name), server_name)
        for target in list(self.endpoints):
            if target not in keep:
                await self.endpoints.pop(target).channel.close()
        self.order = order
        self.resolved_at = time.monotonic()

    async def maybe_resolve(self) -> None:
        """Resolves the targets the first time, and the dns:/// names again
        every RESOLVE_INTERVAL."""
        if not self.resolved_at or (self.has_dns() and time.monotonic() - self.resolved_at > RESOLVE_INTERVAL):
            await self.resolve()

    async def close(self) -> None:
        for ep in self.endpoints.values():
            await ep.channel.close()
        self.endpoints.clear()
        self.order = []

    def list(self) -> list[Endpoint]:
        """One endpoint per host, in order."""
        seen, out = set(), []
        for t in self.order:
            ep = self.endpoints[t]
            if ep.host:
                if ep.host in seen:
                    continue
                seen.add(ep.host)
            out.append(ep)
        return out

    def by_host(self, host: str) -> Endpoint | None:
        if not host:
            return None
        for t in self.order:
            if self.endpoints[t].host == host:
                return self.endpoints[t]
        return None

    def _host_error(self, ep: Endpoint, key: str, e: grpc.RpcError) -> Exception:
        err = errors.from_grpc(e)
        if isinstance(err, errors.Unavailable) and not err.reason:
            held = f", which holds {key}," if key else ""
            return unreachable(f"host {ep.host or '?'} at {ep.target}{held} is unreachable: {err.message}")
        return err

    async def statuses(self) -> list[tuple[Endpoint, pb.GetHostStatusResponse | None, Exception | None]]:
        eps = self.list()

        async def one(ep: Endpoint):
            try:
                st = await ep.stubs["HostService"].GetHostStatus(pb.GetHostStatusRequest(), timeout=_STATUS_TIMEOUT,
                                                                 metadata=self.metadata)
            except grpc.RpcError as e:
                return ep, None, self._host_error(ep, "", e)
            if st.host:
                ep.host = st.host
            return ep, st, None
        return list(await asyncio.gather(*(one(ep) for ep in eps)))

    async def placement(self, memory_bytes: int, n: int) -> list[Endpoint]:
        await self.maybe_resolve()
        up = [(ep, st) for ep, st, err in await self.statuses() if err is None]
        if not up:
            raise unreachable("no host answered its status")
        return [up[i][0] for i in spread([st for _, st in up], memory_bytes, n)]

    def learn(self, ep: Endpoint, msg: Any, depth: int = 0) -> None:
        """Records the owner of every sandbox, checkpoint and pool in msg, an
        answer of ep; endpoints of sandboxes on another host lose their unix
        path (a pid there names some other process here)."""
        if depth > 3:
            return
        name = msg.DESCRIPTOR.full_name
        if name in _RECORDS:
            host = getattr(msg, "host", "") or ep.host  # a recording is on its sandbox's host
            if not ep.host:
                ep.host = host
            if _is_id(msg.id) and host:
                if len(self.owners) >= _MAX_OWNERS:
                    self.owners.clear()
                self.owners[msg.id] = host
            return
        if name == "forkfleet.controld.v1.Endpoint":
            if not ep.local:
                msg.unix_path, msg.unix_pid_start = "", 0
            return
        for fd, value in msg.ListFields():
            if fd.message_type is None or fd.message_type.GetOptions().map_entry:
                continue
            if fd.label == fd.LABEL_REPEATED:
                for v in value:
                    self.learn(ep, v, depth + 1)
            else:
                self.learn(ep, value, depth + 1)

    @staticmethod
    def routing_key(req: Any) -> str:
        fields = req.DESCRIPTOR.fields_by_name
        for name in ("id", "sandbox_id", "checkpoint_id", "pool_id"):
            fd = fields.get(name)
            if fd is not None and fd.type == fd.TYPE_STRING and fd.label != fd.LABEL_REPEATED:
                v = getattr(req, name)
                if v:
                    return v
        return ""

    @staticmethod
    def memory_of(req: Any) -> int:
        fields = req.DESCRIPTOR.fields_by_name
        if "resources" not in fields or not req.HasField("resources"):
            return 0
        mem = req.resources.memory_bytes
        if "size" in fields:
            mem *= max(1, req.size)
        return mem

    async def owner(self, service: str, key: str) -> Endpoint:
        await self.maybe_resolve()
        host = self.owners.get(key)
        ep = self.by_host(host or "")
        if ep is not None:
            return ep
        if host is not None:
            if self.has_dns():
                await self.resolve()
                await self.statuses()
                ep = self.by_host(host)
                if ep is not None:
                    return ep
            raise unreachable(f"{key} is on host {host}, which none of the client's controld endpoints reaches now")
        try:
            return await self.locate(service, key)
        except (errors.NotFound, errors.Unavailable):
            if not self.has_dns():
                raise
            await self.resolve()
            return await self.locate(service, key)

    async def locate(self, service: str, key: str) -> Endpoint:
        """Asks every host for key and returns the one that has it."""
        await self.maybe_resolve()
        eps = self.list()
        if not eps:
            raise unreachable("no controld endpoints (the DNS names resolved to none)")
        kind = {"sb-": "sandbox", "ck-": "checkpoint", "pl-": "pool", "rc-": "recording"}.get(key[:3])
        if kind is None:
            kind = {"CheckpointService": "checkpoint", "PoolService": "pool"}.get(service, "sandbox")
        svc, method, req = {
            "sandbox": ("SandboxService", "GetSandbox", pb.GetSandboxRequest(id=key)),
            "checkpoint": ("CheckpointService", "GetCheckpoint", pb.GetCheckpointRequest(id=key)),
            "pool": ("PoolService", "GetPool", pb.GetPoolRequest(id=key)),
            "recording": ("SandboxService", "GetRecording", pb.GetRecordingRequest(id=key)),
        }[kind]

        async def one(ep: Endpoint):
            try:
                resp = await ep.method(svc, method)(req, metadata=self.metadata)
            except grpc.RpcError as e:
                return e
            self.learn(ep, resp)
            return None
        results = await asyncio.gather(*(one(ep) for ep in eps))
        found = [ep for ep, r in zip(eps, results) if r is None]
        down = [ep.target for ep, r in zip(eps, results) if r is not None and r.code() == grpc.StatusCode.UNAVAILABLE]
        other = [r for r in results if r is not None and r.code() not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE)]
        not_found = [r for r in results if r is not None and r.code() == grpc.StatusCode.NOT_FOUND]
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise errors.FailedPrecondition(
                f"{key!r} names records on {len(found)} hosts ({', '.join(ep.target for ep in found)}); use its id",
                reason=REASON_AMBIGUOUS_NAME, grpc_code=grpc.StatusCode.FAILED_PRECONDITION)
        if other:
            raise errors.from_grpc(other[0])
        if down:
            raise unreachable(f"{key} is on none of the hosts that answered, and {', '.join(down)} did not answer")
        raise errors.from_grpc(not_found[0])

    async def call(self, ep: Endpoint, key: str, service: str, name: str, req: Any, timeout: float | None,
                   metadata: Any) -> Any:
        try:
            resp = await ep.method(service, name)(req, timeout=timeout, metadata=metadata)
        except grpc.RpcError as e:
            raise self._host_error(ep, key, e) from None
        self.learn(ep, resp)
        return resp

    async def unary(self, service: str, name: str, req: Any, timeout: float | None, metadata: Any,
                    pinned: Endpoint | None = None) -> Any:
        if not self.resolved_at:
            await self.resolve()
        if pinned is not None:
            return await self.call(pinned, self.routing_key(req), service, name, req, timeout, metadata)
        if name in _LISTS:
            return await self.list_all(service, name, req, timeout, metadata)
        if name == "GetHostStatus":
            eps = self.list()
            if not eps:
                raise unreachable("no controld endpoints")
            return await self.call(eps[0], "", service, name, req, timeout, metadata)
        key = self.routing_key(req)
        if key:
            return await self.call(await self.owner(service, key), key, service, name, req, timeout, metadata)
        # A new record: the host with the most room; a repeat of a request
        # id goes where the first call went.
        req_id = getattr(req, "request_id", "") if "request_id" in req.DESCRIPTOR.fields_by_name else ""
        ep = self.by_host(self.placed.get(req_id, "")) if req_id else None
        if ep is None:
            ep = (await self.placement(self.memory_of(req), 1))[0]
            if req_id and ep.host:
                if len(self.placed) >= 1 << 16:
                    self.placed.clear()
                self.placed[req_id] = ep.host
        return await self.call(ep, "", service, name, req, timeout, metadata)

    async def list_all(self, service: str, name: str, req: Any, timeout: float | None, metadata: Any) -> Any:
        """Every host's page, merged oldest first (pools by id); the next
        token carries each host's own."""
        tokens: dict[str, str] | None = None
        if req.page_token:
            tokens = _decode_token(req.page_token)
        else:
            await self.maybe_resolve()
        eps = self.list()
        if not eps:
            raise unreachable("no controld endpoints")
        if any(not ep.host for ep in eps):
            await self.statuses()
        parts = []
        for ep in eps:
            key = ep.host or ep.target
            if tokens is not None:
                if key not in tokens:
                    continue
                parts.append((ep, key, tokens.pop(key)))
            else:
                parts.append((ep, key, ""))
        if tokens:
            raise unreachable(f"the rest of this list is on host {next(iter(tokens))}, "
                              "which none of the client's controld endpoints reaches now")

        async def one(ep: Endpoint, tok: str):
            sub = type(req)()
            sub.CopyFrom(req)
            sub.page_token = tok
            return await self.call(ep, "", service, name, sub, timeout, metadata)
        resps = await asyncio.gather(*(one(ep, tok) for ep, _, tok in parts))
        field = _LISTS[name]
        items = [it for r in resps for it in getattr(r, field)]
        if name == "ListPools":
            items.sort(key=lambda it: it.id)
        elif name == "ListRecordings":
            items.sort(key=lambda it: (it.started_at.seconds, it.started_at.nanos, it.id))
        else:
            items.sort(key=lambda it: (it.created_at.seconds, it.created_at.nanos, it.id))
        out = type(resps[0])()
        getattr(out, field).extend(items)
        nxt = {key: r.next_page_token for (_, key, _), r in zip(parts, resps) if r.next_page_token}
        if nxt:
            out.next_page_token = _encode_token(nxt)
        return out

    def watch(self, req: Any, metadata: Any) -> "_FanWatch":
        return _FanWatch(self, req, metadata)


def _encode_token(m: dict[str, str]) -> str:
    return _TOKEN_PREFIX + base64.urlsafe_b64encode(json.dumps(m, sort_keys=True).encode()).decode().rstrip("=")


def _decode_token(t: str) -> dict[str, str]:
    bad = errors.InvalidArgument("not a next_page_token of this client's hosts", field="page_token")
    if not t.startswith(_TOKEN_PREFIX):
        raise bad
    rest = t[len(_TOKEN_PREFIX):]
    try:
        m = json.loads(base64.urlsafe_b64decode(rest + "=" * (-len(rest) % 4)))
    except ValueError:
        raise bad from None
    if not isinstance(m, dict) or not m or not all(isinstance(k, str) and isinstance(v, str) for k, v in m.items()):
        raise bad
    return m


class _FanWatch:
    """WatchSandboxes on every host, merged: ``read()`` returns the next
    event of any host, ``grpc.aio.EOF`` once every stream ended, and raises
    the first host's error (HOST_UNREACHABLE for a lost one)."""

    def __init__(self, router: Router, req: Any, metadata: Any):
        self._router = router
        self._req = req
        self._metadata = metadata
        self._queue: asyncio.Queue = asyncio.Queue()
        self._calls: list = []
        self._tasks: list[asyncio.Task] = []
        self._started = False
        self._open = 0

    async def _start(self) -> None:
        self._started = True
        await self._router.maybe_resolve()
        eps = self._router.list()
        if not eps:
            raise unreachable("no controld endpoints")
        self._open = len(eps)
        for ep in eps:
            call = ep.stubs["SandboxService"].WatchSandboxes(self._req, metadata=self._metadata)
            self._calls.append(call)
            self._tasks.append(asyncio.ensure_future(self._pump(ep, call)))

    async def _pump(self, ep: Endpoint, call: Any) -> None:
        try:
            while True:
                ev = await call.read()
                if ev is grpc.aio.EOF:
                    await self._queue.put((ep, None, None))
                    return
                self._router.learn(ep, ev)
                await self._queue.put((ep, ev, None))
        except grpc.RpcError as e:
            await self._queue.put((ep, None, e))

    async def read(self) -> Any:
        if not self._started:
            await self._start()
        while True:
            ep, ev, err = await self._queue.get()
            if err is not None:
                self.cancel()
                raise self._router._host_error(ep, "", err)
            if ev is None:
                self._open -= 1
                if self._open == 0:
                    return grpc.aio.EOF
                continue
            return ev

    def cancel(self) -> None:
        for call in self._calls:
            call.cancel()
        for t in self._tasks:
            t.cancel()


class RoutedStub:
    """A service stub whose calls the router sends: what AsyncClient's
    ``sandbox_service`` and its siblings are for a client of many hosts."""

    def __init__(self, router: Router, service: str):
        self._router = router
        self._service = service

    def __getattr__(self, name: str) -> Callable[..., Any]:
        router, service = self._router, self._service
        if name == "WatchSandboxes":
            return lambda req, metadata=(), **_: router.watch(req, metadata)

        def call(req: Any, timeout: float | None = None, metadata: Any = ()) -> Any:
            return router.unary(service, name, req, timeout, metadata)
        return call
