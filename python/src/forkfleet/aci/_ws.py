"""The client side of RFC 6455, as much as the ACI needs: the opening
handshake, binary messages, fragmentation, ping/pong and the closing
handshake, no extensions.

It is its own small implementation, not the websockets package, because of
ingest cost: it is an asyncio.BufferedProtocol whose messages are read by the
kernel straight into the connection's reused buffer (grown to fit them) and
handed to protobuf from there (one copy in the kernel, one in protobuf),
which doubles the frames per client core of websockets 10.4 on the
clientscale peers (see python/README.md).

Everything the server sends is untrusted: the response head is bounded, a
message announcing more than the read limit closes the connection with 1009
before anything is allocated for it, and framing violations close it with
1002.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import ssl as ssl_mod
import struct
from typing import Callable, Mapping

import numpy as np

from forkfleet import errors

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_MAX_HEAD = 16 << 10  # the HTTP response head of the upgrade
# The read buffer starts small and grows to the largest frame seen, up to
# _KEEP, and is reused: a frame is then read by one recv into it and parsed
# in place. A larger frame gets a buffer of its own that is not kept.
_KEEP = 1 << 20

OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0, 1, 2, 8, 9, 10

CLOSE_NORMAL = 1000
CLOSE_PROTOCOL = 1002
CLOSE_UNSUPPORTED = 1003
CLOSE_INVALID = 1007
CLOSE_TOO_BIG = 1009


class HandshakeError(Exception):
    """The upgrade failed; ``status`` is the HTTP status when there was one."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


