"""The SDK's WebSocket client against peers it did not write: the websockets
package as a well-behaved server (fragmented messages, pings), and a raw
hostile server breaking the rules (oversized announcements, masked or text
frames, bad handshakes, garbage)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import struct

import pytest

import forkfleet
from forkfleet import aci
from forkfleet.aci import _ws
from forkfleet.aci.v1 import aci_pb2 as a
from conftest import run_async

HELLO = a.HelloResponse(protocol_version=1, server_version="test", capabilities=["dedup"], session_id="s",
                        screen=a.ScreenSizeResponse(width=1280, height=800), max_message_bytes=1 << 20)


@run_async
async def test_against_websockets_server():
    websockets = pytest.importorskip("websockets")

    async def handler(ws, path=None):
        async for raw in ws:
            m = a.ClientMessage.FromString(raw)
            if m.WhichOneof("request") == "hello":
                await ws.send(a.ServerMessage(id=m.id, hello=HELLO).SerializeToString())
                await ws.ping(b"are you there")
                continue
            reply = a.ServerMessage(id=m.id, ping=a.PingResponse(payload=m.ping.payload * 1000)).SerializeToString()
            # Fragmented into three frames.
            third = len(reply) // 3
            await ws.send(iter([reply[:third], reply[third:2 * third], reply[2 * third:]]))

    server = await websockets.serve(handler, "127.0.0.1", 0, subprotocols=["forkfleet.aci.v1"], compression=None)
    port = server.sockets[0].getsockname()[1]
    try:
        s = await aci.dial(f"ws://127.0.0.1:{port}/aci", "tok")
        assert s.welcome.server_version == "test"
        for payload in (b"x", b"y" * 200):
            assert await s.ping(payload) == payload * 1000
        await s.close()
    finally:
        server.close()
        await server.wait_closed()


class RawServer:
    """Accepts one upgrade and then lets the test write whatever it wants."""

    def __init__(self, respond):
        self.respond = respond
        self.received = bytearray()
        self.closed = asyncio.Event()

    async def start(self):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        key = [ln.split(b":", 1)[1].strip() for ln in head.split(b"\r\n") if ln.lower().startswith(b"sec-websocket-key")][0]
        accept = base64.b64encode(hashlib.sha1(key + _ws._GUID).digest())
        try:
            await self.respond(reader, writer, accept)
        finally:
            try:
                self.received += await asyncio.wait_for(reader.read(1 << 16), 2)
            except (asyncio.TimeoutError, ConnectionError):
                pass
            writer.close()
            self.closed.set()

    async def close(self):
        self.server.close()
        await self.server.wait_closed()


def upgrade(accept: bytes, proto: bytes = b"forkfleet.aci.v1") -> bytes:
    return (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: " + accept + b"\r\nSec-WebSocket-Protocol: " + proto + b"\r\n\r\n")


def server_frame(payload: bytes, op: int = 2, fin: bool = True, announce: int | None = None) -> bytes:
    n = len(payload) if announce is None else announce
    b0 = (0x80 if fin else 0) | op
    if n < 126:
        head = struct.pack("!BB", b0, n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", b0, 126, n)
    else:
        head = struct.pack("!BBQ", b0, 127, n)
    return head + payload


async def hello_then(extra: bytes):
    async def respond(reader, writer, accept):
        writer.write(upgrade(accept))
        frame = await reader.read(1 << 16)  # the masked hello
        hid = a.ClientMessage.FromString(_unmask(frame)).id
        writer.write(server_frame(a.ServerMessage(id=hid, hello=HELLO).SerializeToString()))
        await reader.read(1 << 16)  # the test's next request
        writer.write(extra)
        await writer.drain()
    return respond


def _unmask(frame: bytes) -> bytes:
    n = frame[1] & 0x7F
    off = 2
    if n == 126:
        n, off = struct.unpack("!H", frame[2:4])[0], 4
    key = frame[off:off + 4]
    return bytes(b ^ key[i % 4] for i, b in enumerate(frame[off + 4:off + 4 + n]))


async def run_against(extra: bytes, read_limit: int = 1 << 20):
    srv = RawServer(await hello_then(extra))
    port = await srv.start()
    try:
        s = await aci.dial(f"ws://127.0.0.1:{port}/aci", read_limit=read_limit)
        try:
            with pytest.raises(forkfleet.ForkfleetError) as e:
                await s.ping(b"p", timeout=5)
            await asyncio.wait_for(srv.closed.wait(), 5)
            return e.value, bytes(srv.received)
        finally:
            await s.close()
    finally:
        await srv.close()


def close_code(received: bytes) -> int:
    """The code of the client's close frame among the frames it sent last."""
    i = 0
    while i < len(received):
        n, off = received[i + 1] & 0x7F, 2
        if n == 126:
            n, off = struct.unpack("!H", received[i + 2:i + 4])[0], 4
        if received[i] & 0x0F == 8:
            return struct.unpack("!H", _unmask(received[i:])[:2])[0]
        i += off + 4 + n
    raise AssertionError("no close frame")


