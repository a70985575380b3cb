"""Helpers of the hardening tests (issue 13) and of ``scripts/probe_hardening.py``.

A peer that never reads cannot be written with aiohttp or websockets: both keep reading the
socket in the background. :class:`NonReadingPeer` is a bare TCP socket with a tiny receive
buffer that does the WebSocket handshake by hand, sends masked frames and reads nothing.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
from typing import Any
from urllib.parse import urlsplit


def strict_json(raw: str) -> Any:
    """``json.loads`` that refuses what strict parsers refuse (NaN, Infinity)."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(raw, parse_constant=refuse)


class NonReadingPeer:
    """A WebSocket client that sends but never reads after the handshake."""

    def __init__(self, ws_url: str, *, rcvbuf: int = 4096) -> None:
        parts = urlsplit(ws_url)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # set before connect so the advertised window stays small: the server's writes back up fast
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.connect((parts.hostname, parts.port))
        key = base64.b64encode(os.urandom(16)).decode()
        request = (
            f"GET {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        self.sock.sendall(request.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            if not chunk:
                raise ConnectionError("server closed during the handshake")
            head += chunk
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"handshake refused: {head[:80]!r}")
        # a short send timeout: a server that stopped reading our input must not block us for long
        self.sock.settimeout(1.0)

    def send_text(self, text: str) -> bool:
        """Send one masked text frame; False once the server has closed the connection."""
        payload = text.encode()
        mask = os.urandom(4)
        n = len(payload)
        if n < 126:
            header = struct.pack("!BB", 0x81, 0x80 | n)
        elif n < 1 << 16:
            header = struct.pack("!BBH", 0x81, 0x80 | 126, n)
        else:
            header = struct.pack("!BBQ", 0x81, 0x80 | 127, n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        try:
            self.sock.sendall(header + mask + masked)
        except OSError:
            return False
        return True

    def read_close_code(self, limit: int = 64 << 20) -> int | None:
        """Read everything the server queued (finally) and return its close code, if one came."""
        self.sock.settimeout(10.0)
        buf = b""
        while len(buf) < limit:
            try:
                chunk = self.sock.recv(1 << 16)
            except (TimeoutError, OSError):
                break
            if not chunk:
                break
            buf += chunk
        pos = 0
        while pos + 2 <= len(buf):  # walk the frames; a close frame is opcode 0x8
            opcode, n = buf[pos] & 0x0F, buf[pos + 1] & 0x7F
            pos += 2
            if n == 126:
                (n,) = struct.unpack_from("!H", buf, pos)
                pos += 2
            elif n == 127:
                (n,) = struct.unpack_from("!Q", buf, pos)
                pos += 8
            if opcode == 0x8 and n >= 2:
                return struct.unpack_from("!H", buf, pos)[0]
            pos += n
        return None

    def close(self) -> None:
        self.sock.close()
