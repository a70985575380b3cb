"""What the two WebSocket adapters (Cartesia, ElevenLabs) share: the socket, the bridge, the contexts.

An adapter is a :class:`SocketAdapter` subclass: ``on_message`` gets each parsed JSON object and
drives the bridge in the session's terms (open, text, flush, end, cancel), ``on_event`` turns the
connection's events into its API's messages. The client's own context ids are the protocol
context ids, so the connection's limits and tombstones apply to them unchanged. Paced like
``/v1/stream``: audio runs a bounded lead ahead of the listener, which is what makes a cancel cheap.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from .. import protocol as P
from ..session import Event, SessionContext, SessionError
from .bridge import Bridge, Host, read_socket

log = logging.getLogger(__name__)
RATES = frozenset(P.SAMPLE_RATES)


class SocketAdapter:
    """One client WebSocket speaking a foreign API over one in-process protocol connection."""

    def __init__(self, host: Host, ws: web.WebSocketResponse, request: web.Request) -> None:
        self.host = host
        self.ws = ws
        self.bridge = Bridge(host, self._event, transport=request.transport, close=self._close)
        self.contexts: dict[str, SessionContext] = {}  # live contexts by the client's id

    # -- to override
    async def on_message(self, msg: dict[str, Any]) -> None:
        raise NotImplementedError

    async def on_event(self, event: Event) -> None:
        raise NotImplementedError

    async def bad_message(self, message: str, context_id: str | None = None) -> None:
        """A message that cannot be used: that API's error, and the connection goes on."""
        raise NotImplementedError

    # -- shared
    async def serve(self) -> None:
        async with self.bridge.running():
            await read_socket(self.ws, self._text, self._binary)

    async def _text(self, raw: str) -> None:
        try:
            msg = json.loads(raw)
        except ValueError:
            await self.bad_message("messages must be JSON objects")
            return
        if not isinstance(msg, dict):
            await self.bad_message("messages must be JSON objects")
            return
        await self.on_message(msg)

    async def _binary(self) -> None:
        await self.bad_message("binary messages are not accepted; send JSON text")

    async def _event(self, event: Event) -> None:
        await self.on_event(event)

    async def _close(self, code: int, message: bytes) -> None:
        await self.ws.close(code=code, message=message)

    async def send(self, obj: dict[str, Any]) -> None:
        try:
            await self.ws.send_str(json.dumps(obj))
        except (ConnectionError, RuntimeError):  # the peer went away; the reader ends the connection
            pass

    def open(self, context_id: str, **fmt: Any) -> SessionContext | None:
        """Open a protocol context for the client's id; ``None`` when the session refuses (an id
        still open here: its cancel is on its way)."""
        try:
            ctx = self.bridge.open(context_id, **fmt)
        except SessionError:
            return None
        self.contexts[context_id] = ctx
        return ctx

    def finished(self, ctx: SessionContext) -> None:
        if self.contexts.get(ctx.context_id) is ctx:
            del self.contexts[ctx.context_id]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def pcm_s16_to_f32(data: bytes) -> bytes:
    """Cartesia's ``pcm_f32le`` from our 16-bit samples."""
    import numpy as np

    return (np.frombuffer(data, dtype="<i2").astype("<f4") / 32768.0).tobytes()


async def serve_socket(
    host: Host,
    request: web.Request,
    make: Callable[[web.WebSocketResponse], SocketAdapter],
    *,
    refuse_draining: Callable[[], web.Response],
) -> web.StreamResponse:
    """The route handler: refuse during a drain (at the handshake, as ``/v1/stream``), else serve."""
    if host.draining:
        return refuse_draining()
    ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=host.config.limits.message_cap())
    await ws.prepare(request)
    await make(ws).serve()
    return ws
