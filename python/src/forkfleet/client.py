"""The client of controld's gRPC API (the Python side of api/client):
sandboxes, checkpoints and forks, export and import, warm pools, lifecycle
events, and the way from a sandbox to its ACI session.

``AsyncClient`` is the asyncio implementation; ``Client`` is the same API
blocking (it runs ``AsyncClient`` on the SDK's background loop)::

    with forkfleet.Client() as c:                 # unix:///run/forkfleet/controld.sock
        sb = c.create_sandbox(wait_ready=True)
        ck = sb.checkpoint()
        replicas = forkfleet.sandboxes(ck.fork(8))

Every error is a :mod:`forkfleet.errors` class carrying controld's
BadRequest field and ErrorInfo reason. ``timeout`` (seconds) bounds a call;
canceling the task of an async call cancels its RPC.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import ipaddress
import json
import os
import ssl as ssl_mod
import uuid
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence, TypeVar

import grpc
import grpc.aio
from google.protobuf import duration_pb2

from forkfleet import _hosts, _sync, errors
from forkfleet.controld.v1 import controld_pb2 as pb
from forkfleet.controld.v1 import controld_pb2_grpc as pbg

__all__ = [
    "AsyncClient", "AsyncSandbox", "AsyncCheckpoint", "Client", "Sandbox", "Checkpoint",
    "ForkResult", "Claim", "sandboxes", "first_error", "DEFAULT_ADDRESS", "DEFAULT_TOKEN_FILE",

]

DEFAULT_ADDRESS = "unix:///run/forkfleet/controld.sock"
DEFAULT_TOKEN_FILE = "/var/lib/forkfleet/controld/api.token"


# The gRPC service config both clients apply (the Go client's
# api/client/serviceconfig.json; a test compares them): calls safe to repeat
# are retried on UNAVAILABLE with jittered backoff, under a retry throttle.
_RETRIED = {
    "forkfleet.controld.v1.SandboxService": ["GetSandbox", "ListSandboxes", "DeleteSandbox", "WaitSandboxReady",
                                             "WatchSandboxes", "GetSandboxEndpoint", "VerifySandbox",
                                             "UpdateSandboxNetwork", "ExposePort", "CreateSandbox", "ExtendSandbox"],
    "forkfleet.controld.v1.CheckpointService": ["GetCheckpoint", "ListCheckpoints", "CreateCheckpoint", "ForkCheckpoint"],
    "forkfleet.controld.v1.PoolService": ["GetPool", "ListPools", "ClaimPool", "UpdatePool"],
    "grpc.health.v1.Health": ["Check"],
}
SERVICE_CONFIG = json.dumps({
    "methodConfig": [{
        "name": [{"service": svc, "method": m} for svc, ms in _RETRIED.items() for m in ms],
        "retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "2s", "backoffMultiplier": 2,
                        "retryableStatusCodes": ["UNAVAILABLE"]},
    }],
    "retryThrottling": {"maxTokens": 20, "tokenRatio": 0.2},
})

# Large enough for a ListSandboxes of a big host; gRPC's default is 4 MiB.
_MAX_MESSAGE = 64 << 20

T = TypeVar("T")
Seconds = float | int | datetime.timedelta


def _duration(d: Seconds | None) -> duration_pb2.Duration | None:
    if d is None:
        return None
    secs = d.total_seconds() if isinstance(d, datetime.timedelta) else float(d)
    out = duration_pb2.Duration()
    out.FromNanoseconds(int(round(secs * 1e9)))
    return out


def _seconds(d: duration_pb2.Duration) -> float:
    return d.seconds + d.nanos / 1e9


def _screen(s: Any) -> pb.Screen | None:
    if s is None or isinstance(s, pb.Screen):
        return s
    w, h, *rest = s
    return pb.Screen(width=max(int(w), 0), height=max(int(h), 0), depth=max(int(rest[0]), 0) if rest else 0)


def _resources(r: Any) -> pb.Resources | None:
    if r is None or isinstance(r, pb.Resources):
        return r
    if isinstance(r, dict):
        return pb.Resources(**r)
    cpu, mem = r
    return pb.Resources(cpu_millis=int(cpu), memory_bytes=int(mem))


def is_local_target(target: str) -> bool:
    """Whether traffic to target stays on this host (a unix socket or a
    loopback address), where a bearer token may travel in plaintext."""
    if target.startswith(("unix:", "unix-abstract:")):
        return True
    addr = target.split(":///", 1)[1] if ":///" in target else target
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise errors.InvalidArgument(f"client: target {target!r}: want unix:///path or host:port")
    return is_loopback_host(host)


def is_loopback_host(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclasses.dataclass
class ForkResult:
    """One replica's outcome: ``sandbox`` when it is usable (verified when
    asked), else ``error`` (an errors class)."""

    sandbox: Any = None
    error: errors.ForkfleetError | None = None
    verification: list = dataclasses.field(default_factory=list)
    took: float = 0.0
    # The replica's recording (fork(record=True), or a recording source).
    recording_id: str = ""

    def to_sync(self) -> "ForkResult":
        return dataclasses.replace(self, sandbox=Sandbox(self.sandbox) if self.sandbox is not None else None)


@dataclasses.dataclass
class Claim:
    """A sandbox handed out by a pool: ``hit`` when it came warm from the
    pool (False: booted or forked on demand)."""

    sandbox: Any
    hit: bool
    took: float

    def to_sync(self) -> "Claim":
        return dataclasses.replace(self, sandbox=Sandbox(self.sandbox))


def sandboxes(results: Iterable[ForkResult]) -> list:
    """The usable replicas of a fork."""
    return [r.sandbox for r in results if r.sandbox is not None]


def first_error(results: Iterable[ForkResult]) -> errors.ForkfleetError | None:
    """The first replica error of a fork, if any."""
    for r in results:
        if r.error is not None:
            return r.error
    return None


class AsyncClient:
    """Talks to one controld over gRPC (asyncio). Use it as an async context
    manager or call :meth:`close`.

    Args:
        target: ``unix:///path`` (the default socket when None) or ``host:port``.
        token: bearer token sent on every RPC. Without ``token`` or
            ``token_file``, the default token file is used when readable.
        token_file: read the token from this file.
        tls: ``True`` for TLS with the system roots, or grpc.ChannelCredentials.
        insecure: allow a token over plaintext TCP to a non-loopback host.
        timeout: default per-call timeout in seconds (None: no deadline).
        aci_options: keyword arguments of :func:`forkfleet.aci.dial` applied
            to every :meth:`AsyncSandbox.aci` session (e.g. one
            ``frame_cache`` for a fleet).
    """

    def __init__(self, target: str | None = None, *, token: str | None = None, token_file: str | None = None,
                 tls: bool | grpc.ChannelCredentials = False, insecure: bool = False,
                 timeout: float | None = None, aci_options: Mapping[str, Any] | None = None,
                 channel_options: Sequence[tuple[str, Any]] = (), hosts: Sequence[str] | None = None,
                 checkpoint_registry: str = "", resolve: Callable[[str], Awaitable[list[str]]] | None = None):
        if hosts is not None:
            if target is not None:
                raise errors.InvalidArgument("give target or hosts, not both", field="hosts")
            if not hosts:
                raise errors.InvalidArgument("at least one controld address", field="hosts")
            target = hosts[0]
        target = target or DEFAULT_ADDRESS
        if token is None:
            if token_file is not None:
                with open(token_file, encoding="utf-8") as f:
                    token = f.read().strip()
            else:
                try:
                    with open(DEFAULT_TOKEN_FILE, encoding="utf-8") as f:
                        token = f.read().strip()
                except OSError:
                    token = ""
        for t in hosts or [target]:
            local = not t.startswith("dns:") and is_local_target(t)
            if token and not local and not tls and not insecure:
                raise errors.InvalidArgument(
                    f"client: refusing to send a bearer token in plaintext to {t} "
                    "(use tls=True, or insecure=True on a trusted network)")
        opts = [("grpc.max_receive_message_length", _MAX_MESSAGE),
                ("grpc.max_send_message_length", _MAX_MESSAGE),
                # As the Go client: idempotent calls retried on UNAVAILABLE,
                # keepalive pings every 30 s (controld accepts every 15 s).
                ("grpc.enable_retries", 1), ("grpc.service_config", SERVICE_CONFIG),
                ("grpc.keepalive_time_ms", 30_000), ("grpc.keepalive_timeout_ms", 10_000),
                ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0),
                *channel_options]
        def channel(t: str, server_name: str = "") -> grpc.aio.Channel:
            if tls and not t.startswith("unix:"):
                creds = grpc.ssl_channel_credentials() if tls is True else tls
                # An address resolved from a name: the certificate names the name.
                extra = [("grpc.ssl_target_name_override", server_name)] if server_name else []
                return grpc.aio.secure_channel(t, creds, options=opts + extra)
            return grpc.aio.insecure_channel(t, options=opts)
        self.target = target
        self._metadata = (("authorization", "Bearer " + token),) if token else ()
        self._timeout = timeout
        self._aci_options = dict(aci_options or {})
        self._router: _hosts.Router | None = None
        self._registry = checkpoint_registry
        if hosts is None:
            self._channel = channel(target)
            self.sandbox_service = pbg.SandboxServiceStub(self._channel)
            self.checkpoint_service = pbg.CheckpointServiceStub(self._channel)
            self.pool_service = pbg.PoolServiceStub(self._channel)
            self.host_service = pbg.HostServiceStub(self._channel)
        else:
            # Many hosts (controld/docs/hosts.md): the same methods, routed.
            self._router = _hosts.Router(hosts, channel, resolve)
            self._router.metadata = self._metadata
            self.sandbox_service = _hosts.RoutedStub(self._router, "SandboxService")
            self.checkpoint_service = _hosts.RoutedStub(self._router, "CheckpointService")
            self.pool_service = _hosts.RoutedStub(self._router, "PoolService")
            self.host_service = _hosts.RoutedStub(self._router, "HostService")

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the channels. ACI sessions opened through the client stay open."""
        if self._router is not None:
            await self._router.close()
        else:
            await self._channel.close()

    async def host_status(self, *, timeout: float | None = None) -> pb.GetHostStatusResponse:
        """controld's host: its name (what records' ``host`` fields say),
        memory, admitted sandboxes against its admission limits, pools. A
        client of many hosts reports its first host's; :meth:`hosts` all."""
        return await self._call(self.host_service.GetHostStatus, pb.GetHostStatusRequest(), timeout)

    async def hosts(self) -> "list[tuple[str, pb.GetHostStatusResponse | None, errors.ForkfleetError | None]]":
        """Every host's status as (target, status, error), in target order."""
        if self._router is None:
            return [(self.target, await self.host_status(), None)]
        await self._router.maybe_resolve()
        return [(ep.target, st, err) for ep, st, err in await self._router.statuses()]

    async def _call(self, method: Callable[..., Awaitable[T]], req: Any, timeout: float | None) -> T:
        t = self._timeout if timeout is None else timeout
        # The creating calls (CreateSandbox, CreateCheckpoint,
        # ForkCheckpoint, ClaimPool) get a request id unless the caller gave
        # one: gRPC's retries of them (SERVICE_CONFIG) then return the first
        # attempt's result instead of creating twice.
        if "request_id" in req.DESCRIPTOR.fields_by_name and not req.request_id:
            req.request_id = str(uuid.uuid4())
        try:
            return await method(req, timeout=t, metadata=self._metadata)
        except grpc.RpcError as e:
            raise errors.from_grpc(e) from None

    # ---- sandboxes

    def sandbox(self, id: str) -> "AsyncSandbox":
        """A handle on sandbox id, without contacting controld."""
        return AsyncSandbox(self, id)

    async def create_sandbox(self, *, image: str = "", screen: Any = None, resources: Any = None,
                             env: Mapping[str, str] | None = None, labels: Mapping[str, str] | None = None,
                             ttl: Seconds | None = None, wait_ready: bool = False, network: pb.Network | None = None,
                             timeout: float | None = None, **fields: Any) -> "AsyncSandbox":
        """Boots a sandbox. ``screen`` is (width, height[, depth]) or a Screen,
        ``resources`` (cpu_millis, memory_bytes), a dict of Resources fields
        or a Resources; ``ttl`` deletes it after that many seconds;
        ``wait_ready`` returns only once it is usable; ``network`` its mode
        and policy. Other CreateSandboxRequest fields go as keywords."""
        req = pb.CreateSandboxRequest(image=image, screen=_screen(screen), resources=_resources(resources),
                                      env=dict(env or {}), labels=dict(labels or {}), ttl=_duration(ttl),
                                      wait_ready=wait_ready, network=network, **fields)
        r = await self._call(self.sandbox_service.CreateSandbox, req, timeout)
        return AsyncSandbox(self, r.sandbox.id, r.sandbox, r.endpoint)

    async def get_sandbox(self, id: str, *, timeout: float | None = None) -> "AsyncSandbox":
        sb = AsyncSandbox(self, id)
        await sb.get(timeout=timeout)
        return sb

    async def list_sandboxes(self, *, labels: Mapping[str, str] | None = None,
                             states: Sequence[int] = (), page_size: int = 0, timeout: float | None = None) -> list[pb.Sandbox]:
        """Lists sandboxes, oldest first; every label must match, any of
        ``states`` (SandboxState values). Follows the pages (``page_size``
        each, controld's 1000 when 0)."""
        return await self._pages(self.sandbox_service.ListSandboxes, "sandboxes", timeout, lambda tok: pb.ListSandboxesRequest(
            labels=dict(labels or {}), states=list(states), page_size=page_size, page_token=tok))

    async def _pages(self, method: Callable[..., Awaitable[Any]], field: str, timeout: float | None,
                     request: Callable[[str], Any]) -> list[Any]:
        """Every item of a List call, page after page."""
        out: list[Any] = []
        token = ""
        while True:
            r = await self._call(method, request(token), timeout)
            out.extend(getattr(r, field))
            if not r.next_page_token:
                return out
            token = r.next_page_token

    async def watch(self, *, ids: Sequence[str] = (), labels: Mapping[str, str] | None = None
                    ) -> AsyncIterator[pb.WatchSandboxesResponse]:
        """Streams lifecycle events, starting with an EXISTING event per
        matching sandbox. Ends when the caller stops iterating; a stream
        controld ends raises Unavailable (watch again)."""
        call = self.sandbox_service.WatchSandboxes(
            pb.WatchSandboxesRequest(ids=list(ids), labels=dict(labels or {})), metadata=self._metadata)
        try:
            while True:
                try:
                    ev = await call.read()
                except grpc.RpcError as e:
                    raise errors.from_grpc(e) from None
                if ev is grpc.aio.EOF:
                    raise errors.Unavailable("client: watch ended by controld")
                yield ev
        finally:
            call.cancel()

    # ---- checkpoints

    def recording(self, id: str) -> "AsyncRecording":
        return AsyncRecording(self, id)

    async def list_recordings(self, *, sandbox_id: str = "", timeout: float | None = None) -> list[pb.Recording]:
        """Recordings (of one sandbox when sandbox_id is set), oldest first."""
        return await self._pages(self.sandbox_service.ListRecordings, "recordings", timeout,
                                 lambda tok: pb.ListRecordingsRequest(sandbox_id=sandbox_id, page_token=tok))

    def checkpoint(self, id: str) -> "AsyncCheckpoint":
        """A handle on checkpoint id (or name), without contacting controld."""
        return AsyncCheckpoint(self, id)

    async def get_checkpoint(self, id_or_name: str, *, timeout: float | None = None) -> "AsyncCheckpoint":
        ck = AsyncCheckpoint(self, id_or_name)
        info = await ck.get(timeout=timeout)
        ck.id = info.id
        return ck

    async def list_checkpoints(self, *, labels: Mapping[str, str] | None = None, root: str = "",
                               timeout: float | None = None) -> list[pb.Checkpoint]:
        """Lists checkpoints, oldest first; ``root`` keeps those descending
        from it (itself included). Follows the pages."""
        return await self._pages(self.checkpoint_service.ListCheckpoints, "checkpoints", timeout,
                                 lambda tok: pb.ListCheckpointsRequest(labels=dict(labels or {}), root_id=root, page_token=tok))

    async def import_checkpoint(self, reference: str, *, pull: bool = False,
                                timeout: float | None = None) -> "AsyncCheckpoint":
        """Registers a checkpoint image written by :meth:`AsyncCheckpoint.export`;
        with ``pull``, fetched first from the OCI registry the reference names."""
        r = await self._call(self.checkpoint_service.ImportCheckpoint,
                             pb.ImportCheckpointRequest(reference=reference, pull=pull), timeout)
        return AsyncCheckpoint(self, r.checkpoint.id, r.checkpoint)

    async def fork_remote(self, reference: str, n: int, *, labels: Mapping[str, str] | None = None,
                          ttl: Seconds | None = None, verify: Sequence[int] = (), resources: Any = None,
                          network_policy: pb.NetworkPolicy | None = None, timeout: float | None = None,
                          **fields: Any) -> "tuple[list[ForkResult], AsyncCheckpoint]":
        """Forks n replicas of the checkpoint image ``reference`` in an OCI
        registry (pushed by ``export(push=True)``): controld pulls and imports
        it once per manifest digest and forks that import, returned with the
        replicas."""
        req = _fork_request(n, labels, ttl, verify, resources, network_policy, fields)
        req.checkpoint_reference = reference
        results, ck_id = await _fork(self, req, timeout)
        return results, AsyncCheckpoint(self, ck_id)

    # ---- pools

    async def create_pool(self, name: str, size: int, *, image: str | None = None, checkpoint: str | None = None,
                          screen: Any = None, resources: Any = None, labels: Mapping[str, str] | None = None,
                          network: pb.Network | None = None, timeout: float | None = None, **fields: Any) -> pb.Pool:
        """Creates a warm pool of ``size`` sandboxes from an image or a
        checkpoint (frozen replicas a claim thaws)."""
        if not 1 <= size <= 1 << 20:
            raise errors.InvalidArgument(f"must be at least 1 (got {size})", field="size")
        req = pb.CreatePoolRequest(name=name, size=size, screen=_screen(screen), resources=_resources(resources),
                                   labels=dict(labels or {}), network=network, **fields)
        if image is not None:
            req.image = image
        if checkpoint is not None:
            req.checkpoint_id = checkpoint.id if isinstance(checkpoint, AsyncCheckpoint) else checkpoint
        r = await self._call(self.pool_service.CreatePool, req, timeout)
        return r.pool

    async def get_pool(self, id: str, *, timeout: float | None = None) -> pb.Pool:
        return (await self._call(self.pool_service.GetPool, pb.GetPoolRequest(id=id), timeout)).pool

    async def list_pools(self, *, timeout: float | None = None) -> list[pb.Pool]:
        """Lists pools by id, following the pages."""
        return await self._pages(self.pool_service.ListPools, "pools", timeout, lambda tok: pb.ListPoolsRequest(page_token=tok))

    async def update_pool(self, id: str, size: int, *, timeout: float | None = None) -> pb.Pool:
        """Changes a pool's size: a larger pool fills up, a smaller one
        removes its warm members past the size."""
        return (await self._call(self.pool_service.UpdatePool, pb.UpdatePoolRequest(id=id, size=size), timeout)).pool

    async def delete_pool(self, id: str, *, timeout: float | None = None) -> None:
        await self._call(self.pool_service.DeletePool, pb.DeletePoolRequest(id=id), timeout)

    async def claim(self, pool: str, *, labels: Mapping[str, str] | None = None, ttl: Seconds | None = None,
                    timeout: float | None = None, **fields: Any) -> Claim:
        """Takes a usable sandbox from a pool (its id). Other
        ClaimPoolRequest fields (a network policy) go as keywords."""
        r = await self._call(self.pool_service.ClaimPool,
                             pb.ClaimPoolRequest(pool_id=pool, labels=dict(labels or {}), ttl=_duration(ttl), **fields),
                             timeout)
        return Claim(AsyncSandbox(self, r.sandbox.id, r.sandbox, r.endpoint), r.hit, _seconds(r.took))


