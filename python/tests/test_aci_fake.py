"""ACI sessions against the fake guestd (api/aci/acitest) behind the fake
controld: every request method, pipelining, cancellation, the FrameCache,
reconnection after a restore, and the errors."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time

import numpy as np
import pytest

import forkfleet
from forkfleet import aci
from conftest import run_async


async def open_session(fake, **kw) -> aci.Session:
    return await aci.dial(fake.aci_url, fake.aci_token, **kw)


@run_async
async def test_every_request(fake):
    async with await open_session(fake) as s:
        assert s.welcome.protocol_version == 1 and s.welcome.session_id
        assert s.has_capability("dedup") and not s.has_capability("screencast")
        assert await s.ping(b"abc") == b"abc"
        assert 0 < await s.rtt() < 5
        r = await s.step([aci.move(5, 6), aci.click(100, 200), aci.type_text("hi"), aci.key("ctrl", "c"),
                          aci.scroll(1, 2, 0, 3), aci.drag(1, 1, 30, 40, 5), aci.key_down("shift"), aci.key_up("shift"),
                          aci.button_down(), aci.button_up(), aci.wait(0.01)], observe=aci.png())
        assert len(r.outcomes) == 11 and r.errors() == [] and r.observation_error is None
        shot = r.observation
        assert (shot.width, shot.height) == (1280, 800) and shot.data.startswith(b"\x89PNG")
        px = shot.array()
        assert px.shape == (800, 1280, 3) and tuple(px[400, 640]) == (40, 80, 160)
        assert shot.image().size == (1280, 800)
        assert await s.cursor_position() == (30, 40)
        assert await s.screen_size() == (1280, 800)
        assert (await s.ready()).ready
        assert (await s.wait_ready(timeout=5)).ready
        shot2 = await s.screenshot(format=aci.JPEG, quality=80)
        assert shot2.frame_hash == shot.frame_hash
        assert (await s.screenshot(aci.hash_only())).data == b""
        wins = await s.list_windows()
        assert wins[0].title == "xterm"
        await s.window_action(wins[0].id, aci.pb.WINDOW_OP_MAXIMIZE)
        await s.window_action(wins[0].id, aci.pb.WINDOW_OP_MOVE_RESIZE, (0, 0, 100, 100))
        with pytest.raises(forkfleet.NotFound) as e:
            await s.window_action(7, aci.pb.WINDOW_OP_CLOSE)
        assert e.value.field == "window_action.window_id" and e.value.aci_code == aci.pb.ERROR_CODE_NOT_FOUND
        assert await s.launch(["xterm"], env={"A": "b"}, cwd="/") == 4242
        await s.clipboard_set("copied")
        assert await s.clipboard_get() == "copied"
        out = await s.exec(["echo", "hello", "world"])
        assert out.stdout == b"hello world\n" and out.exit_code == 0
        assert (await s.run("nope")).exit_code == 127
        with pytest.raises(forkfleet.InvalidArgument):
            await s.exec([])
        await s.put_file("/tmp/a.txt", b"content")
        assert await s.get_file("/tmp/a.txt") == b"content"
        assert (await s.stat("/tmp/a.txt")).size == 7
        assert [e.name for e in await s.list_dir("/tmp")] == ["a.txt"]
        await s.mkdir("/tmp/d", parents=True, mode=0o755)
        await s.delete("/tmp/a.txt")
        with pytest.raises(forkfleet.NotFound):
            await s.get_file("/tmp/a.txt")
        with pytest.raises(forkfleet.InvalidArgument) as e:
            await s.put_file("relative", b"x")
        assert e.value.field == "file_put.path"
        await s.memory_mark(b"secret-mark")
        nonce = b"n" * 16
        assert await s.memory_challenge(nonce) == hmac.new(b"secret-mark", nonce, hashlib.sha256).digest()
        # Requests this guest does not implement are a typed error, and the session goes on.
        with pytest.raises(forkfleet.Unimplemented):
            await s.screencast_start(fps=10)
        with pytest.raises(forkfleet.Unimplemented):
            await s.checkpoint_prepare(1)
        with pytest.raises(forkfleet.Unimplemented):
            await s.checkpoint_done()
        with pytest.raises(forkfleet.Unimplemented):
            await s.release_scratch()
        with pytest.raises(forkfleet.Unimplemented):
            await s.resume_apps()
        assert await s.ping(b"still") == b"still"


@run_async
async def test_step_action_errors_and_restored(fake):
    async with await open_session(fake) as s:
        r = await s.step([aci.key(""), aci.move(1, 1)], stop_on_error=True)
        (i, err), (j, skipped) = r.errors()
        assert i == 0 and isinstance(err, forkfleet.InvalidArgument) and err.field == "step.actions[0].key_press.key"
        assert j == 1 and isinstance(skipped, forkfleet.Canceled)  # stop_on_error
        with pytest.raises(forkfleet.InvalidArgument):
            r.raise_for_errors()
        await s.restored(sandbox_id="sb-x", token=fake.aci_token, admin_token="fake-admin", generation=0)


@run_async
async def test_a11y(fresh_fake):
    # The fake answers by guestd's rules (api/aci/a11yrules): validation,
    # roots, limits, fields, the tree hash; actions change its tree.
    async with await open_session(fresh_fake) as s:
        assert s.has_capability("a11y")
        full = await s.a11y_tree()
        assert [n.name for n in full.nodes][:5] == ["main", "xterm", "xterm", "OK", "Name"]
        assert '[3] push button "OK" @20,20 80x30' in aci.render_tree(full)
        same = await s.a11y_tree(if_none_match=full.tree_hash)
        assert same.not_modified and not same.nodes and same.tree_hash == full.tree_hash
        assert len((await s.a11y_tree(showing_only=True)).nodes) == 6
        cut = await s.a11y_tree(max_nodes=3)
        assert len(cut.nodes) == 3 and cut.truncated
        with pytest.raises(forkfleet.InvalidArgument) as e:
            await s.a11y_tree(max_nodes=20001)
        assert e.value.field == "a11y_tree.max_nodes"
        at = await s.a11y_tree(root=aci.pb.A11Y_ROOT_POINT, point=aci.pb.Point(x=30, y=65))
        assert at.nodes[0].name == "Name"
        entry = full.nodes[4].ref
        await s.a11y_action(aci.set_text(entry, "Ada"))
        r = await s.step([], observe_tree=aci.pb.A11yTreeRequest(root=aci.pb.A11Y_ROOT_FOCUSED_WINDOW))
        assert r.proto.tree.nodes[0].role == "frame" and r.proto.tree.nodes[2].text == "Ada"
        with pytest.raises(forkfleet.FailedPrecondition):
            await s.a11y_action(aci.set_text(full.nodes[3].ref, "x"))
        with pytest.raises(forkfleet.NotFound):
            await s.a11y_action(aci.do_action(":1.2:/no/such", "press"))
        with pytest.raises(forkfleet.InvalidArgument):
            await s.a11y_action(aci.do_action("org.a11y:/x", "press"))
        await s.a11y_action(aci.do_action(full.nodes[3].ref, "press"))


@run_async
async def test_chunked_files_and_pipelining(fake):
    async with await open_session(fake) as s:
        data = np.random.default_rng(1).integers(0, 256, 300_000, np.uint8).tobytes()
        await s.put_file("/tmp/big.bin", data, chunk_size=64 << 10)
        assert await s.get_file("/tmp/big.bin") == data
        with pytest.raises(forkfleet.ResourceExhausted):
            await s.get_file("/tmp/big.bin", max_bytes=1000)
        # 200 pipelined requests, answered in order, on one connection.
        calls = [await s.start(aci.pb.ClientMessage(ping=aci.pb.PingRequest(payload=str(i).encode())))
                 for i in range(200)]
        replies = [await c for c in calls]
        assert [r.ping.payload for r in replies] == [str(i).encode() for i in range(200)]
        assert [r.id for r in replies] == sorted(r.id for r in replies)


@run_async
async def test_cancel_and_timeout(fake):
    async with await open_session(fake) as s:
        # A timeout abandons the request on the server (CancelRequest).
        t0 = time.monotonic()
        with pytest.raises(forkfleet.DeadlineExceeded):
            await s.exec(["sleep", "5000"], timeout=0.2)
        assert time.monotonic() - t0 < 2
        # So does cancelling the task.
        task = asyncio.create_task(s.exec(["sleep", "5000"]))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # An explicit cancel of a pipelined call.
        call = await s.start(aci.pb.ClientMessage(exec=aci.pb.ExecRequest(argv=["sleep", "5000"])))
        assert await s.cancel(call) is True
        with pytest.raises(forkfleet.Canceled):
            await call
        # The session is still in order.
        assert await s.ping(b"ok") == b"ok"


@run_async
async def test_frame_cache_across_sessions(fresh_fake):
    cache = aci.FrameCache()
    a1 = await open_session(fresh_fake, frame_cache=cache)
    a2 = await open_session(fresh_fake, frame_cache=cache)
    try:
        first = await a1.screenshot()
        assert not first.from_cache
        second = await a2.screenshot()
        assert second.from_cache and second.not_modified and second.data == first.data
        assert second.data is first.data  # shared bytes, not a copy
        assert (second.width, second.height) == (1280, 800)
        st = cache.stats()
        assert st.hits == 1 and st.misses == 1 and st.bytes_saved == len(first.data)
        # A step's observation goes through the cache too.
        r = await a1.step([aci.move(1, 1)], observe=aci.png())
        assert r.observation.from_cache
        fresh_fake.command("frame 200 10 10")
        changed = await a2.screenshot()
        assert not changed.from_cache and tuple(changed.array()[0, 0]) == (200, 10, 10)
        # a1 bets on its own last frame until two observations confirm the
        # fleet moved on (the Go FrameCache's policy); then it is a hit.
        assert not (await a1.screenshot()).from_cache
        assert (await a2.screenshot()).from_cache
    finally:
        await a1.close()
        await a2.close()


@run_async
async def test_reconnect_after_restore(fresh_fake):
    reconnected = asyncio.Event()
    seen = []

    def on_reconnect(s):
        seen.append(s.generation)
        reconnected.set()

    s = await open_session(fresh_fake, reconnect=aci.Backoff(initial=0.01, max=0.1), on_reconnect=on_reconnect)
    try:
        assert s.generation == 0
        fresh_fake.command("generation 3")
        fresh_fake.command("drop")  # what a restore does to established connections
        await asyncio.wait_for(reconnected.wait(), 10)
        assert s.generation == 3 and seen == [3] and s.reconnects == 1
        assert await s.ping(b"after") == b"after"
    finally:
        await s.close()
    # Without reconnect a dropped connection fails the next call.
    s = await open_session(fresh_fake)
    try:
        fresh_fake.command("drop")
        await asyncio.sleep(0.2)
        with pytest.raises(forkfleet.ConnectionLost):
            await s.ping()
    finally:
        await s.close()
    with pytest.raises(forkfleet.SessionClosed):
        await s.ping()


@run_async
async def test_events_ready(fresh_fake):
    async with await open_session(fresh_fake) as s:
        fresh_fake.command("ready 0")
        waiter = asyncio.create_task(s.wait_ready(timeout=10))
        await asyncio.sleep(0.2)
        assert not waiter.done()
        events = s.events()
        fresh_fake.command("ready 1")
        assert (await waiter).ready
        ev = await asyncio.wait_for(events.__anext__(), 5)
        assert ev.WhichOneof("event") == "ready" and ev.ready.state.ready
        await events.aclose()


@run_async
async def test_dial_errors(fake):
    with pytest.raises(forkfleet.PermissionDenied):
        await aci.dial(fake.aci_url, "wrong-token")
    with pytest.raises(forkfleet.InvalidArgument):
        await aci.dial("ftp://x/aci")
    # Like aci.Dial in Go: no token in plaintext to a remote host (refused
    # before connecting); wss:// or insecure=True is required.
    with pytest.raises(forkfleet.InvalidArgument) as e:
        await aci.dial("ws://192.0.2.1:7480/v1/sandboxes/sb-1/aci", "token")
    assert "wss" in str(e.value)
    with pytest.raises(forkfleet.Unavailable):
        await aci.dial("ws://127.0.0.1:1/aci", "token", timeout=2)


def test_sync_session_through_the_client(fake):
    with forkfleet.Client(fake.target) as c:
        sb = c.create_sandbox(wait_ready=True)
        s = sb.aci(frame_cache=aci.FrameCache())
        assert isinstance(s, aci.SyncSession)
        assert s.ping(b"x") == b"x"
        r = s.step([aci.click(10, 10)], observe=aci.png())
        assert r.observation.array().shape == (800, 1280, 3)
        assert s.generation == 0
        s.close()
        sb.delete()


def test_backoff_full_jitter():
    """Attempt n waits uniformly in [0, min(max, initial * 2**n)]: sessions
    dropped together spread their redials instead of arriving in lockstep."""
    b = aci.Backoff(initial=0.05, max=2.0)
    for n, ceiling in enumerate([0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]):
        waits = [b.wait(n) for _ in range(1024)]
        assert all(0.0 <= w <= ceiling for w in waits)
        assert min(waits) < ceiling / 20 and max(waits) > ceiling * 19 / 20
        quarters = [sum(1 for w in waits if q * ceiling / 4 <= w < (q + 1) * ceiling / 4) for q in range(4)]
        assert all(c > 1024 / 8 for c in quarters), quarters
    assert 0.0 <= b.wait(10_000) <= 2.0