def mask(payload: bytes | bytearray | memoryview, key: bytes) -> bytes:
    """XORs payload with the 4-byte masking key (RFC 6455 5.3)."""
    n = len(payload)
    if n == 0:
        return b""
    if n <= 4096:
        k = int.from_bytes((key * (n // 4 + 1))[:n], "little")
        return (int.from_bytes(payload, "little") ^ k).to_bytes(n, "little")
    words = n // 4
    out = np.empty(n, np.uint8)
    np.bitwise_xor(np.frombuffer(payload, "<u4", words), np.frombuffer(key, "<u4")[0], out=out[:words * 4].view("<u4"))
    for i in range(words * 4, n):
        out[i] = payload[i] ^ key[i & 3]
    return out.tobytes()


def frame(opcode: int, payload: bytes | bytearray | memoryview, fin: bool = True) -> bytes:
    """One masked client frame."""
    n = len(payload)
    b0 = (0x80 if fin else 0) | opcode
    if n < 126:
        head = struct.pack("!BB", b0, 0x80 | n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", b0, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", b0, 0x80 | 127, n)
    key = os.urandom(4)
    return head + key + mask(payload, key)


class Protocol(asyncio.BufferedProtocol):
    """One client WebSocket connection. ``on_message(view)`` receives every
    complete binary message (a memoryview valid only during the call);
    ``on_close(code, reason, exc)`` runs once when the connection ends."""

    def __init__(self, on_message: Callable[[memoryview], None],
                 on_close: Callable[[int, str, BaseException | None], None], read_limit: int):
        self._on_message = on_message
        self._on_close = on_close
        self._limit = read_limit
        self._buf = bytearray(32 << 10)
        self._view = memoryview(self._buf)
        self._start = 0  # unparsed data is _buf[_start:_end]
        self._end = 0
        # A large message being read straight into its own buffer.
        self._big: bytearray | None = None
        self._big_view: memoryview | None = None
        self._big_have = 0
        self._big_fin = True
        self._big_op = 0
        # Fragments of a message split into frames.
        self._frag: bytearray | None = None
        self._frag_op = 0
        self._handshake: asyncio.Future | None = None
        self._head_done = False
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.close_code = 0
        self.close_reason = ""
        self._close_sent = False
        self._close_waiter: asyncio.Future | None = None
        self._drain: asyncio.Future | None = None
        self.subprotocol = ""
        self._expect_accept = b""
        self._expect_sub = ""

    # ---- handshake

    async def handshake(self, host: str, path: str, subprotocol: str, headers: Mapping[str, str]) -> None:
        key = base64.b64encode(os.urandom(16))
        self._expect_accept = base64.b64encode(hashlib.sha1(key + _GUID).digest())
        self._expect_sub = subprotocol
        lines = [f"GET {path} HTTP/1.1", f"Host: {host}", "Upgrade: websocket", "Connection: Upgrade",
                 f"Sec-WebSocket-Key: {key.decode()}", "Sec-WebSocket-Version: 13",
                 f"Sec-WebSocket-Protocol: {subprotocol}"]
        for k, v in headers.items():
            if "\r" in k or "\n" in k or "\r" in v or "\n" in v:
                raise errors.InvalidArgument(f"aci: header {k!r}: line breaks are not allowed")
            lines.append(f"{k}: {v}")
        self._handshake = asyncio.get_running_loop().create_future()
        self.transport.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        await self._handshake

    def _parse_head(self) -> bool:
        """Consumes the response head; True once it is complete (or failed)."""
        data = self._view[self._start:self._end]
        i = bytes(data).find(b"\r\n\r\n")
        if i < 0:
            if self._end - self._start > _MAX_HEAD:
                self._fail_handshake(HandshakeError("upgrade response head too large"))
                return True
            return False
        head = bytes(data[:i]).decode("latin-1")
        self._start += i + 4
        self._head_done = True
        status_line, *hlines = head.split("\r\n")
        parts = status_line.split(" ", 2)
        try:
            status = int(parts[1])
        except (IndexError, ValueError):
            self._fail_handshake(HandshakeError(f"bad status line {status_line[:80]!r}"))
            return True
        hdr: dict[str, str] = {}
        for line in hlines:
            k, _, v = line.partition(":")
            hdr[k.strip().lower()] = v.strip()
        if status != 101:
            reason = parts[2] if len(parts) > 2 else ""
            self._fail_handshake(HandshakeError(f"upgrade refused: HTTP {status} {reason}".strip(), status))
            return True
        if hdr.get("upgrade", "").lower() != "websocket" or "upgrade" not in hdr.get("connection", "").lower():
            self._fail_handshake(HandshakeError("101 without Upgrade: websocket"))
            return True
        if hdr.get("sec-websocket-accept", "").encode() != self._expect_accept:
            self._fail_handshake(HandshakeError("wrong Sec-WebSocket-Accept"))
            return True
        if hdr.get("sec-websocket-extensions"):
            self._fail_handshake(HandshakeError("server chose extensions the client did not offer"))
            return True
        self.subprotocol = hdr.get("sec-websocket-protocol", "")
        if self.subprotocol != self._expect_sub:
            self._fail_handshake(HandshakeError(
                f"server chose subprotocol {self.subprotocol!r}, want {self._expect_sub!r}"))
            return True
        if not self._handshake.done():
            self._handshake.set_result(None)
        return True

    def _fail_handshake(self, exc: HandshakeError) -> None:
        if self._handshake is not None and not self._handshake.done():
            self._handshake.set_exception(exc)
        self.transport.abort()

    # ---- asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._big is not None:
            return self._big_view[self._big_have:]
        if self._end == len(self._buf):
            # Move the unparsed tail to the front (_parse bounds it: a frame
            # that does not fit grows the buffer or gets its own).
            self._compact(len(self._buf))
        return self._view[self._end:]

    def _compact(self, size: int) -> None:
        """Moves the unparsed bytes to the front of a buffer of at least size."""
        tail = bytes(self._view[self._start:self._end])  # a copy: the regions may overlap
        if size > len(self._buf):
            self._buf = bytearray(size)
            self._view = memoryview(self._buf)
        self._buf[:len(tail)] = tail
        self._start, self._end = 0, len(tail)

    def buffer_updated(self, nbytes: int) -> None:
        if self._big is not None:
            self._big_have += nbytes
            if self._big_have < len(self._big):
                return
            big, self._big, self._big_view = self._big, None, None
            try:
                if not self._deliver(self._big_op, memoryview(big), self._big_fin):
                    return
            except _Violation as v:
                self._violation(v.code, str(v))
                return
            except errors.ProtocolError as e:
                self._violation(CLOSE_INVALID, str(e))
                return
        else:
            self._end += nbytes
        try:
            self._parse()
        except _Violation as v:
            self._violation(v.code, str(v))
        except errors.ProtocolError as e:  # an undecodable message
            self._violation(CLOSE_INVALID, str(e))

    def _parse(self) -> None:
        if not self._head_done:
            if not self._parse_head():
                return
            if self.transport.is_closing():
                return
        view = self._view
        while True:
            avail = self._end - self._start
            if avail < 2:
                break
            s = self._start
            b0, b1 = view[s], view[s + 1]
            if b0 & 0x70:
                raise _Violation(CLOSE_PROTOCOL, "reserved bits set (no extension was negotiated)")
            if b1 & 0x80:
                raise _Violation(CLOSE_PROTOCOL, "masked frame from the server")
            op, fin, n, hl = b0 & 0x0F, bool(b0 & 0x80), b1 & 0x7F, 2
            if n == 126:
                if avail < 4:
                    break
                n, hl = (view[s + 2] << 8) | view[s + 3], 4
            elif n == 127:
                if avail < 10:
                    break
                n, hl = int.from_bytes(view[s + 2:s + 10], "big"), 10
            if op >= 8:
                if n > 125 or not fin:
                    raise _Violation(CLOSE_PROTOCOL, "bad control frame")
            elif op not in (OP_CONT, OP_TEXT, OP_BINARY):
                raise _Violation(CLOSE_PROTOCOL, f"unknown opcode {op}")
            # The limit applies to the whole message, before any allocation.
            pending = len(self._frag) if self._frag is not None and op < 8 else 0
            if op < 8 and n + pending > self._limit:
                raise _Violation(CLOSE_TOO_BIG, f"message of {n + pending} bytes exceeds the read limit {self._limit}")
            if avail < hl + n:
                if s + hl + n > len(self._buf):
                    if hl + n <= _KEEP:
                        # Make the whole frame fit, so it arrives in place.
                        self._compact(max(hl + n, 64 << 10))
                    else:
                        # Read the rest straight into a buffer of its own.
                        big = bytearray(n)
                        have = avail - hl
                        big[:have] = view[s + hl:self._end]
                        self._start = self._end = 0
                        self._big, self._big_view, self._big_have = big, memoryview(big), have
                        self._big_op, self._big_fin = op, fin
                break
            payload = view[s + hl:s + hl + n]
            self._start = s + hl + n
            if not self._deliver(op, payload, fin):
                return
        if self._start == self._end:
            self._start = self._end = 0

    def _deliver(self, op: int, payload: memoryview, fin: bool) -> bool:
        """Handles one frame; False when the connection is done."""
        if op == OP_BINARY or op == OP_TEXT:
            if self._frag is not None:
                raise _Violation(CLOSE_PROTOCOL, "new message inside a fragmented one")
            if op == OP_TEXT:
                raise _Violation(CLOSE_UNSUPPORTED, "text frame on the protobuf subprotocol")
            if fin:
                self._on_message(payload)
            else:
                self._frag, self._frag_op = bytearray(payload), op
        elif op == OP_CONT:
            if self._frag is None:
                raise _Violation(CLOSE_PROTOCOL, "continuation without a message")
            self._frag += payload
            if fin:
                msg, self._frag = self._frag, None
                self._on_message(memoryview(msg))
        elif op == OP_PING:
            if not self._close_sent:
                self.transport.write(frame(OP_PONG, bytes(payload)))
        elif op == OP_PONG:
            pass
        elif op == OP_CLOSE:
            code, reason = CLOSE_NORMAL if len(payload) == 0 else 0, ""
            if len(payload) >= 2:
                code = (payload[0] << 8) | payload[1]
                reason = bytes(payload[2:]).decode("utf-8", "replace")
            elif len(payload) == 1:
                raise _Violation(CLOSE_PROTOCOL, "close frame of one byte")
            self.close_code, self.close_reason = code or 1005, reason
            if not self._close_sent:
                self._close_sent = True
                self.transport.write(frame(OP_CLOSE, struct.pack("!H", code) if code else b""))
            self.transport.close()
            return False
        return True

    def _violation(self, code: int, reason: str) -> None:
        """The server broke the protocol: say why (best effort) and drop the connection."""
        if self.close_code == 0:
            self.close_code, self.close_reason = code, reason
            self.protocol_error = reason
        if not self._close_sent and not self.transport.is_closing():
            self._close_sent = True
            self.transport.write(frame(OP_CLOSE, struct.pack("!H", code) + reason.encode()[:120]))
        self.transport.close()

    protocol_error = ""

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        if self._handshake is not None and not self._handshake.done():
            self._handshake.set_exception(HandshakeError(f"connection closed during the upgrade: {exc or 'EOF'}"))
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        if self._close_waiter is not None and not self._close_waiter.done():
            self._close_waiter.set_result(None)
        self._on_close(self.close_code, self.close_reason, exc)

    def pause_writing(self) -> None:
        if self._drain is None or self._drain.done():
            self._drain = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    # ---- sending

    def send(self, payload: bytes) -> None:
        """Queues one binary message (the transport buffers it)."""
        self.transport.write(frame(OP_BINARY, payload))

    async def drain(self) -> None:
        """Waits while the transport's write buffer is above its high mark."""
        d = self._drain
        if d is not None and not d.done():
            await asyncio.shield(d)

    async def close(self, code: int = CLOSE_NORMAL, timeout: float = 1.0) -> None:
        """The closing handshake: sends a close frame and waits (bounded) for
        the server to close the connection."""
        if self.closed:
            return
        if not self._close_sent:
            self._close_sent = True
            self.close_code = self.close_code or code
            self.transport.write(frame(OP_CLOSE, struct.pack("!H", code)))
        self._close_waiter = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(asyncio.shield(self._close_waiter), timeout)
        except asyncio.TimeoutError:
            pass
        finally:
            if not self.closed:
                self.transport.abort()


class _Violation(Exception):
    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code


async def connect(host: str, port: int | None, path: str, *, subprotocol: str, headers: Mapping[str, str],
                  on_message: Callable[[memoryview], None],
                  on_close: Callable[[int, str, BaseException | None], None], read_limit: int,
                  ssl: ssl_mod.SSLContext | None = None, unix_socket: str | None = None,
                  host_header: str | None = None, server_hostname: str | None = None) -> Protocol:
    """Connects (TCP, TLS or a unix socket) and runs the opening handshake.

    With TLS the certificate is verified against ``server_hostname`` when
    given, else against ``host``."""
    loop = asyncio.get_running_loop()

    def factory() -> Protocol:
        return Protocol(on_message, on_close, read_limit)

    if unix_socket is not None:
        transport, proto = await loop.create_unix_connection(factory, unix_socket)
    else:
        transport, proto = await loop.create_connection(factory, host, port, ssl=ssl,
                                                        server_hostname=(server_hostname or host) if ssl else None)
    try:
        sock = transport.get_extra_info("socket")
        if sock is not None and unix_socket is None:
            import socket
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await proto.handshake(host_header or host, path, subprotocol, headers)
    except BaseException:
        transport.abort()
        raise
    return proto