class AsyncSandbox:
    """A handle on one sandbox; ``info`` and ``endpoint`` are the last state
    controld returned (methods refresh them)."""

    def __init__(self, client: AsyncClient, id: str, info: pb.Sandbox | None = None,
                 endpoint: pb.Endpoint | None = None):
        self.client = client
        self.id = id
        self.info = info
        self._endpoint = endpoint if endpoint is not None and (endpoint.url or endpoint.token) else None

    def __repr__(self) -> str:
        return f"<Sandbox {self.id}>"

    def _set(self, info: pb.Sandbox) -> pb.Sandbox:
        self.info = info
        return info

    async def get(self, *, timeout: float | None = None) -> pb.Sandbox:
        """Refreshes and returns the sandbox's state."""
        r = await self.client._call(self.client.sandbox_service.GetSandbox, pb.GetSandboxRequest(id=self.id), timeout)
        return self._set(r.sandbox)

    async def wait_ready(self, *, server_timeout: Seconds | None = None, timeout: float | None = None) -> pb.Sandbox:
        """Returns once the sandbox is usable (``server_timeout`` bounds the
        wait in controld, 60 s by default; ``timeout`` bounds the call)."""
        r = await self.client._call(self.client.sandbox_service.WaitSandboxReady,
                                    pb.WaitSandboxReadyRequest(id=self.id, timeout=_duration(server_timeout)), timeout)
        return self._set(r.sandbox)

    async def delete(self, *, timeout: float | None = None) -> None:
        await self.client._call(self.client.sandbox_service.DeleteSandbox, pb.DeleteSandboxRequest(id=self.id), timeout)

    async def suspend(self, *, timeout: float | None = None) -> pb.Sandbox:
        """Freezes every process of the sandbox."""
        r = await self.client._call(self.client.sandbox_service.SuspendSandbox,
                                    pb.SuspendSandboxRequest(id=self.id), timeout)
        return self._set(r.sandbox)

    async def resume(self, *, timeout: float | None = None) -> pb.Sandbox:
        r = await self.client._call(self.client.sandbox_service.ResumeSandbox,
                                    pb.ResumeSandboxRequest(id=self.id), timeout)
        return self._set(r.sandbox)

    async def verify(self, *levels: int, timeout: float | None = None) -> list[pb.VerifyResult]:
        """Runs the fork verifiers (all levels its checkpoint supports when none are given)."""
        r = await self.client._call(self.client.sandbox_service.VerifySandbox,
                                    pb.VerifySandboxRequest(id=self.id, levels=list(levels)), timeout)
        return list(r.results)

    async def update_network(self, policy: pb.NetworkPolicy, *, timeout: float | None = None) -> pb.Sandbox:
        """Replaces the network policy of a sandbox in egress mode."""
        r = await self.client._call(self.client.sandbox_service.UpdateSandboxNetwork,
                                    pb.UpdateSandboxNetworkRequest(id=self.id, policy=policy), timeout)
        return self._set(r.sandbox)

    async def expose_port(self, port: int, *, timeout: float | None = None) -> tuple[str, str]:
        """Publishes a TCP port of the sandbox through controld's gateway;
        returns (url, token): requests under url with the bearer token reach
        the port."""
        r = await self.client._call(self.client.sandbox_service.ExposePort,
                                    pb.ExposePortRequest(sandbox_id=self.id, port=port), timeout)
        return r.url, r.token

    async def view_ticket(self, *, control: bool = False, ttl: Seconds | None = None,
                          timeout: float | None = None) -> tuple[str, datetime.datetime]:
        """Mints a single-use ticket for the sandbox's live view in a browser;
        returns (url, expires_at). Open url once: it is spent for a cookie.
        control lets the viewer send mouse and keyboard input; ttl defaults to
        60 s (at most 600)."""
        r = await self.client._call(self.client.sandbox_service.CreateViewTicket,
                                    pb.CreateViewTicketRequest(sandbox_id=self.id, control=control, ttl=_duration(ttl)),
                                    timeout)
        return r.url, r.expires_at.ToDatetime(tzinfo=datetime.timezone.utc)

    async def start_recording(self, *, max_bytes: int = 0, timeout: float | None = None) -> "AsyncRecording":
        """Records the sandbox on controld's host: its delta screencast and a
        JSONL trajectory of every ACI request through controld's gateway, in
        at most max_bytes of disk (1 GiB when 0). While it records, the
        sandbox's endpoint goes through the gateway; sessions opened after
        this call are recorded."""
        r = await self.client._call(self.client.sandbox_service.StartRecording,
                                    pb.StartRecordingRequest(sandbox_id=self.id, max_bytes=max_bytes), timeout)
        self._endpoint = None
        return AsyncRecording(self.client, r.recording.id, r.recording)

    async def recordings(self, *, timeout: float | None = None) -> list[pb.Recording]:
        """The sandbox's recordings, oldest first."""
        return await self.client.list_recordings(sandbox_id=self.id, timeout=timeout)

    async def unexpose_port(self, port: int, *, timeout: float | None = None) -> None:
        await self.client._call(self.client.sandbox_service.UnexposePort,
                                pb.UnexposePortRequest(sandbox_id=self.id, port=port), timeout)

    async def endpoint(self, *, timeout: float | None = None) -> pb.Endpoint:
        """How to reach the sandbox's ACI: the endpoint controld returned with
        the sandbox, or a fresh one."""
        if self._endpoint is not None:
            return self._endpoint
        return await self.refresh_endpoint(timeout=timeout)

    async def refresh_endpoint(self, *, timeout: float | None = None) -> pb.Endpoint:
        """Fetches the endpoint from controld (a restored replica has a new token)."""
        r = await self.client._call(self.client.sandbox_service.GetSandboxEndpoint,
                                    pb.GetSandboxEndpointRequest(id=self.id), timeout)
        self._endpoint = r.endpoint
        return r.endpoint

    async def aci(self, *, timeout: float | None = None, **options: Any):
        """Opens an ACI session to the sandbox through controld's gateway.

        The session asks controld for a fresh token whenever it redials, so
        with ``reconnect=`` it follows a restore of the sandbox. ``options``
        are :func:`forkfleet.aci.dial`'s, after the client's ``aci_options``.
        """
        from forkfleet import aci  # the session module imports nothing of this one

        ep = await self.endpoint(timeout=timeout)
        if not ep.url:
            raise errors.FailedPrecondition(f"client: sandbox {self.id}: controld returned no ACI endpoint")
        first = True

        async def token_source() -> str:
            nonlocal first
            if first:
                first = False
                return ep.token
            return (await self.refresh_endpoint(timeout=timeout)).token

        opts = {**self.client._aci_options, **options}
        router = self.client._router
        if router is not None and "server_name" not in opts:
            # A host reached through a dns:/// name: its gateway URL names the
            # pod's address, its certificate the name (as the Go client).
            owner = await router.owner("SandboxService", self.id)
            if owner.server_name:
                opts["server_name"] = owner.server_name
        return await aci.dial(ep.url, token_source=token_source, timeout=timeout, **opts)

    async def extend(self, ttl: Seconds, *, timeout: float | None = None) -> pb.Sandbox:
        """Deletes the sandbox ``ttl`` seconds from now (longer or shorter
        than before)."""
        r = await self.client._call(self.client.sandbox_service.ExtendSandbox,
                                    pb.ExtendSandboxRequest(id=self.id, ttl=_duration(ttl)), timeout)
        self.info = r.sandbox
        return r.sandbox

    async def checkpoint(self, *, tier: int = 0, name: str = "", labels: Mapping[str, str] | None = None,
                         stop: bool = False, timeout: float | None = None, **fields: Any) -> "AsyncCheckpoint":
        """Captures the running sandbox (memory tier by default); it keeps
        running unless ``stop``."""
        req = pb.CreateCheckpointRequest(sandbox_id=self.id, tier=tier, name=name, labels=dict(labels or {}), stop=stop,
                                         **fields)
        r = await self.client._call(self.client.checkpoint_service.CreateCheckpoint, req, timeout)
        return AsyncCheckpoint(self.client, r.checkpoint.id, r.checkpoint)


