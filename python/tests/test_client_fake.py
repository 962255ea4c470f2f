"""forkfleet.Client and AsyncClient against the fake controld: every method,
the error classes with controld's field and reason, timeouts, cancellation."""

from __future__ import annotations

import asyncio
import uuid

import grpc
import pytest

import forkfleet
from forkfleet.controld.v1 import controld_pb2 as pb
from conftest import run_async


def labels() -> dict:
    return {"test": uuid.uuid4().hex[:12]}


def test_sandbox_lifecycle(fake):
    lb = labels()
    with forkfleet.Client(fake.target, token="") as c:
        sb = c.create_sandbox(screen=(1024, 768), resources=(500, 256 << 20), env={"A": "1"}, labels=lb,
                              ttl=600, wait_ready=True)
        assert isinstance(sb, forkfleet.Sandbox)
        assert sb.id.startswith("sb-")
        assert sb.info.state == pb.SANDBOX_STATE_READY
        assert (sb.info.screen.width, sb.info.screen.height, sb.info.screen.depth) == (1024, 768, 24)
        assert sb.info.HasField("expires_at")
        got = c.get_sandbox(sb.id)
        assert got.info.id == sb.id and got.info.labels == lb
        assert [s.id for s in c.list_sandboxes(labels=lb)] == [sb.id]
        assert c.list_sandboxes(labels=lb, states=[pb.SANDBOX_STATE_SUSPENDED]) == []
        assert sb.wait_ready(server_timeout=5).state == pb.SANDBOX_STATE_READY
        assert sb.suspend().state == pb.SANDBOX_STATE_SUSPENDED
        with pytest.raises(forkfleet.FailedPrecondition) as e:
            sb.suspend()
        assert e.value.reason == "SANDBOX_STATE"
        assert sb.resume().state == pb.SANDBOX_STATE_READY
        ep = sb.endpoint()
        assert ep.url == fake.aci_url and ep.token == fake.aci_token
        assert sb.refresh_endpoint().url == fake.aci_url
        sb.delete()
        with pytest.raises(forkfleet.NotFound) as e:
            sb.get()
        assert e.value.reason == "SANDBOX_NOT_FOUND"
        assert e.value.grpc_code == grpc.StatusCode.NOT_FOUND


def test_invalid_arguments_name_the_field(fake):
    with forkfleet.Client(fake.target) as c:
        with pytest.raises(forkfleet.InvalidArgument) as e:
            c.create_sandbox(screen=(10, 10))
        assert e.value.field == "screen.width"
        with pytest.raises(forkfleet.InvalidArgument) as e:
            c.create_sandbox(resources=(0, 1))
        assert e.value.field == "resources.memory_bytes"
        with pytest.raises(forkfleet.InvalidArgument) as e:
            c.create_sandbox(labels={"bad key": "x"})
        assert e.value.field == 'labels["bad key"]'
        with pytest.raises(forkfleet.InvalidArgument) as e:
            c.create_sandbox(ttl=-1)
        assert e.value.field == "ttl"
        with pytest.raises(forkfleet.NotFound) as e:
            c.create_sandbox(image="localhost/nope:latest")
        assert e.value.reason == "IMAGE_NOT_FOUND"
        with pytest.raises(forkfleet.InvalidArgument) as e:
            c.sandbox("").get()
        assert e.value.field == "id"
        # Client-side checks of the Go client, same fields.
        with pytest.raises(forkfleet.InvalidArgument) as e:
            c.checkpoint("ck-x").fork(0)
        assert e.value.field == "count"
        with pytest.raises(forkfleet.InvalidArgument) as e:
            c.create_pool("p", 0, image="x")
        assert e.value.field == "size"


