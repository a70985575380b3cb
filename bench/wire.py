"""A protocol-v1 client that records every message with its arrival time.

The bench does not use :class:`tts_service.client.TTSClient` for measuring: that client gates
stale frames away (correctly, for an agent), which would hide exactly what the bench must see -
a frame that arrives after a cancel ack. It drives the same protocol session
(:mod:`tts_service.session`) but records what an agent drops: every binary frame is attributed
by the ``stream`` number of its header (late frames of a cancelled context included), and every
message gets a connection-wide index, so "after the ack" means "later on the wire",
independent of clock resolution.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tts_service import protocol as P
from tts_service.aio import wait_set
from tts_service.session import (
    Acked,
    Audio,
    ClientSession,
    Done,
    Failed,
    SessionContext,
    SessionError,
    Started,
    Unknown,
    Words,
    check_ready,
)


class WireError(Exception):
    """The server misbehaved or did not answer in time."""


@dataclass(slots=True)
class Frame:
    t: float  # time.perf_counter() at arrival
    index: int  # message index on the connection
    seq: int
    nbytes: int  # payload bytes (header excluded)


@dataclass(eq=False)
class Ctx:
    """One context as observed on the wire."""

    context_id: str
    conn: Conn
    s: SessionContext | None = None  # the protocol state (tts_service.session)
    stream: int | None = None
    sample_rate: int = 0
    encoding: str = P.PCM_S16LE
    start_sent: float | None = None
    started_at: float | None = None
    text_sent: float | None = None  # first text message sent
    first_attempt_at: float | None = None  # when an earlier, refused attempt of this request was sent
    refusals: int = 0  # overloaded refusals before this context was admitted
    cancel_sent: float | None = None
    cancel_index: int | None = None  # message index when the cancel was sent
    ack_at: float | None = None
    ack_index: int | None = None
    ack: dict[str, Any] | None = None
    done_at: float | None = None
    done: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    frames: list[Frame] = field(default_factory=list)
    keep_audio: bool = False
    pcm: bytearray = field(default_factory=bytearray)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    # -- figures
    @property
    def bytes_per_sample(self) -> int:
        return 1 if self.encoding == P.MULAW else 2

    def frame_s(self, f: Frame) -> float:
        return f.nbytes / self.bytes_per_sample / (self.sample_rate or 1)

    @property
    def audio_s(self) -> float:
        return sum(self.frame_s(f) for f in self.frames)

    @property
    def first_frame_at(self) -> float | None:
        return self.frames[0].t if self.frames else None

    @property
    def ttfb_s(self) -> float | None:
        """First text sent -> first binary frame received (from the first attempt if it was refused)."""
        if self.text_sent is None or not self.frames:
            return None
        t0 = self.text_sent if self.first_attempt_at is None else min(self.text_sent, self.first_attempt_at)
        return self.frames[0].t - t0

    @property
    def finished(self) -> bool:
        return self.done is not None or self.ack is not None or self.error is not None

    @property
    def refused(self) -> bool:
        return self.error is not None and self.error.get("code") == P.ErrorCode.OVERLOADED

    def frames_after_ack(self) -> int:
        if self.ack_index is None:
            return 0
        return sum(1 for f in self.frames if f.index > self.ack_index)

    def audio_after_cancel_s(self) -> float:
        if self.cancel_index is None:
            return 0.0
        return sum(self.frame_s(f) for f in self.frames if f.index > self.cancel_index)

    def seq_errors(self) -> int:
        return sum(1 for i, f in enumerate(self.frames) if f.seq != i)

    # -- actions
    # The bench sends what it is told, even to a finished context: it measures the server.
    async def text(self, text: str) -> None:
        if self.text_sent is None:
            self.text_sent = time.perf_counter()
        await self.conn.send(P.text(self.context_id, text))

    async def end(self) -> None:
        if self.s is not None:
            self.s.ended = True
        await self.conn.send(P.end(self.context_id))

    async def flush(self) -> None:
        await self.conn.send(P.flush(self.context_id))

    async def cancel(self) -> None:
        self.cancel_sent = time.perf_counter()
        self.cancel_index = self.conn.index
        if self.s is not None:
            self.conn.session.cancel(self.s)  # gated: later frames are "after the cancel"
        await self.conn.send(P.cancel(self.context_id))

    async def wait(self, predicate, timeout: float) -> bool:
        """Wait until ``predicate(self)`` holds or the timeout passes (False then)."""
        deadline = time.perf_counter() + timeout
        while not predicate(self):
            left = deadline - time.perf_counter()
            if left <= 0 or self.conn.closed:
                return bool(predicate(self))
            self._changed.clear()
            await wait_set(self._changed, left)
        return True

    async def wait_started(self, timeout: float = 10.0) -> None:
        ok = await self.wait(lambda c: c.started_at is not None or c.error is not None, timeout)
        if not ok:
            raise WireError(f"no 'started' for {self.context_id} within {timeout:.0f} s")

    async def wait_first_frame(self, timeout: float = 30.0) -> bool:
        return await self.wait(lambda c: bool(c.frames) or c.finished, timeout)

    async def wait_finished(self, timeout: float = 60.0) -> bool:
        return await self.wait(lambda c: c.finished, timeout)

    def _notify(self) -> None:
        self._changed.set()


class Conn:
    """One WebSocket connection; contexts are opened on it and recorded."""

    def __init__(self, url: str, *, api_key: str | None = None) -> None:
        self.url = url
        self.api_key = api_key
        self.ready: dict[str, Any] = {}
        self.session = ClientSession()
        self.orphan_frames = 0  # frames whose stream number no context owns
        self.unknown_messages: list[dict[str, Any]] = []
        self.connect_s: float | None = None  # handshake + ready
        self._session: aiohttp.ClientSession | None = None
        self._own_session = False
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task | None = None
        self._by_id: dict[str, Ctx] = {}
        self._ids = itertools.count(1)

    @property
    def index(self) -> int:
        """Messages received so far (the session counts them, ``ready`` excluded)."""
        return self.session.messages

    @property
    def closed(self) -> bool:
        return self._ws is None or self._ws.closed

    async def connect(self, session: aiohttp.ClientSession | None = None, timeout: float = 10.0) -> Conn:
        t0 = time.perf_counter()
        if session is None:
            session, self._own_session = aiohttp.ClientSession(), True
        self._session = session
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            self._ws = await session.ws_connect(
                self.url,
                headers=headers,
                max_msg_size=0,
                timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=timeout),
            )
            msg = await asyncio.wait_for(self._ws.receive(), timeout)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            await self.close()
            raise WireError(f"cannot connect to {self.url}: {exc or type(exc).__name__}") from None
        try:
            if msg.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                raise SessionError(f"got {msg.type!r}")
            self.ready = check_ready(msg.data)
        except SessionError as exc:
            await self.close()
            raise WireError(f"expected a protocol-v1 'ready' message from {self.url}: {exc}") from None
        self.session = ClientSession(self.ready)
        self.connect_s = time.perf_counter() - t0
        self._reader = asyncio.create_task(self._read(), name="bench-wire-reader")
        return self

    async def close(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            await ws.close()
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
            self._reader = None
        if self._own_session and self._session is not None:
            await self._session.close()
        self._session = None
        for ctx in self._by_id.values():
            ctx._notify()

    async def __aenter__(self) -> Conn:
        return self if self._ws is not None else await self.connect()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def send(self, data: str) -> None:
        if self._ws is None or self._ws.closed:
            raise WireError(f"connection to {self.url} is closed")
        await self._ws.send_str(data)

    async def start(self, *, prefix: str = "b", keep_audio: bool = False, **opts: Any) -> Ctx:
        """Send ``start`` (does not wait for ``started``; see :meth:`Ctx.wait_started`)."""
        ctx = Ctx(f"{prefix}{next(self._ids)}", self, keep_audio=keep_audio)
        ctx.s, message = self.session.start(ctx.context_id, owner=ctx, **opts)
        self._by_id[ctx.context_id] = ctx
        ctx.start_sent = time.perf_counter()
        await self.send(message)
        return ctx

    async def _read(self) -> None:
        assert self._ws is not None
        async for msg in self._ws:
            now = time.perf_counter()
            if msg.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT):
                self._record(self.session.receive(msg.data), now)
            elif msg.type in (aiohttp.WSMsgType.ERROR, aiohttp.WSMsgType.CLOSED):
                break
        for ctx in self._by_id.values():
            ctx._notify()

    def _record(self, ev: object, now: float) -> None:
        if isinstance(ev, Audio):
            ctx = ev.ctx.owner if ev.ctx is not None else None
            if ctx is None:
                self.orphan_frames += 1
                return
            # Recorded even when stale: a frame after the ack is what the bench must count.
            ctx.frames.append(Frame(now, self.index, ev.seq, len(ev.payload)))
            if ctx.keep_audio:
                ctx.pcm += ev.payload
        elif isinstance(ev, Started):
            ctx = ev.ctx.owner
            ctx.started_at, ctx.stream = now, ev.ctx.stream
            ctx.sample_rate, ctx.encoding = ev.ctx.sample_rate, ev.ctx.encoding
        elif isinstance(ev, Done):
            ctx = ev.ctx.owner
            ctx.done_at, ctx.done = now, {"frames": ev.frames, "audio_ms": ev.audio_ms}
        elif isinstance(ev, Acked):
            ctx = self._by_id.get(ev.context_id)
            if ctx is None or ctx.ack is not None:
                return
            ctx.ack_at, ctx.ack, ctx.ack_index = now, ev.msg, self.index
        elif isinstance(ev, Failed):
            ctx = ev.ctx.owner if ev.ctx is not None else None
            if ctx is None:
                return
            ctx.error = {"type": P.MsgType.ERROR, "code": ev.code, "message": ev.message, **ev.extra}
        elif isinstance(ev, Unknown):
            self.unknown_messages.append(ev.msg)
            return
        elif isinstance(ev, Words):
            return
        else:
            return  # pong, draining: connection-level, nothing to record per context
        ctx._notify()