class AsyncRecording:
    """A recording of a sandbox, kept by controld on its host
    (controld/docs/recording.md)."""

    def __init__(self, client: AsyncClient, id: str, info: pb.Recording | None = None):
        self.client, self.id, self.info = client, id, info

    def __repr__(self) -> str:
        return f"Recording({self.id!r})"

    async def get(self, *, timeout: float | None = None) -> pb.Recording:
        r = await self.client._call(self.client.sandbox_service.GetRecording, pb.GetRecordingRequest(id=self.id), timeout)
        self.info = r.recording
        return r.recording

    async def stop(self, *, timeout: float | None = None) -> pb.Recording:
        """Stops the recording; returns its final record (stop_reason says why
        it ended: CAP_REACHED at its max_bytes)."""
        r = await self.client._call(self.client.sandbox_service.StopRecording, pb.StopRecordingRequest(id=self.id), timeout)
        self.info = r.recording
        return r.recording

    async def export_mp4(self, *, fps: int = 0, timeout: float | None = None) -> pb.ExportRecordingResponse:
        """Renders the stopped recording to an MP4 on controld's host (30 fps when 0)."""
        return await self.client._call(self.client.sandbox_service.ExportRecording, pb.ExportRecordingRequest(
            id=self.id, format=pb.RECORDING_EXPORT_FORMAT_MP4, fps=fps), timeout)

    async def export_frames(self, *, timeout: float | None = None) -> pb.ExportRecordingResponse:
        """Writes one PNG per recorded frame and frames.jsonl on controld's host."""
        return await self.client._call(self.client.sandbox_service.ExportRecording, pb.ExportRecordingRequest(
            id=self.id, format=pb.RECORDING_EXPORT_FORMAT_FRAMES), timeout)

    async def download(self, path: str | os.PathLike, *, file: int = pb.RECORDING_FILE_MP4,
                       ssl: ssl_mod.SSLContext | None = None, timeout: float | None = None) -> int:
        """Streams one file of the stopped recording from controld's gateway
        to ``path`` on this machine (a temporary file beside it, renamed when
        whole) and returns its size: ``pb.RECORDING_FILE_MP4`` or
        ``RECORDING_FILE_FRAMES`` (a tar of the frames directory) of an
        export made first, ``RECORDING_FILE_TRAJECTORY`` or
        ``RECORDING_FILE_SCREENCAST``. It mints a single-use recording ticket
        and spends it on one GET, so it works from any machine that reaches
        the gateway. ``ssl`` verifies an HTTPS gateway (the system's roots
        when None)."""
        t = await self.client._call(self.client.sandbox_service.CreateRecordingTicket,
                                    pb.CreateRecordingTicketRequest(id=self.id, file=file), timeout)
        return await asyncio.to_thread(_download, t.url, os.fspath(path), ssl, timeout)

    async def delete(self, *, timeout: float | None = None) -> None:
        await self.client._call(self.client.sandbox_service.DeleteRecording, pb.DeleteRecordingRequest(id=self.id), timeout)