def test_checkpoints_fork_export_import(fake):
    lb = labels()
    with forkfleet.Client(fake.target) as c:
        src = c.create_sandbox(wait_ready=True, labels=lb)
        name = "golden-" + lb["test"]
        ck = src.checkpoint(name=name, labels=lb)
        assert isinstance(ck, forkfleet.Checkpoint)
        assert ck.info.source_sandbox_id == src.id and ck.info.tier == pb.CHECKPOINT_TIER_MEMORY
        with pytest.raises(forkfleet.AlreadyExists) as e:
            src.checkpoint(name=name)
        assert e.value.reason == "CHECKPOINT_NAME_TAKEN"
        assert c.get_checkpoint(name).id == ck.id
        results = ck.fork(3, labels=lb, ttl=600, verify=[pb.VERIFY_LEVEL_MEMORY])
        replicas = forkfleet.sandboxes(results)
        assert len(replicas) == 3 and forkfleet.first_error(results) is None
        assert all(isinstance(r, forkfleet.Sandbox) for r in replicas)
        assert all(r.info.checkpoint_id == ck.id and r.info.generation == 1 for r in replicas)
        assert [v.level for v in results[0].verification] == [pb.VERIFY_LEVEL_MEMORY]
        assert results[0].took > 0
        checks = replicas[0].verify()
        assert checks and all(v.ok for v in checks)
        assert ck.get().live_forks == 3
        child = replicas[0].checkpoint(tier=pb.CHECKPOINT_TIER_DISK)
        assert child.info.parent_checkpoint_id == ck.id
        assert {x.id for x in c.list_checkpoints(root=ck.id)} == {ck.id, child.id}
        with pytest.raises(forkfleet.FailedPrecondition) as e:
            ck.delete()
        assert e.value.reason == "CHECKPOINT_HAS_CHILDREN"
        exp = ck.export("registry.example/forkfleet/ck:" + lb["test"])
        assert exp.digest.startswith("sha256:") and exp.size_bytes > 0
        # An import keeps the name, which must be free here (as controld).
        with pytest.raises(forkfleet.AlreadyExists) as e:
            c.import_checkpoint(exp.reference)
        assert e.value.reason == "CHECKPOINT_NAME_TAKEN"
        with pytest.raises(forkfleet.NotFound):
            c.import_checkpoint("registry.example/none:0")
        assert set(ck.delete(cascade=True)) == {ck.id, child.id}
        imported = c.import_checkpoint(exp.reference)
        assert imported.id != ck.id and imported.info.image == ck.info.image and imported.info.name == name
        # Through a registry: pushed, then forked by reference (one import).
        remote_ref = "registry.example/forkfleet/remote:" + lb["test"]
        assert imported.export(remote_ref, push=True).pushed_bytes > 0
        results, remote = c.fork_remote(remote_ref, 2)
        assert len(forkfleet.sandboxes(results)) == 2 and remote.id not in (ck.id, imported.id)
        again, same = c.fork_remote(remote_ref, 1)
        assert same.id == remote.id
        for r in forkfleet.sandboxes(results) + forkfleet.sandboxes(again):
            r.delete()
        remote.delete()
        with pytest.raises(forkfleet.AlreadyExists):
            c.import_checkpoint(remote_ref, pull=True)  # its name is the import's, still here
        imported.delete()
        for r in replicas:
            r.delete()
        src.delete()


def test_fork_replica_failure_is_per_replica(fresh_fake):
    fresh_fake.command("fail-replica 1")
    with forkfleet.Client(fresh_fake.target) as c:
        ck = c.create_sandbox(wait_ready=True).checkpoint()
        results = ck.fork(3)
        assert [r.sandbox is None for r in results] == [False, True, False]
        err = forkfleet.first_error(results)
        assert isinstance(err, forkfleet.Unavailable) and "replica 1 failed" in str(err)


def test_pools(fake):
    lb = labels()
    with forkfleet.Client(fake.target) as c:
        ck = c.create_sandbox(wait_ready=True).checkpoint()
        name = "pool-" + lb["test"]
        p = c.create_pool(name, 1, checkpoint=ck.id, labels=lb)
        assert p.frozen and p.size == 1 and p.checkpoint_id == ck.id
        with pytest.raises(forkfleet.AlreadyExists):
            c.create_pool(name, 1, image="localhost/forkfleet/desktop:latest")
        assert c.get_pool(p.id).name == name
        assert p.id in [x.id for x in c.list_pools()]
        first = c.claim(p.id, labels={"claim": "1"}, ttl=600)
        assert first.hit and isinstance(first.sandbox, forkfleet.Sandbox)
        assert first.sandbox.info.checkpoint_id == ck.id and first.sandbox.info.labels["claim"] == "1"
        with pytest.raises(forkfleet.FailedPrecondition) as e:
            ck.delete()
        assert e.value.reason == "CHECKPOINT_IN_USE"
        c.delete_pool(p.id)
        with pytest.raises(forkfleet.NotFound) as e:
            c.claim(p.id)
        assert e.value.reason == "POOL_NOT_FOUND"
        image_pool = c.create_pool(name + "-img", 2, image="localhost/forkfleet/desktop:latest", screen=(800, 600))
        assert not image_pool.frozen
        c.delete_pool(image_pool.id)


