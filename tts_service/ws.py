"""One WebSocket connection of protocol v1: its contexts, their tombstones, its bounded outbox.

Every connection owns an *outbox* drained by one writer task, so audio of many contexts and
control messages leave in a single order. A cancel removes the context's frames still in the
outbox, then queues the ack: nothing of that context can follow the ack onto the wire.

The outbox is bounded in messages and bytes, control replies included: a peer that keeps
sending (pings, say) but never reads would otherwise grow the server's memory without end.
Audio is already held back at ``OUTBOX_HIGH_WATER`` by the release loop; the hard bound is for
everything else, and a connection over it is closed with 1008.

A context that ended (cancelled, done, failed, refused at start) leaves a *tombstone*: late
``text``/``flush``/``end`` messages for its id never start audio (see docs/protocol.md).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from enum import Enum

import numpy as np
from aiohttp import web

from . import protocol as P
from .audio import StreamEncoder
from .core.engine import UnsupportedSpeed
from .core.runtime import SynthesizerBase
from .core.scheduler import Output, Overloaded
from .protocol import CloseCode, ErrorCode, Limits, MsgType, ProtocolError

log = logging.getLogger(__name__)
OUTBOX_HIGH_WATER = 48  # queued audio frames per connection before unpaced streams are held back
# Hard bounds on what waits for one peer's socket. A reading peer keeps the outbox near empty
# (the writer drains it whenever the reader loop yields); these are hit only by a peer that
# stopped reading, and cost at most a few MB per connection.
OUTBOX_MAX_MESSAGES = 2048
OUTBOX_MAX_BYTES = 4 * 1024 * 1024
TOMBSTONES = 1024  # ended context ids remembered per connection (128-char ids: at most ~200 kB)
CLOSE_WAIT_S = 5.0  # how long a close handshake may take before the socket is aborted
YIELD_EVERY = 32  # client messages handled before the reader lets the writer (and others) run


class Ended(Enum):
    """Why a context id is a tombstone; decides what a late message for it gets."""

    CANCELLED = "cancelled"  # the barge-in race: late tokens are expected, dropped silently
    DONE = "done"
    FAILED = "failed"
    REFUSED = "refused"
    TOLD = "told"  # the one error about a late message was sent; later ones are dropped


@dataclass(slots=True)
class _Context:
    context_id: str
    sid: int
    stream: int
    encoder: StreamEncoder
    chars: int = 0
    frames_sent: int = 0


class Connection:
    """One WebSocket client: its contexts, its tombstones, its outbox, its writer."""

    def __init__(
        self, ws: web.WebSocketResponse, synth: SynthesizerBase, limits: Limits, *, transport: asyncio.Transport | None
    ) -> None:
        self.ws = ws
        self.transport = transport  # to cut off a peer that does not answer a close
        self.synth = synth
        self.limits = limits
        self.contexts: dict[str, _Context] = {}
        self.by_sid: dict[int, _Context] = {}
        self.ended: OrderedDict[str, Ended] = OrderedDict()
        self.draining: tuple[int, str] | None = None  # (retry_after_ms, why) once new contexts are refused
        self.late_dropped = 0  # late messages for tombstoned ids, dropped without a reply
        self._stream_numbers = itertools.count(1)
        self._outbox: deque[tuple[int | None, str | bytes]] = deque()
        self._outbox_bytes = 0
        self._queued_frames = 0
        self._wake = asyncio.Event()
        self._closed = False
        self._closing: asyncio.Task | None = None  # the close handshake started by abort()
        self.close_reason: str | None = None

    # -- outbox
    def send(self, msg: str | bytes, sid: int | None = None) -> None:
        if self._closed:
            return
        if len(self._outbox) >= OUTBOX_MAX_MESSAGES or self._outbox_bytes + len(msg) > OUTBOX_MAX_BYTES:
            self._overflow()
            return
        self._outbox.append((sid, msg))
        self._outbox_bytes += len(msg)
        if isinstance(msg, bytes):
            self._queued_frames += 1
        self._wake.set()

    def _overflow(self) -> None:
        log.warning(
            "closing a connection that does not read: %d messages (%d bytes) queued for it",
            len(self._outbox),
            self._outbox_bytes,
        )
        self.synth.metrics.connections_closed.labels("not_reading").inc()
        self.abort(CloseCode.POLICY, "send queue full: the client does not read its messages")

    def purge(self, sid: int) -> int:
        """Remove a stream's unsent messages; return how many audio frames were removed."""
        kept: deque[tuple[int | None, str | bytes]] = deque()
        dropped = 0
        for item in self._outbox:
            if item[0] == sid:
                self._outbox_bytes -= len(item[1])
                if isinstance(item[1], bytes):
                    dropped += 1
            else:
                kept.append(item)
        self._outbox = kept
        self._queued_frames -= dropped
        return dropped

    @property
    def queued(self) -> int:
        return len(self._outbox)

    async def writer(self) -> None:
        try:
            while True:
                while not self._outbox:
                    self._wake.clear()
                    await self._wake.wait()
                _, msg = self._outbox.popleft()
                self._outbox_bytes -= len(msg)
                if isinstance(msg, bytes):
                    self._queued_frames -= 1
                    await self.ws.send_bytes(msg)
                else:
                    await self.ws.send_str(msg)
        except (ConnectionError, RuntimeError):  # peer went away; the reader notices too
            self._closed = True

    async def flushed(self, timeout: float) -> None:
        """Wait (bounded) until the writer has sent everything queued."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._outbox or self._closed:
                return
            await asyncio.sleep(0.02)

    def abort(self, code: int, reason: str) -> None:
        """Stop everything now and close with ``code`` (bounded: a peer that never answers the
        close handshake is cut off after ``CLOSE_WAIT_S``)."""
        if self._closed:
            return
        self.close()
        self._outbox.clear()
        self._outbox_bytes = self._queued_frames = 0
        self.close_reason = reason
        self.start_close(code, reason)

    def start_close(self, code: int, reason: str) -> asyncio.Task:
        """Begin the close handshake in the background (once); :meth:`wait_closed` awaits it."""
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(close_ws(self.ws, self.transport, code, reason))
        return self._closing

    async def wait_closed(self) -> None:
        """Let a close started by :meth:`start_close` finish (bounded by ``CLOSE_WAIT_S``).

        The handler must wait for it before it cancels the writer or returns: a writer cancelled
        while it waits for the socket to drain cancels aiohttp's drain future, which the close
        shares (the close then aborts), and a returned handler closes the socket with unread
        input, which resets it; either way the peer never reads the close frame."""
        if self._closing is not None:
            await asyncio.gather(self._closing, return_exceptions=True)

    # -- sink protocol, one adapter per context
    def sink(self, ctx_id: str) -> _ContextSink:
        return _ContextSink(self, ctx_id)

    def deliver(self, ctx_id: str, out: Output) -> None:
        ctx = self.contexts.get(ctx_id)
        if ctx is None or ctx.sid != out.sid:
            return  # the gate: a stale stream never reaches a reused context id
        if out.kind == "audio":
            payload = ctx.encoder.encode(out.samples)
            if payload:
                self.send(P.pack_frame(ctx.stream, ctx.frames_sent, payload), ctx.sid)
                ctx.frames_sent += 1
        elif out.kind == "words":
            self.send(P.words(ctx_id, out.words or []), ctx.sid)
        elif out.kind == "done":
            tail = ctx.encoder.encode(_EMPTY, last=True)  # the resampler's last samples
            if tail:
                self.send(P.pack_frame(ctx.stream, ctx.frames_sent, tail), ctx.sid)
                ctx.frames_sent += 1
            self.send(P.done(ctx_id, ctx.frames_sent, out.audio_ms), ctx.sid)
            self._forget(ctx_id, Ended.DONE)
        elif out.kind == "error":
            self.send(P.error(out.code, out.message, ctx_id, context_ended=True), ctx.sid)
            self._forget(ctx_id, Ended.FAILED)

    def _forget(self, ctx_id: str, why: Ended) -> None:
        ctx = self.contexts.pop(ctx_id, None)
        if ctx is not None:
            self.by_sid.pop(ctx.sid, None)
        self._bury(ctx_id, why)

    def _bury(self, ctx_id: str, why: Ended) -> None:
        self.ended.pop(ctx_id, None)
        self.ended[ctx_id] = why
        while len(self.ended) > TOMBSTONES:
            self.ended.popitem(last=False)

    # -- client messages
    def handle(self, raw: str) -> None:
        if self._closed:  # aborted (or closing): what is still in the read buffer is moot
            return
        msg = None
        try:
            msg = P.parse_client_message(raw, self.limits)
            getattr(self, f"_on_{msg.type}")(msg)
        except ProtocolError as exc:
            if exc.msg_type is None and msg is not None:
                exc.msg_type = msg.type
            self.refuse(exc)

    def refuse(self, exc: ProtocolError, **extra) -> None:
        """Send one error for ``exc``; a refused start leaves a tombstone like any ended context."""
        self.synth.metrics.errors.labels(exc.code).inc()
        if exc.context_id:
            live = exc.context_id in self.contexts
            # A context that is not live (never started, or refused at start) has ended as far as the client
            # is concerned; an error about one message of a live context leaves that context running.
            extra["context_ended"] = not live
            if not live and exc.msg_type in (MsgType.START, MsgType.TEXT):
                self._bury(exc.context_id, Ended.TOLD)  # its late tokens must not start it with defaults
        self.send(P.error(exc.code, exc.message, exc.context_id, **extra))

    def _late(self, ctx_id: str, mtype: str) -> bool:
        """Handle a message for a tombstoned id; True when it was one (and is dealt with)."""
        why = self.ended.get(ctx_id)
        if why is None:
            return False
        if why in (Ended.CANCELLED, Ended.TOLD):
            self.late_dropped += 1
            return True
        self.ended[ctx_id] = Ended.TOLD
        self.synth.metrics.errors.labels(ErrorCode.BAD_REQUEST).inc()
        self.send(
            P.error(
                ErrorCode.BAD_REQUEST,
                f"{mtype!r} for context {ctx_id!r}, which has ended ({why.value}); "
                "send 'start' to reuse the id (later messages for it are ignored)",
                ctx_id,
                context_ended=True,
            )
        )
        return True

    def _open(self, msg: P.ClientMessage) -> _Context:
        ctx_id = msg.context_id or ""
        if ctx_id in self.contexts:
            raise ProtocolError(
                ErrorCode.BAD_REQUEST, f"context {ctx_id!r} is already live; cancel or end it first", ctx_id
            )
        self.ended.pop(ctx_id, None)  # an explicit start (or a first text) brings the id back
        if self.draining is not None:
            retry_ms, why = self.draining
            self._refuse_open(ErrorCode.DRAINING, why, ctx_id, retry_after_ms=retry_ms)
        if len(self.contexts) >= self.limits.max_contexts:
            raise ProtocolError(
                ErrorCode.TOO_MANY_CONTEXTS,
                f"{self.limits.max_contexts} contexts are live on this connection; end or cancel one",
                ctx_id,
            )
        voice = msg.voice
        if voice is not None and voice not in self.synth.engine.voices:
            raise ProtocolError(
                ErrorCode.UNKNOWN_VOICE,
                f"unknown voice {voice!r}; available: {sorted(self.synth.engine.voices)}",
                ctx_id,
            )
        rate = msg.sample_rate or self.synth.engine.sample_rate
        encoding = msg.encoding or P.PCM_S16LE
        sink = self.sink(ctx_id)
        try:
            speed = 1.0 if msg.speed is None else msg.speed
            sid = self.synth.open(sink, voice=voice, pace=True if msg.pace is None else msg.pace, speed=speed)
        except UnsupportedSpeed as exc:
            raise ProtocolError(ErrorCode.BAD_REQUEST, str(exc), ctx_id) from None
        except Overloaded as exc:
            self._refuse_open(
                ErrorCode.OVERLOADED, f"server overloaded: {exc.reason}; retry later", ctx_id, exc.retry_after_ms
            )
        ctx = _Context(
            ctx_id,
            sid,
            next(self._stream_numbers),
            StreamEncoder(in_rate=self.synth.engine.sample_rate, out_rate=rate, encoding=encoding),
        )
        self.contexts[ctx_id] = ctx
        self.by_sid[sid] = ctx
        self.send(P.started(ctx_id, ctx.stream, rate, encoding))
        return ctx

    def _refuse_open(self, code: str, message: str, ctx_id: str, retry_after_ms: int) -> None:
        exc = ProtocolError(code, message, ctx_id)
        exc.msg_type = MsgType.START
        self.refuse(exc, retry_after_ms=retry_after_ms)
        raise _Handled()

    def _on_start(self, msg: P.ClientMessage) -> None:
        try:
            ctx = self._open(msg)
        except _Handled:
            return
        if msg.text:
            self._append(ctx, msg.text)

    def _on_text(self, msg: P.ClientMessage) -> None:
        ctx_id = msg.context_id or ""
        ctx = self.contexts.get(ctx_id)
        if ctx is None:
            if self._late(ctx_id, msg.type):
                return
            try:
                ctx = self._open(P.ClientMessage(type=MsgType.START, context_id=ctx_id))
            except _Handled:
                return
        self._append(ctx, msg.text or "")

    def _append(self, ctx: _Context, text: str) -> None:
        if ctx.chars + len(text) > self.limits.max_context_chars:
            raise ProtocolError(
                ErrorCode.TEXT_TOO_LONG,
                f"context text would exceed {self.limits.max_context_chars} characters; "
                "end this context and continue in a new one",
                ctx.context_id,
            )
        try:
            self.synth.push_text(ctx.sid, text)
        except ValueError as exc:
            raise ProtocolError(ErrorCode.BAD_REQUEST, str(exc), ctx.context_id) from None
        except KeyError:
            raise _finished(ctx.context_id) from None
        ctx.chars += len(text)

    def _known(self, msg: P.ClientMessage) -> _Context | None:
        """The live context of ``msg``; ``None`` for a tombstoned id (already dealt with)."""
        ctx = self.contexts.get(msg.context_id or "")
        if ctx is None:
            if self._late(msg.context_id or "", msg.type):
                return None
            raise ProtocolError(
                ErrorCode.BAD_REQUEST, f"unknown context {msg.context_id!r}; send 'start' first", msg.context_id
            )
        return ctx

    def _on_flush(self, msg: P.ClientMessage) -> None:
        ctx = self._known(msg)
        if ctx is None:
            return
        try:
            self.synth.flush(ctx.sid)
        except KeyError:
            raise _finished(msg.context_id) from None

    def _on_end(self, msg: P.ClientMessage) -> None:
        ctx = self._known(msg)
        if ctx is None:
            return
        try:
            self.synth.end(ctx.sid)
        except KeyError:
            pass  # already finishing

    def _on_cancel(self, msg: P.ClientMessage) -> None:
        t0 = time.perf_counter()
        ctx_id = msg.context_id or ""
        ctx = self.contexts.get(ctx_id)
        dropped = 0
        if ctx is not None:
            dropped = self.synth.cancel(ctx.sid) + self.purge(ctx.sid)
        self._forget(ctx_id, Ended.CANCELLED)  # also for an id never seen: its late tokens stay silent
        self.send(P.cancelled(ctx_id, dropped))
        self.synth.metrics.cancel_ack.observe(time.perf_counter() - t0)

    def _on_ping(self, msg: P.ClientMessage) -> None:
        self.send(P.pong(msg.ping_id))

    # -- shutdown
    def notice_draining(self, retry_after_ms: int, deadline_ms: int) -> None:
        self.draining = (retry_after_ms, "the server is draining for shutdown; open new contexts on another server")
        self.send(P.draining(retry_after_ms, deadline_ms))

    def cut_off(self, message: str) -> int:
        """The drain deadline: every live context gets a ``shutting_down`` error; returns how many."""
        n = 0
        for ctx_id, ctx in list(self.contexts.items()):
            self.synth.cancel(ctx.sid)
            self.send(P.error(ErrorCode.SHUTTING_DOWN, message, ctx_id, context_ended=True))
            self.synth.metrics.errors.labels(ErrorCode.SHUTTING_DOWN).inc()
            self._forget(ctx_id, Ended.FAILED)
            n += 1
        return n

    def close(self) -> None:
        self._closed = True
        for ctx in list(self.contexts.values()):
            self.synth.cancel(ctx.sid)
        self.contexts.clear()
        self.by_sid.clear()


async def close_ws(ws: web.WebSocketResponse, transport: asyncio.Transport | None, code: int, reason: str) -> None:
    """Close with ``code``; a peer that does not complete the handshake is cut off, bounded."""
    try:
        async with asyncio.timeout(CLOSE_WAIT_S):
            await ws.close(code=code, message=reason.encode()[:120])
    except (TimeoutError, ConnectionError, RuntimeError):
        if transport is not None:
            transport.abort()


_EMPTY = np.zeros(0, dtype=np.float32)


def _finished(context_id: str | None) -> ProtocolError:
    # The stream finished (its done/error is on its way) while this message was in flight.
    return ProtocolError(ErrorCode.BAD_REQUEST, f"context {context_id!r} has finished; start a new context", context_id)


class _Handled(Exception):
    """The error was already sent; stop processing this message."""


@dataclass(slots=True)
class _ContextSink:
    conn: Connection
    ctx_id: str

    def deliver(self, out: Output) -> None:
        self.conn.deliver(self.ctx_id, out)

    def backed_up(self) -> bool:
        return self.conn._queued_frames > OUTBOX_HIGH_WATER