def _download(url: str, path: str, context: ssl_mod.SSLContext | None, timeout: float | None) -> int:
    """GETs url into path, checking the body against its Content-Length;
    nothing is left at path unless the whole body arrived."""
    import tempfile
    import urllib.error
    import urllib.request

    try:
        resp = urllib.request.urlopen(url, timeout=timeout, context=context)
    except urllib.error.HTTPError as e:
        e.close()
        if e.code == 401:
            raise errors.PermissionDenied(f"client: download: the gateway refused the ticket ({e.code})") from None
        if e.code == 409:
            raise errors.FailedPrecondition("client: download: the recording is being exported") from None
        raise errors.Unavailable(f"client: download: the gateway answered {e.code}") from None
    except OSError as e:
        raise errors.Unavailable(f"client: download: {e}") from None
    with resp:
        length = resp.headers.get("Content-Length")
        fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".part",
                                   dir=os.path.dirname(os.path.abspath(path)))
        n = 0
        try:
            with os.fdopen(fd, "wb") as out:
                while chunk := resp.read(1 << 20):
                    out.write(chunk)
                    n += len(chunk)
            if length is not None and n != int(length):
                raise errors.Unavailable(f"client: download: {n} of {length} bytes")
            os.replace(tmp, path)
        except BaseException as e:
            os.unlink(tmp)
            if isinstance(e, (OSError, ValueError)) and not isinstance(e, errors.ForkfleetError):
                raise errors.Unavailable(f"client: download: after {n} bytes: {e}") from None
            raise
    return n