def test_watch(fake):
    lb = labels()
    with forkfleet.Client(fake.target) as c:
        sb = c.create_sandbox(wait_ready=True, labels=lb)
        events = c.watch(labels=lb)
        first = next(events)
        assert first.type == pb.SANDBOX_EVENT_TYPE_EXISTING and first.sandbox.id == sb.id
        sb.suspend()
        ev = next(events)
        assert ev.type == pb.SANDBOX_EVENT_TYPE_STATE and ev.sandbox.state == pb.SANDBOX_STATE_SUSPENDED
        events.close()
        sb.delete()


@run_async
async def test_async_client_timeout_and_cancel(fake):
    async with forkfleet.AsyncClient(fake.target) as c:
        sb = await c.create_sandbox(wait_ready=True)
        assert isinstance(sb, forkfleet.AsyncSandbox)
        # Canceling the task of a call cancels its RPC: a watch that would
        # wait forever ends.
        async def watch_forever():
            async for _ in c.watch(ids=["sb-aaaaaaaaaaaaaaaa"]):
                pass
        task = asyncio.create_task(watch_forever())
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await sb.delete()


def test_token_and_plaintext_rules(fake_binary):
    from conftest import Fake
    f = Fake(fake_binary, token="s3cret")
    try:
        with forkfleet.Client(f.target, token="wrong") as c:
            with pytest.raises(forkfleet.Unauthenticated):
                c.list_sandboxes()
        with forkfleet.Client(f.target, token="s3cret") as c:
            assert isinstance(c.list_sandboxes(), list)
    finally:
        f.close()
    # Like the Go client: no bearer token in plaintext to a remote host
    # (refused before any connection).
    with pytest.raises(forkfleet.InvalidArgument):
        forkfleet.Client("192.0.2.1:7443", token="t")
    forkfleet.Client("127.0.0.1:1", token="t").close()
    forkfleet.Client("192.0.2.1:7443", token="t", insecure=True).close()
    with pytest.raises(forkfleet.InvalidArgument):
        forkfleet.Client("no-port", token="t")


@run_async
async def test_timeout_is_deadline_exceeded(tmp_path):
    # A socket that accepts connections and never speaks HTTP/2.
    import socket
    ls = socket.socket(socket.AF_UNIX)
    ls.bind(str(tmp_path / "mute.sock"))
    ls.listen(8)
    try:
        async with forkfleet.AsyncClient(f"unix://{tmp_path}/mute.sock", token="", timeout=0.3) as c:
            with pytest.raises(forkfleet.DeadlineExceeded) as e:
                await c.list_sandboxes()
            assert isinstance(e.value, TimeoutError)
    finally:
        ls.close()


def test_unreachable_controld_is_unavailable(tmp_path):
    with forkfleet.Client(f"unix://{tmp_path}/none.sock", token="") as c:
        with pytest.raises(forkfleet.Unavailable):
            c.list_sandboxes(timeout=5)


def test_network_and_ports(fake):
    with forkfleet.Client(fake.target) as c:
        sb = c.create_sandbox(wait_ready=True, network=pb.Network(mode=pb.NETWORK_MODE_EGRESS),
                              resources={"cpu_millis": 500, "memory_bytes": 256 << 20})
        assert sb.info.network.mode == pb.NETWORK_MODE_EGRESS
        sb.update_network(pb.NetworkPolicy())
        url, token = sb.expose_port(8080)
        assert "8080" in url and token
        assert sb.expose_port(8080) == (url, token)  # exposing an exposed port returns the same
        sb.unexpose_port(8080)
        with pytest.raises(forkfleet.InvalidArgument) as e:
            sb.expose_port(0)
        assert e.value.field == "port"
        url, expires = sb.view_ticket(control=True, ttl=120)
        assert f"/v1/sandboxes/{sb.id}/view?ticket=" in url and expires.tzinfo is not None
        with pytest.raises(forkfleet.InvalidArgument) as e:
            sb.view_ticket(ttl=3600)
        assert e.value.field == "ttl"
        ck = sb.checkpoint()
        results = ck.fork(1, resources={"memory_bytes": 512 << 20})
        assert forkfleet.first_error(results) is None
        sb.delete()