@run_async
async def test_oversized_message_is_refused_before_allocation():
    # Announces 2^62 bytes: the client must refuse from the header (1009)
    # instead of allocating.
    err, got = await run_against(server_frame(b"", announce=1 << 62))
    assert isinstance(err, forkfleet.ProtocolError) and "read limit" in str(err)
    assert close_code(got) == 1009


@run_async
async def test_text_and_masked_frames_and_garbage():
    err, got = await run_against(server_frame(b"{}", op=1))
    assert isinstance(err, forkfleet.ProtocolError) and close_code(got) == 1003
    masked = bytes([0x82, 0x80 | 2]) + b"\x00\x00\x00\x00ab"
    err, got = await run_against(masked)
    assert isinstance(err, forkfleet.ProtocolError) and close_code(got) == 1002
    err, got = await run_against(server_frame(b"\xff\xff\xff"))
    assert isinstance(err, forkfleet.ProtocolError) and close_code(got) == 1007
    err, _ = await run_against(server_frame(b"x", op=0))  # continuation without a message
    assert isinstance(err, forkfleet.ProtocolError)
    # The server closing with a reason: in flight calls learn it.
    err, _ = await run_against(server_frame(struct.pack("!H", 1012) + b"checkpoint", op=8))
    assert isinstance(err, forkfleet.ConnectionLost) and "1012 checkpoint" in str(err)


@run_async
async def test_bad_handshakes():
    async def status(code: bytes):
        async def respond(reader, writer, accept):
            writer.write(b"HTTP/1.1 " + code + b"\r\nContent-Length: 0\r\n\r\n")
        return respond

    async def wrong_accept(reader, writer, accept):
        writer.write(upgrade(b"bm90IHRoZSBrZXk="))

    async def wrong_proto(reader, writer, accept):
        writer.write(upgrade(accept, b"forkfleet.aci.v1+json"))

    async def endless_head(reader, writer, accept):
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\n" + b"X-Pad: " + b"a" * (64 << 10))

    cases = [(await status(b"401 Unauthorized"), forkfleet.PermissionDenied),
             (await status(b"404 Not Found"), forkfleet.NotFound),
             (await status(b"503 Service Unavailable"), forkfleet.Unavailable),
             (wrong_accept, forkfleet.ProtocolError), (wrong_proto, forkfleet.ProtocolError),
             (endless_head, forkfleet.ProtocolError)]
    for respond, cls in cases:
        srv = RawServer(respond)
        port = await srv.start()
        try:
            with pytest.raises(cls):
                await aci.dial(f"ws://127.0.0.1:{port}/aci", timeout=5)
        finally:
            await srv.close()


def test_mask_roundtrip():
    key = b"\x01\x02\x03\x04"
    for n in (0, 1, 5, 4096, 4097, 100_003):
        data = bytes(range(256)) * (n // 256 + 1)
        data = data[:n]
        masked = _ws.mask(data, key)
        assert _ws.mask(masked, key) == data
        assert all(masked[i] == data[i] ^ key[i % 4] for i in range(0, n, 997))


@run_async
async def test_tls_server_name(tmp_path):
    """A gateway reached by its address whose certificate names a DNS name
    (a Kubernetes pod behind a headless Service): ``server_name`` verifies
    the name; without it the address is checked, and the dial is refused."""
    import shutil
    import ssl
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    ca_key, ca, key, csr, cert, ext = (str(tmp_path / n) for n in ("ca.key", "ca.pem", "k", "csr", "c.pem", "ext"))
    (tmp_path / "ext").write_text("subjectAltName=DNS:controld.forkfleet.test\n")
    for argv in (
        ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
         "-subj", "/CN=test CA", "-keyout", ca_key, "-out", ca],
        ["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=controld",
         "-keyout", key, "-out", csr],
        ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-days", "1",
         "-extfile", ext, "-out", cert],
    ):
        subprocess.run(["openssl", *argv], check=True, capture_output=True)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)

    async def refuse_upgrade(reader, writer):
        # TLS is done once the request arrives: any HTTP answer proves it.
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    srv = await asyncio.start_server(refuse_upgrade, "127.0.0.1", 0, ssl=server_ctx)
    port = srv.sockets[0].getsockname()[1]
    client_ctx = ssl.create_default_context(cafile=ca)
    try:
        with pytest.raises(forkfleet.errors.NotFound):
            await aci.dial(f"wss://127.0.0.1:{port}/", "tok", ssl=client_ctx,
                           server_name="controld.forkfleet.test", timeout=5)
        with pytest.raises(forkfleet.errors.Unavailable, match="certificate"):
            await aci.dial(f"wss://127.0.0.1:{port}/", "tok", ssl=client_ctx, timeout=5)
    finally:
        srv.close()
        await srv.wait_closed()