class AsyncCheckpoint:
    """A handle on one checkpoint."""

    def __init__(self, client: AsyncClient, id: str, info: pb.Checkpoint | None = None):
        self.client = client
        self.id = id
        self.info = info

    def __repr__(self) -> str:
        return f"<Checkpoint {self.id}>"

    async def get(self, *, timeout: float | None = None) -> pb.Checkpoint:
        r = await self.client._call(self.client.checkpoint_service.GetCheckpoint,
                                    pb.GetCheckpointRequest(id=self.id), timeout)
        self.info = r.checkpoint
        return r.checkpoint

    async def delete(self, *, cascade: bool = False, timeout: float | None = None) -> list[str]:
        """Deletes the checkpoint (and its descendants with ``cascade``; one
        with children is refused without it) and returns the ids deleted."""
        r = await self.client._call(self.client.checkpoint_service.DeleteCheckpoint,
                                    pb.DeleteCheckpointRequest(id=self.id, cascade=cascade), timeout)
        return list(r.deleted_ids)

    async def fork(self, n: int, *, labels: Mapping[str, str] | None = None, ttl: Seconds | None = None,
                   verify: Sequence[int] = (), resources: Any = None, network_policy: pb.NetworkPolicy | None = None,
                   timeout: float | None = None, **fields: Any) -> list[ForkResult]:
        """Starts n replicas concurrently (each with ``resources`` limits and
        ``network_policy`` when given; other request fields as keywords, e.g.
        ``restore_mode=pb.RESTORE_MODE_LAZY``). The error raised is the
        request's; each replica's own failure is in its ForkResult."""
        req = _fork_request(n, labels, ttl, verify, resources, network_policy, fields)
        if self.client._router is not None and self.client._registry:
            return await _fork_across(self, req, timeout)
        req.checkpoint_id = self.id
        results, _ = await _fork(self.client, req, timeout)
        return results

    async def export(self, reference: str, *, push: bool = False,
                     timeout: float | None = None) -> pb.ExportCheckpointResponse:
        """Writes the checkpoint as an OCI image named reference into
        controld's containerd content store; with ``push``, also pushes it to
        the OCI registry the reference names (only blobs it lacks are sent)."""
        return await self.client._call(self.client.checkpoint_service.ExportCheckpoint,
                                       pb.ExportCheckpointRequest(id=self.id, reference=reference, push=push), timeout)