def test_recordings(fake, tmp_path):
    """Recordings through the fake follow controld's rules and lifecycle."""
    with forkfleet.Client(fake.target) as c:
        sb = c.create_sandbox(wait_ready=True)
        rec = sb.start_recording(max_bytes=2 << 20)
        assert rec.id.startswith("rc-") and rec.info.max_bytes == 2 << 20
        with pytest.raises(forkfleet.AlreadyExists):
            sb.start_recording()
        with pytest.raises(forkfleet.InvalidArgument) as e:
            c.sandbox(sb.id).start_recording(max_bytes=1)
        assert e.value.field == "max_bytes"
        results = sb.checkpoint().fork(1, record=True)
        assert forkfleet.first_error(results) is None
        rep = c.recording(results[0].recording_id).get()
        assert rep.parent_recording_id == rec.id and rep.sandbox_id == results[0].sandbox.id
        assert [r.id for r in sb.recordings()] == [rec.id]
        with pytest.raises(forkfleet.FailedPrecondition):
            rec.export_mp4()
        assert rec.stop().state == pb.RECORDING_STATE_STOPPED
        with pytest.raises(forkfleet.FailedPrecondition):  # no frames in the fake
            rec.export_frames()
        with pytest.raises(forkfleet.FailedPrecondition) as e:
            rec.download(str(tmp_path / "rec.mp4"))
        assert e.value.reason == "RECORDING_NOT_EXPORTED"
        with pytest.raises(forkfleet.InvalidArgument):
            rec.download(str(tmp_path / "rec.mp4"), file=pb.RECORDING_FILE_UNSPECIFIED)
        assert not (tmp_path / "rec.mp4").exists()
        rec.delete()
        with pytest.raises(forkfleet.NotFound):
            rec.get()


def test_download(tmp_path):
    """The download helper writes the whole body or nothing: a refused
    ticket and a body cut short of its Content-Length leave no file."""
    import http.server
    import threading

    from forkfleet.client import _download

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.endswith("ticket=ok"):
                self.send_response(200)
                self.send_header("Content-Length", "5")
                self.end_headers()
                self.wfile.write(b"hello")
            elif self.path.endswith("ticket=short"):
                self.send_response(200)
                self.send_header("Content-Length", "10")
                self.end_headers()
                self.wfile.write(b"hello")
            else:
                self.send_error(401)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{srv.server_address[1]}/v1/recordings/rc-x/files/recording.mp4?ticket="
    try:
        assert _download(base + "ok", str(tmp_path / "ok.mp4"), None, 10) == 5
        assert (tmp_path / "ok.mp4").read_bytes() == b"hello"
        with pytest.raises(forkfleet.PermissionDenied):
            _download(base + "spent", str(tmp_path / "a"), None, 10)
        with pytest.raises(forkfleet.Unavailable):
            _download(base + "short", str(tmp_path / "b"), None, 10)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.mp4"]
    finally:
        srv.shutdown()
        srv.server_close()


def test_service_config_matches_go_client():
    """Both clients retry the same calls the same way: the Python client's
    service config is the Go client's api/client/serviceconfig.json."""
    import json
    import pathlib

    from forkfleet import client as client_mod

    go = pathlib.Path(__file__).resolve().parents[2] / "api" / "client" / "serviceconfig.json"
    assert json.loads(client_mod.SERVICE_CONFIG) == json.loads(go.read_text())


def test_request_ids_pages_extend_update_pool(fake):
    """Creating calls carry a request id (a repeat returns the first result);
    lists follow their pages; a sandbox's TTL is extended; a pool resized."""
    lb = labels()
    with forkfleet.Client(fake.target, token="") as c:
        first = c.create_sandbox(labels=lb, request_id="py-req-1", wait_ready=True)
        again = c.create_sandbox(labels=lb, request_id="py-req-1", wait_ready=True)
        assert again.id == first.id
        with pytest.raises(forkfleet.InvalidArgument) as e:
            c.create_sandbox(labels={"other": "x"}, request_id="py-req-1")
        assert e.value.field == "request_id"
        # Without a request id the client makes one per call: two calls, two sandboxes.
        c.create_sandbox(labels=lb)
        c.create_sandbox(labels=lb)
        got = c.list_sandboxes(labels=lb, page_size=1)  # three pages, followed
        assert len(got) == 3 and got[0].id == first.id
        info = first.extend(3600)
        assert info.HasField("expires_at")
        pool = c.create_pool("py-resize-" + lb["test"], 1, image="localhost/forkfleet/desktop:latest")
        assert c.update_pool(pool.id, 3).size == 3
        with pytest.raises(forkfleet.InvalidArgument) as e:
            c.update_pool(pool.id, 0)
        assert e.value.field == "size"
        c.delete_pool(pool.id)
        for s in got:
            c.sandbox(s.id).delete()
