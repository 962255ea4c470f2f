"""forkfleet.Client over many controlds (controld/docs/hosts.md) against
fakes standing in for a fleet's hosts (api/cmd/controldfake --hosts, one
shared registry): placement by room, routing of later calls, merged lists
and watches, forks spread over hosts, a lost host."""

from __future__ import annotations

import asyncio

import pytest

import forkfleet
from forkfleet import _hosts
from forkfleet.controld.v1 import controld_pb2 as pb
from conftest import Fake, run_async

GIB = 1 << 30


@pytest.fixture()
def fleet(fake_binary):
    f = Fake(fake_binary, hosts="host-a=3GiB,host-b=8GiB")
    yield f
    f.close()


def _status(admitted, max_mem, avail, n, max_n):
    return pb.GetHostStatusResponse(admitted_memory_bytes=admitted, max_memory_bytes=max_mem, memory_available_bytes=avail,
                                    sandboxes=n, max_sandboxes=max_n, default_memory_bytes=GIB)


@pytest.mark.parametrize("hosts,mem,n,want", [
    ([_status(0, 4 * GIB, 64 * GIB, 0, 10), _status(0, 8 * GIB, 64 * GIB, 0, 10)], GIB, 1, [1]),
    ([_status(0, 4 * GIB, 64 * GIB, 0, 10), _status(0, 8 * GIB, 2 * GIB, 0, 10)], GIB, 1, [0]),
    ([_status(0, 8 * GIB, 64 * GIB, 0, 10), _status(0, 8 * GIB, 64 * GIB, 0, 10)], GIB, 4, [0, 1, 0, 1]),
    ([_status(0, 2 * GIB, 64 * GIB, 0, 10), _status(0, 5 * GIB, 64 * GIB, 0, 10)], GIB, 4, [1, 1, 1, 0]),
    ([_status(0, 8 * GIB, 64 * GIB, 10, 10), _status(0, 2 * GIB, 64 * GIB, 0, 10)], GIB, 2, [1, 1]),
    ([_status(0, 3 * GIB, 64 * GIB, 0, 10), _status(0, 2 * GIB, 64 * GIB, 0, 10)], 0, 3, [0, 1, 0]),
    ([_status(4 * GIB, 4 * GIB, 64 * GIB, 1, 10), _status(7 * GIB, 8 * GIB, 64 * GIB, 1, 10)], 2 * GIB, 1, [1]),
])
def test_spread(hosts, mem, n, want):
    # The Go client's TestSpread table: one rule in both clients.
    assert _hosts.spread(hosts, mem, n) == want


def test_placement_and_routing(fleet):
    a, b = fleet.hosts["host-a"], fleet.hosts["host-b"]
    with forkfleet.Client(hosts=[a, b], token="") as c:
        assert [st.host for _, st, err in c.hosts()] == ["host-a", "host-b"]
        placed = [c.create_sandbox(resources={"memory_bytes": GIB}) for _ in range(6)]
        on = [sb.info.host for sb in placed]
        # 8 GiB and 3 GiB of room: b takes the first five, then a.
        assert on.count("host-b") == 5 and on.count("host-a") == 1
        on_b = [sb for sb in placed if sb.info.host == "host-b"]
        ck = on_b[0].checkpoint(name="base")
        assert ck.info.host == "host-b"
        # A second client never saw these ids: it finds their hosts.
        with forkfleet.Client(hosts=[b, a], token="") as c2:
            for sb in placed:
                assert c2.get_sandbox(sb.id).info.host == sb.info.host
            assert c2.get_checkpoint("base").id == ck.id
            with pytest.raises(forkfleet.NotFound):
                c2.get_sandbox("sb-aaaaaaaaaaaaaaaa")
            everything = c2.list_sandboxes()
            assert len(everything) == 6
            created = [(x.created_at.seconds, x.created_at.nanos) for x in everything]
            assert created == sorted(created)
            # Pages of 2 from each host, the next token carrying both hosts'.
            assert sorted(x.id for x in c2.list_sandboxes(page_size=2)) == sorted(x.id for x in everything)
        pool = c.create_pool("warm", 1, checkpoint=ck.id)
        assert pool.host == "host-b"
        assert c.claim(pool.id).sandbox.info.host == "host-b"