def _fork_request(n: int, labels: Mapping[str, str] | None, ttl: Seconds | None, verify: Sequence[int],
                  resources: Any, network_policy: pb.NetworkPolicy | None,
                  fields: Mapping[str, Any]) -> pb.ForkCheckpointRequest:
    if not 1 <= n <= 1 << 20:
        raise errors.InvalidArgument(f"must be at least 1 (got {n})", field="count")
    return pb.ForkCheckpointRequest(count=n, labels=dict(labels or {}), ttl=_duration(ttl), verify=list(verify),
                                    resources=_resources(resources), network_policy=network_policy, **fields)


async def _fork_across(ck: AsyncCheckpoint, req: pb.ForkCheckpointRequest,
                       timeout: float | None) -> list[ForkResult]:
    """The Go client's forkAcross: req.count replicas over the hosts with
    room, the checkpoint's host forking its share from the checkpoint, the
    others from its image pushed once to the client's registry (by digest);
    a share that fails as a whole fails its replicas."""
    client, router = ck.client, ck.client._router
    info = await ck.get(timeout=timeout)
    mem = req.resources.memory_bytes or info.resources.memory_bytes
    placed = await router.placement(mem, req.count)
    owner = router.by_host(info.host)
    shares: dict[Any, int] = {}
    for ep in placed:
        shares[ep] = shares.get(ep, 0) + 1
    order = sorted(shares, key=lambda ep: ep is not owner)  # the checkpoint's host first
    ref = ""
    if len(order) > 1 or order[0] is not owner:
        ref = router.pushed.get(info.id, "")
        if not ref:
            exp = await AsyncCheckpoint(client, info.id).export(f"{client._registry}:{info.id}", push=True, timeout=timeout)
            ref = f"{client._registry}@{exp.digest}"
            router.pushed[info.id] = ref

    async def share(i: int, ep: Any) -> "list[ForkResult]":
        sub = pb.ForkCheckpointRequest()
        sub.CopyFrom(req)
        sub.count = shares[ep]
        if ep is owner:
            sub.checkpoint_id = info.id
        else:
            sub.checkpoint_reference = ref
        if sub.request_id and len(order) > 1:
            sub.request_id = f"{sub.request_id}:{i}"
        elif not sub.request_id:
            sub.request_id = str(uuid.uuid4())
        try:
            r = await router.unary("CheckpointService", "ForkCheckpoint", sub,
                                   client._timeout if timeout is None else timeout, client._metadata, pinned=ep)
        except errors.InvalidArgument:
            raise
        except errors.ForkfleetError as e:
            return [ForkResult(error=e) for _ in range(shares[ep])]
        return _fork_results(client, r)
    parts = await asyncio.gather(*(share(i, ep) for i, ep in enumerate(order)))
    return [res for part in parts for res in part]


