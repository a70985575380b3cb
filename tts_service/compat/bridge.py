"""One in-process protocol connection that a compatible endpoint drives: the adapters' common core.

Every compatible API (OpenAI speech, Cartesia, ElevenLabs) is a *client* of the server's own
protocol, without a socket in between: the adapter builds protocol-v1 messages with the client
session (:class:`tts_service.session.ClientSession`), hands them to a real
:class:`tts_service.ws.Connection`, and gets that connection's outgoing messages back as session
events, which it translates into its API's wire shape. So contexts, tombstones, pacing,
admission, the drain and the cancel guarantee are the very code of ``/v1/stream``: a cancel
removes the context's frames still in the connection's outbox before its ack, and the session
gates the context at once, so nothing of a cancelled context reaches the adapter after it.

The connection's writer calls :class:`_Outlet` where it would call a WebSocket; the outlet
decodes with the session and awaits the adapter, so a slow peer holds back the writer and the
outbox fills up to the point where the scheduler stops releasing audio (the same back-pressure
as on ``/v1/stream``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from aiohttp import WSMsgType, web

from ..core.engine import nearest_speed
from ..core.runtime import SynthesizerBase
from ..session import ClientSession, Event, SessionContext
from ..ws import YIELD_EVERY, Connection
from .voices import VoiceMap

log = logging.getLogger(__name__)

Emit = Callable[[Event], Awaitable[None]]


class Host(Protocol):
    """What an adapter needs of :class:`tts_service.server.Server` (passed in: no import of it)."""

    synth: SynthesizerBase
    config: Any  # ServerConfig: ``limits``, ``api_key``
    draining: bool

    def attached(self, conn: Connection) -> contextlib.AbstractAsyncContextManager[Connection]: ...


class Api:
    """One compatible API on a server: its routes, over the host and the voice map they all use."""

    def __init__(self, host: Host, voices: VoiceMap) -> None:
        self.host = host
        self.voices = voices

    def routes(self) -> list[web.AbstractRouteDef]:
        raise NotImplementedError


class _Outlet:
    """Stands where the connection's WebSocket would: what it sends comes back as session events."""

    def __init__(self, bridge: Bridge, close: Callable[[int, bytes], Awaitable[Any]] | None) -> None:
        self._bridge = bridge
        self._close = close

    async def send_str(self, data: str) -> None:
        await self._bridge._deliver(data)

    async def send_bytes(self, data: bytes) -> None:
        await self._bridge._deliver(data)

    async def close(self, *, code: int = 1000, message: bytes = b"") -> bool:
        """The connection closes (a drain's 1001, a peer that does not read): close the real socket."""
        if self._close is not None:
            await self._close(code, message)
        return True


class Bridge:
    """An adapter's protocol connection: send protocol messages in, get session events out.

    ``emit`` receives every event in wire order; ``close`` closes the adapter's own socket when
    the connection is closed by the server (drain, overflow); ``None`` for HTTP.
    """

    def __init__(
        self,
        host: Host,
        emit: Emit,
        *,
        transport: asyncio.Transport | None,
        close: Callable[[int, bytes], Awaitable[Any]] | None = None,
    ) -> None:
        self.host = host
        self.session = ClientSession({"max_contexts": host.config.limits.max_contexts})
        self.conn = Connection(_Outlet(self, close), host.synth, host.config.limits, transport=transport)  # type: ignore[arg-type]
        self._emit = emit

    async def _deliver(self, data: str | bytes) -> None:
        try:
            event = self.session.receive(data)
        except (ValueError, KeyError) as exc:  # our own server's output: a bug, not the peer's fault
            log.error("compat bridge could not read the connection's message: %s", exc)
            return
        await self._emit(event)

    def send(self, msg: str | None) -> None:
        """Hand one protocol message to the connection (``None``, as the session returns for a
        message that must not be sent, is ignored). Replies come back through ``emit``."""
        if msg is not None:
            self.conn.handle(msg)

    # -- the verbs, in the session's terms
    def open(self, context_id: str, *, text: str | None = None, **fmt: Any) -> SessionContext:
        ctx, msg = self.session.start(context_id, text=text, **fmt)
        self.send(msg)
        return ctx

    def text(self, ctx: SessionContext, text: str) -> None:
        self.send(self.session.text(ctx, text))

    def flush(self, ctx: SessionContext) -> None:
        self.send(self.session.flush(ctx))

    def end(self, ctx: SessionContext) -> None:
        self.send(self.session.end(ctx))

    def cancel(self, ctx: SessionContext) -> None:
        """Gate the context here and cancel it on the connection: nothing of it is emitted after this."""
        self.send(self.session.cancel(ctx))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Bridge]:
        """Attach the connection to the server (drain notices, cut-off, close) and run its writer."""
        async with self.host.attached(self.conn):
            yield self


def foreign_speed(engine: object, value: Any, name: str) -> float | None:
    """A foreign API's speed multiplier (1.0: the voice's own rate) as the stream's ``speed``, clamped
    into what the engine renders (:func:`~tts_service.core.engine.nearest_speed`); ``None`` for
    none or 1.0. Raises ``ValueError`` with the message for the client."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ValueError(f"'{name}' must be a positive number (1.0: the voice's own rate)")
    speed = nearest_speed(engine, float(value))  # UnsupportedSpeed is a ValueError
    return None if speed == 1.0 else speed


async def read_socket(
    ws: web.WebSocketResponse, on_text: Callable[[str], Awaitable[None]], on_binary: Callable[[], Awaitable[None]]
) -> None:
    """The adapters' reader loop: text messages to ``on_text``, binary ones to ``on_binary`` (none of
    the APIs takes any); a bug in one message is logged and the connection goes on; a burst in the
    read buffer is handled in slices, so that the writer runs in between."""
    handled = 0
    async for msg in ws:
        if msg.type == WSMsgType.TEXT:
            try:
                await on_text(msg.data)
            except Exception:  # a bug must not kill the connection
                log.exception("compat: error handling %r", msg.data[:200])
        elif msg.type == WSMsgType.BINARY:
            await on_binary()
        elif msg.type == WSMsgType.ERROR:
            log.info("compat websocket error: %s", ws.exception())
        handled += 1
        if handled % YIELD_EVERY == 0:
            await asyncio.sleep(0)