def test_fork_across_hosts(fleet):
    a, b = fleet.hosts["host-a"], fleet.hosts["host-b"]
    with forkfleet.Client(hosts=[a, b], token="", checkpoint_registry="127.0.0.1:5000/forkfleet/ck") as c:
        src = c.create_sandbox(resources={"memory_bytes": GIB})
        assert src.info.host == "host-b"
        ck = src.checkpoint()
        # b has 7 GiB left, a 3: 1 GiB replicas fill b to a's level, then
        # alternate (client.Spread): 6 on b, 2 on a.
        results = ck.fork(8, request_id="py-fork-1")
        assert forkfleet.first_error(results) is None
        hosts = [r.sandbox.info.host for r in results]
        assert hosts == ["host-b"] * 6 + ["host-a"] * 2  # the checkpoint's host first
        assert results[0].sandbox.info.checkpoint_id == ck.id
        assert results[-1].sandbox.info.checkpoint_id != ck.id  # a's import
        for r in results:
            r.sandbox.delete()


@run_async
async def test_watch_and_host_loss(fake_binary):
    f = Fake(fake_binary, hosts="host-a=4GiB,host-b=4GiB")
    try:
        a, b = f.hosts["host-a"], f.hosts["host-b"]
        async with forkfleet.AsyncClient(hosts=[a, b], token="") as c:
            s1 = await c.create_sandbox()
            s2 = await c.create_sandbox(resources={"memory_bytes": 64 << 20})
            s3 = await c.create_sandbox()
            # A tie goes to a; then b has more room, twice.
            assert [s.info.host for s in (s1, s2, s3)] == ["host-a", "host-b", "host-b"]
            seen = set()
            async for ev in c.watch():
                seen.add(ev.sandbox.host)
                if len(seen) == 2:
                    break
            on_b = next(s for s in (s1, s2, s3) if s.info.host == "host-b")
            on_a = next(s for s in (s1, s2, s3) if s.info.host == "host-a")
            f.command("stop-host host-b")
            with pytest.raises(forkfleet.Unavailable) as e:
                await on_b.get(timeout=30)
            assert e.value.reason == "HOST_UNREACHABLE"
            assert (await on_a.get()).id == on_a.id
            again = await c.create_sandbox()
            assert again.info.host == "host-a"
            with pytest.raises(forkfleet.Unavailable) as e:
                await c.list_sandboxes(timeout=30)
            assert e.value.reason == "HOST_UNREACHABLE"
    finally:
        f.close()


@run_async
async def test_dns_targets(fleet):
    # Two names of one port each stand in for a Service's pods: the fakes
    # listen on unix sockets, so the "addresses" are those sockets' paths.
    a, b = fleet.hosts["host-a"], fleet.hosts["host-b"]
    resolved = {"a.svc": [], "b.svc": []}

    async def resolve(name):
        return resolved[name]
    c = forkfleet.AsyncClient(hosts=["dns:///a.svc:1", "dns:///b.svc:1"], token="", resolve=resolve)
    # An address resolved from a name is "ip:port"; map them to the sockets.
    real = c._router._make_channel
    c._router._make_channel = lambda t, server_name: real({"10.0.0.1:1": a, "10.0.0.2:1": b}[t], server_name)
    resolved["a.svc"] = ["10.0.0.1"]
    try:
        hosts = await c.hosts()
        assert [st.host for _, st, _ in hosts] == ["host-a"]
        with forkfleet.Client(hosts=[b], token="") as direct:
            on_b = direct.create_sandbox()
        # b's pod appears: the lookup of an id no known host has resolves again.
        resolved["b.svc"] = ["10.0.0.2"]
        sb = await c.get_sandbox(on_b.id)
        assert sb.info.host == "host-b"
        assert len(await c.hosts()) == 2
        # Its ACI session verifies the gateway's TLS certificate against the
        # name its host was resolved from, not the pod address in the URL.
        seen = {}

        async def dial(url, **kw):
            seen.update(kw)
            raise forkfleet.errors.Unavailable("not dialed")
        real_dial, forkfleet.aci.dial = forkfleet.aci.dial, dial
        try:
            with pytest.raises(forkfleet.errors.Unavailable):
                await sb.aci()
        finally:
            forkfleet.aci.dial = real_dial
        assert seen["server_name"] == "b.svc"
    finally:
        await c.close()