def _fork_results(client: "AsyncClient", r: pb.ForkCheckpointResponse) -> "list[ForkResult]":
    out = []
    for i, rep in enumerate(r.replicas):
        res = ForkResult(verification=list(rep.verification), took=_seconds(rep.took), recording_id=rep.recording_id)
        if rep.error_code:
            res.error = errors.from_code(rep.error_code, rep.error_message)
        elif rep.HasField("sandbox"):
            res.sandbox = AsyncSandbox(client, rep.sandbox.id, rep.sandbox, rep.endpoint)
        else:
            res.error = errors.Internal(f"client: fork replica {i}: neither sandbox nor error")
        out.append(res)
    return out


async def _fork(client: "AsyncClient", req: pb.ForkCheckpointRequest,
                timeout: float | None) -> "tuple[list[ForkResult], str]":
    """Sends a ForkCheckpoint request: its replicas and the checkpoint forked."""
    r = await client._call(client.checkpoint_service.ForkCheckpoint, req, timeout)
    return _fork_results(client, r), r.checkpoint_id


class Client(_sync.SyncProxy):
    """The blocking :class:`AsyncClient`: same methods and arguments, run on
    the SDK's background loop. ``with Client() as c:`` closes it."""

    def __init__(self, target: str | None = None, **kwargs: Any):
        async def make() -> AsyncClient:
            return AsyncClient(target, **kwargs)
        super().__init__(_sync.run(make()))


class Sandbox(_sync.SyncProxy):
    """The blocking :class:`AsyncSandbox` (``aci()`` returns a blocking
    :class:`forkfleet.aci.SyncSession`)."""


class Checkpoint(_sync.SyncProxy):
    """The blocking :class:`AsyncCheckpoint`."""


class Recording(_sync.SyncProxy):
    """The blocking :class:`AsyncRecording`."""


_sync.register(AsyncClient, Client)
_sync.register(AsyncSandbox, Sandbox)
_sync.register(AsyncCheckpoint, Checkpoint)
_sync.register(AsyncRecording, Recording)
