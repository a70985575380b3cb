"""Async client for protocol v1: one persistent WebSocket, many contexts, acknowledged cancel.

Example::

    async with TTSClient("ws://127.0.0.1:8765/v1/stream") as client:
        ctx = await client.open(sample_rate=16000)
        await ctx.send_text("Hello there. ")
        await ctx.end()
        async for item in ctx:
            if isinstance(item, AudioFrame):
                play(item.pcm)

Why it looks like this: a voice agent talks in many short turns and is interrupted often.
Reconnecting per turn costs a handshake on the next turn's first byte, so the socket is kept
across contexts and cancels. Frames are routed by the server's per-context ``stream`` number;
any frame whose stream is not live (cancelled, finished, unknown) is dropped and counted, so a
late frame can never play after a barge-in. A cancel resolves when the server's ack arrives;
a missing ack means the connection cannot be trusted, so it is dropped and re-established.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from . import protocol as P
from .protocol import MsgType

log = logging.getLogger(__name__)


class TTSError(Exception):
    """An ``error`` message from the server, or a failure of the client."""

    def __init__(self, code: str, message: str, context_id: str | None = None, **extra: Any) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.context_id = context_id
        self.extra = extra


class TTSConnectionError(TTSError):
    """The connection failed or was lost; delivered to every waiting context."""

    def __init__(self, message: str) -> None:
        super().__init__("connection", message)


class TTSOverloaded(TTSError):
    """Admission refused; retry after ``retry_after_ms``."""

    @property
    def retry_after_ms(self) -> int:
        return int(self.extra.get("retry_after_ms", 1000))


@dataclass(frozen=True, slots=True)
class AudioFrame:
    context_id: str
    seq: int
    pcm: bytes  # pcm_s16le mono, or mu-law bytes when the context asked for "mulaw"
    sample_rate: int
    encoding: str
    received_at: float  # time.monotonic()

    @property
    def duration_s(self) -> float:
        width = 1 if self.encoding == P.MULAW else 2
        return len(self.pcm) / width / self.sample_rate


@dataclass(frozen=True, slots=True)
class Word:
    word: str
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class WordTimings:
    context_id: str
    words: list[Word]


@dataclass(frozen=True, slots=True)
class CancelResult:
    acked: bool  # the server's ack arrived, or the context had already finished (nothing to stop)
    latency_s: float
    frames_dropped_server: int  # computed frames the server never sent
    frames_dropped_client: int  # frames that arrived after the cancel and were discarded
    # "acked" | "finished" (done before the cancel) | "timeout" (no ack: connection dropped and
    # re-established) | "disconnected" (the connection was already gone; the server drops a lost
    # connection's contexts itself)
    reason: str = "acked"


_END = object()


@dataclass(eq=False)
class TTSContext:
    """One utterance (or one LLM turn) on the shared connection."""

    client: TTSClient
    context_id: str
    stream: int = 0
    sample_rate: int = 0
    encoding: str = P.PCM_S16LE
    frames: int = 0
    audio_ms: float = 0.0
    done: bool = False
    cancelled: bool = False
    dropped_after_cancel: int = 0
    _queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    _started: asyncio.Future | None = None
    _report_start_errors: bool = False  # open(wait=False): start errors go to the iterator
    _ack: asyncio.Future | None = None

    async def send_text(self, text: str) -> None:
        await self.client._send(P.text(self.context_id, text))

    async def flush(self) -> None:
        await self.client._send(P.flush(self.context_id))

    async def end(self) -> None:
        await self.client._send(P.end(self.context_id))

    async def cancel(self, timeout: float | None = None) -> CancelResult:
        """Stop this context; returns once the server acknowledged (or the timeout passed).

        From the moment this is called, no frame of this context is yielded any more.
        """
        return await self.client._cancel(self, timeout)

    def cancel_nowait(self) -> asyncio.Task[CancelResult]:
        """Start a cancel without waiting for its ack (the frames are gated at once)."""
        self.client._gate(self)
        return asyncio.ensure_future(self.cancel())

    def __aiter__(self) -> TTSContext:
        return self

    async def __anext__(self) -> AudioFrame | WordTimings:
        if self.cancelled and self._queue.empty():
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is _END:
            self._queue.put_nowait(_END)  # keep ending for repeated iteration
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self._queue.put_nowait(_END)
            raise item
        return item

    async def collect(self) -> bytes:
        """All audio of the context (convenience for one-shot use)."""
        out = bytearray()
        async for item in self:
            if isinstance(item, AudioFrame):
                out += item.pcm
        return bytes(out)


class TTSClient:
    """One persistent connection to a streamvox server, shared by many contexts."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        connect_timeout: float = 5.0,
        cancel_timeout: float = 1.0,
        open_timeout: float = 5.0,
        connect_attempts: int = 5,
        backoff_s: float = 0.2,
        max_backoff_s: float = 5.0,
    ) -> None:
        self.url = url
        self.api_key = api_key
        self.connect_timeout = connect_timeout
        self.cancel_timeout = cancel_timeout
        self.open_timeout = open_timeout
        self.connect_attempts = connect_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.server_info: dict[str, Any] = {}
        self.reconnects = 0
        self.connections = 0
        self.frames_dropped = 0  # stale frames discarded (cancelled/unknown streams)
        self._session: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task | None = None
        self._contexts: dict[str, TTSContext] = {}
        self._by_stream: dict[int, TTSContext] = {}
        self._acks: dict[str, list[asyncio.Future]] = {}
        self._pings: dict[Any, asyncio.Future] = {}
        self._ids = itertools.count(1)
        self._connect_lock = asyncio.Lock()
        self._closed = False
        self._background: set[asyncio.Task] = set()
        self._disconnected = asyncio.Event()
        self._lost_reason = ""

    # ------------------------------------------------------------ connection
    @property
    def connected(self) -> bool:
        return self._ws is not None and not self._ws.closed

    async def __aenter__(self) -> TTSClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        """Connect (or reconnect) with exponential backoff and jitter."""
        async with self._connect_lock:
            if self.connected:
                return
            if self._closed:
                raise TTSConnectionError("client is closed")
            delay = self.backoff_s
            last: Exception | None = None
            for attempt in range(self.connect_attempts):
                if self._closed:  # close() ran during a background reconnect
                    raise TTSConnectionError("client is closed")
                try:
                    await self._connect_once()
                    if self.connections > 1:
                        self.reconnects += 1
                    return
                except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                    last = exc
                    if isinstance(exc, aiohttp.WSServerHandshakeError) and exc.status in (401, 403):
                        raise TTSConnectionError(f"server refused the API key (HTTP {exc.status})") from None
                    if attempt + 1 < self.connect_attempts:
                        await asyncio.sleep(delay * (0.5 + random.random()))
                        delay = min(self.max_backoff_s, delay * 2)
            raise TTSConnectionError(f"cannot connect to {self.url}: {last}") from None

    async def _connect_once(self) -> None:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        ws = await self._session.ws_connect(
            self.url,
            headers=headers,
            timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=self.connect_timeout),
            heartbeat=30.0,
            max_msg_size=0,
        )
        try:
            msg = await asyncio.wait_for(ws.receive(), self.connect_timeout)
        except TimeoutError:
            await ws.close()
            raise
        if msg.type != aiohttp.WSMsgType.TEXT:
            await ws.close()
            raise aiohttp.ClientError(f"expected a 'ready' message, got {msg.type!r}")
        info = P.parse_server_message(msg.data)
        if info.get("type") != MsgType.READY or info.get("protocol") != P.PROTOCOL_VERSION:
            await ws.close()
            raise aiohttp.ClientError(f"server speaks an unexpected protocol: {info}")
        if self._closed:
            await ws.close()
            raise TTSConnectionError("client is closed")
        self.server_info = info
        self._ws = ws
        self._disconnected.clear()
        self.connections += 1
        self._reader = asyncio.create_task(self._read(ws), name="streamvox-client-reader")

    async def wait_disconnected(self) -> str:
        """Wait until the current connection is lost (or closed); return the reason."""
        await self._disconnected.wait()
        return self._lost_reason

    async def close(self) -> None:
        self._closed = True
        await self._drop_connection("client closed")
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _drop_connection(self, reason: str) -> None:
        ws, self._ws = self._ws, None
        reader, self._reader = self._reader, None
        if ws is not None:
            await ws.close()
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        self._fail_all(TTSConnectionError(reason))

    def _fail_all(self, exc: TTSConnectionError) -> None:
        """A lost connection is every waiter's problem: tell each of them."""
        self._lost_reason = exc.message
        self._disconnected.set()
        for ctx in list(self._contexts.values()):
            if ctx._started is not None and not ctx._started.done():
                ctx._started.set_exception(exc)
                if ctx._report_start_errors:
                    ctx._started.exception()
            if not ctx.done and not ctx.cancelled:
                ctx._queue.put_nowait(exc)
        for futs in self._acks.values():
            for fut in futs:
                if not fut.done():
                    fut.set_exception(exc)
        for fut in self._pings.values():
            if not fut.done():
                fut.set_exception(exc)
        self._contexts.clear()
        self._by_stream.clear()
        self._acks.clear()
        self._pings.clear()

    async def _send(self, data: str) -> None:
        if not self.connected:
            raise TTSConnectionError("not connected (the connection was lost; open a new context)")
        try:
            await self._ws.send_str(data)  # type: ignore[union-attr]
        except (ConnectionError, RuntimeError) as exc:
            await self._drop_connection(f"send failed: {exc}")
            raise TTSConnectionError(f"send failed: {exc}") from None

    # ------------------------------------------------------------ contexts
    async def open(
        self,
        *,
        voice: str | None = None,
        sample_rate: int | None = None,
        encoding: str | None = None,
        pace: bool | None = None,
        text: str | None = None,
        context_id: str | None = None,
        wait: bool = True,
    ) -> TTSContext:
        """Start a context; by default wait for the server's ``started`` (or its error).

        ``wait=False`` returns as soon as ``start`` is sent, saving a round trip before the next
        ``send_text``: a refusal (``overloaded``, ``unknown_voice``) then surfaces when the
        context is iterated. ``sample_rate`` and ``stream`` are known once ``started`` arrived,
        which is always before the first frame.
        """
        if not self.connected:
            await self.connect()
        ctx_id = context_id or f"c{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        if ctx_id in self._contexts:
            raise TTSError(P.ErrorCode.BAD_REQUEST, f"context {ctx_id!r} is already open on this client")
        ctx = TTSContext(self, ctx_id)
        ctx._started = asyncio.get_running_loop().create_future()
        ctx._report_start_errors = not wait
        self._contexts[ctx_id] = ctx
        sent = False
        try:
            await self._send(
                P.start(ctx_id, voice=voice, sample_rate=sample_rate, encoding=encoding, pace=pace, text=text)
            )
            sent = True
            if wait:
                await asyncio.wait_for(ctx._started, self.open_timeout)
        except BaseException:
            self._contexts.pop(ctx_id, None)
            if sent and self.connected:
                # Cancelled (or timed out) after the server got 'start': do not leave the context
                # running there, holding one of the connection's context slots.
                self._background_send(P.cancel(ctx_id))
            raise
        return ctx

    def _background_send(self, data: str) -> None:
        async def send() -> None:
            try:
                await self._send(data)
            except TTSConnectionError:
                pass

        task = asyncio.ensure_future(send())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _gate(self, ctx: TTSContext) -> None:
        """From now on nothing of this context is yielded; late frames are counted and dropped."""
        if ctx.cancelled:
            return
        ctx.cancelled = True
        while not ctx._queue.empty():
            item = ctx._queue.get_nowait()
            if isinstance(item, AudioFrame):
                ctx.dropped_after_cancel += 1
                self.frames_dropped += 1
        ctx._queue.put_nowait(_END)

    async def _cancel(self, ctx: TTSContext, timeout: float | None) -> CancelResult:
        t0 = time.monotonic()
        already_finished = ctx.done
        self._gate(ctx)
        if already_finished:
            return CancelResult(True, 0.0, 0, ctx.dropped_after_cancel, "finished")
        if not self.connected:
            return CancelResult(False, 0.0, 0, ctx.dropped_after_cancel, "disconnected")
        if ctx.context_id not in self._contexts:  # ended by an error meanwhile
            return CancelResult(True, 0.0, 0, ctx.dropped_after_cancel, "finished")
        fut = asyncio.get_running_loop().create_future()
        self._acks.setdefault(ctx.context_id, []).append(fut)
        try:
            await self._send(P.cancel(ctx.context_id))
            ack = await asyncio.wait_for(fut, timeout if timeout is not None else self.cancel_timeout)
        except TimeoutError:
            log.warning(
                "no cancel ack for %s within %.1f s: reconnecting", ctx.context_id, timeout or self.cancel_timeout
            )
            await self._drop_connection("cancel was not acknowledged")
            task = asyncio.ensure_future(self._reconnect_quietly())
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            return CancelResult(False, time.monotonic() - t0, 0, ctx.dropped_after_cancel, "timeout")
        except TTSConnectionError:
            return CancelResult(False, time.monotonic() - t0, 0, ctx.dropped_after_cancel, "disconnected")
        return CancelResult(True, time.monotonic() - t0, int(ack.get("frames_dropped", 0)), ctx.dropped_after_cancel)

    async def _reconnect_quietly(self) -> None:
        try:
            await self.connect()
        except TTSConnectionError as exc:
            log.warning("reconnect failed: %s", exc)

    async def ping(self, timeout: float = 5.0) -> float:
        """Round-trip time of a ping, in seconds."""
        if not self.connected:
            await self.connect()
        pid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._pings[pid] = fut
        t0 = time.monotonic()
        await self._send(P.ping(pid))
        await asyncio.wait_for(fut, timeout)
        return time.monotonic() - t0

    # ------------------------------------------------------------ receiving
    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        reason = "server closed the connection"
        try:
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.BINARY:
                    self._on_audio(msg.data)
                elif msg.type == aiohttp.WSMsgType.TEXT:
                    self._on_message(P.parse_server_message(msg.data))
                elif msg.type == aiohttp.WSMsgType.ERROR:
                    reason = f"connection error: {ws.exception()}"
                    break
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a malformed server message: the connection is unusable
            log.exception("reader failed")
            reason = f"reader failed: {exc}"
        if self._ws is ws:
            self._ws = None
            self._reader = None
            await ws.close()
            self._fail_all(TTSConnectionError(reason))

    def _on_audio(self, data: bytes) -> None:
        stream, seq, payload = P.unpack_frame(data)
        ctx = self._by_stream.get(stream)
        if ctx is None or ctx.cancelled:
            self.frames_dropped += 1
            if ctx is not None:
                ctx.dropped_after_cancel += 1
            return
        ctx.frames += 1
        ctx._queue.put_nowait(AudioFrame(ctx.context_id, seq, payload, ctx.sample_rate, ctx.encoding, time.monotonic()))

    def _on_message(self, msg: dict[str, Any]) -> None:
        mtype = msg["type"]
        ctx = self._contexts.get(msg.get("context_id") or "")
        if mtype == MsgType.STARTED and ctx is not None:
            ctx.stream = int(msg["stream"])
            ctx.sample_rate = int(msg["sample_rate"])
            ctx.encoding = msg["encoding"]
            self._by_stream[ctx.stream] = ctx
            if ctx._started is not None and not ctx._started.done():
                ctx._started.set_result(None)
        elif mtype == MsgType.WORDS and ctx is not None and not ctx.cancelled:
            words = [Word(w["word"], float(w["start"]), float(w["end"])) for w in msg.get("words", [])]
            ctx._queue.put_nowait(WordTimings(ctx.context_id, words))
        elif mtype == MsgType.DONE and ctx is not None:
            ctx.done = True
            ctx.audio_ms = float(msg.get("audio_ms", 0.0))
            ctx._queue.put_nowait(_END)
            self._forget(ctx)
        elif mtype == MsgType.CANCELLED:
            for fut in self._acks.pop(msg.get("context_id", ""), []):
                if not fut.done():
                    fut.set_result(msg)
            if ctx is not None:
                self._forget(ctx)
        elif mtype == MsgType.ERROR:
            self._on_error(msg, ctx)
        elif mtype == MsgType.PONG:
            fut = self._pings.pop(msg.get("id"), None)
            if fut is not None and not fut.done():
                fut.set_result(None)
        elif mtype not in (MsgType.STARTED, MsgType.WORDS, MsgType.DONE, MsgType.READY):
            log.warning("unknown server message type %r", mtype)

    def _on_error(self, msg: dict[str, Any], ctx: TTSContext | None) -> None:
        extra = {k: v for k, v in msg.items() if k not in ("type", "code", "message", "context_id")}
        cls = TTSOverloaded if msg.get("code") == P.ErrorCode.OVERLOADED else TTSError
        exc = cls(msg.get("code", "unknown"), msg.get("message", ""), msg.get("context_id"), **extra)
        if ctx is None:
            log.warning("server error: %s", exc)
            return
        ended = msg.get("context_ended", True)
        if ctx._started is not None and not ctx._started.done() and ended:
            ctx._started.set_exception(exc)
            if not ctx._report_start_errors:
                self._forget(ctx)
                return
            ctx._started.exception()  # nobody awaits it: mark it retrieved
        if not ctx.cancelled:
            ctx._queue.put_nowait(exc)
        if ended:
            self._forget(ctx)

    def _forget(self, ctx: TTSContext) -> None:
        self._contexts.pop(ctx.context_id, None)
        if self._by_stream.get(ctx.stream) is ctx:
            del self._by_stream[ctx.stream]
