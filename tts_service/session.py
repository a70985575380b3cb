"""The client side of protocol v1 on one connection, written once and free of I/O.

``TTSClient``, the Pipecat plug-in and the bench's wire recorder each used to carry their own copy
of the same state machine: which contexts are open, which ``stream`` number belongs to which
context, which contexts are gated after a cancel, which acks are outstanding, what an ``error``
means for a context. Three copies drift (one forgot ``context_ended``, another the ``draining``
notice), so they all drive this one :class:`ClientSession` instead:

* **outgoing**: ``start``/``text``/``flush``/``end``/``cancel`` return the message to send (or
  ``None`` when nothing may be sent: text for a gated or finished context is dropped here, which
  is the normal barge-in race, not an error) and update the state first, so a reply racing the
  send is already understood;
* **incoming**: :meth:`ClientSession.receive` turns one WebSocket message (text or binary) into
  one event (:class:`Started`, :class:`Audio`, :class:`Words`, :class:`Done`, :class:`Acked`,
  :class:`Failed`, :class:`Pong`, :class:`Draining`, :class:`Unknown`), attributing binary
  frames by their header's ``stream`` number without parsing JSON;
* **lost connection**: :meth:`ClientSession.lose` finishes every open context at once, so the
  driver tells each waiter.

The driver owns the socket, the tasks and the clock; it sends what the session returns and reacts
to the events (futures, queues, frames, records). Each context carries an ``owner`` slot for the
driver's own object. A session is one connection: stream numbers and context ids mean nothing on
another one, so a new connection gets a new session.

Stale-frame gating: a frame whose stream is unknown, or belongs to a gated or finished context,
comes back as an ``Audio`` event with ``stale=True`` (and is counted); an agent drops it, the bench
records it - "after the ack" is exactly what the bench must be able to see. The stream numbers of
finished contexts are remembered (boundedly) so such late frames stay attributable.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Final

from . import protocol as P
from .protocol import MsgType

DRAINING_CODE: Final = P.ErrorCode.DRAINING
# Codes after which a context should be retried on another replica (nothing was spoken yet).
RETRY_ELSEWHERE: Final = frozenset({P.ErrorCode.OVERLOADED, P.ErrorCode.DRAINING})

_FINISHED_STREAMS_KEPT = 1024
_SERVER_TYPES: Final = frozenset(
    {MsgType.READY, MsgType.STARTED, MsgType.WORDS, MsgType.DONE, MsgType.CANCELLED, MsgType.ERROR, MsgType.PONG}
)  # late frames of this many finished contexts stay attributable


class SessionError(Exception):
    """The peer is not a protocol-v1 streamvox server, or the driver misused the session."""


@dataclass(frozen=True, slots=True)
class Word:
    word: str
    start: float
    end: float


@dataclass(eq=False)
class SessionContext:
    """One context on one connection, as the client knows it."""

    context_id: str
    owner: Any = None  # the driver's object for this context (a TTSContext, a Pipecat context, ...)
    stream: int | None = None  # the server's tag on binary frames, from ``started``
    sample_rate: int = 0
    encoding: str = P.PCM_S16LE
    ended: bool = False  # ``end`` sent: no more text
    gated: bool = False  # cancelled here: nothing of it is delivered any more
    cancel_sent: bool = False
    outcome: str | None = None  # "done" | "cancelled" | "error" | "lost" once finished
    frames: int = 0  # frames delivered
    dropped: int = 0  # frames that arrived after the gate (or the finish) and were not delivered
    audio_ms: float = 0.0  # from ``done``
    error: Failed | None = None  # the error that finished it

    @property
    def started(self) -> bool:
        return self.stream is not None

    @property
    def finished(self) -> bool:
        return self.outcome is not None

    @property
    def done(self) -> bool:
        return self.outcome == "done"


# ---------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class Started:
    ctx: SessionContext


@dataclass(frozen=True, slots=True)
class Audio:
    ctx: SessionContext | None  # None: a stream this session never knew
    stream: int
    seq: int
    payload: bytes
    stale: bool  # gated, finished or unknown: an agent must not play it


@dataclass(frozen=True, slots=True)
class Words:
    ctx: SessionContext
    words: list[Word]


@dataclass(frozen=True, slots=True)
class Done:
    ctx: SessionContext
    frames: int
    audio_ms: float


@dataclass(frozen=True, slots=True)
class Acked:
    """The server's ``cancelled``: nothing of the context follows it on the wire."""

    ctx: SessionContext | None
    context_id: str
    frames_dropped: int  # computed frames the server never sent
    msg: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Failed:
    """An ``error`` from the server; ``ended`` says whether it finished its context."""

    ctx: SessionContext | None
    code: str
    message: str
    ended: bool
    extra: dict[str, Any]

    @property
    def retry_after_ms(self) -> int | None:
        value = self.extra.get("retry_after_ms")
        return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    @property
    def retry_elsewhere(self) -> bool:
        """Refused before anything was spoken (full or draining): another replica may take it."""
        return self.code in RETRY_ELSEWHERE


@dataclass(frozen=True, slots=True)
class Pong:
    ping_id: Any


@dataclass(frozen=True, slots=True)
class Draining:
    """The server is shutting down: live contexts finish, new ones belong on another replica."""

    retry_after_ms: int | None
    msg: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Unknown:
    """A message this client does not understand (reported, never fatal), or - ``stray`` - a
    known one for a context this session no longer has (e.g. ``started`` after an abandoned open)."""

    msg: dict[str, Any]
    stray: bool = False


Event = Started | Audio | Words | Done | Acked | Failed | Pong | Draining | Unknown


# ---------------------------------------------------------------- the session


def check_ready(raw: str | bytes) -> dict[str, Any]:
    """Validate the server's first message (``ready``); return it."""
    if not isinstance(raw, str):
        raise SessionError("expected a 'ready' text message first, got binary data")
    try:
        info = P.parse_server_message(raw)
    except ValueError as exc:
        raise SessionError(f"expected a 'ready' message: {exc}") from None
    if info.get("type") != MsgType.READY or info.get("protocol") != P.PROTOCOL_VERSION:
        raise SessionError(f"server speaks an unexpected protocol: {str(info)[:200]}")
    return info


class ClientSession:
    """Protocol state of one client connection. Pure: no sockets, tasks or clocks."""

    def __init__(self, ready: dict[str, Any] | None = None) -> None:
        self.ready = ready or {}
        self.messages = 0  # server messages received so far: a wire-order index
        self.frames_dropped = 0  # stale frames (gated, finished or unknown streams)
        self.draining = False  # the server announced its drain on this connection
        self.drain_notice: Draining | None = None
        self._contexts: dict[str, SessionContext] = {}  # open (not finished) contexts
        self._by_stream: dict[int, SessionContext] = {}  # started, not finished
        self._finished: OrderedDict[int, SessionContext] = OrderedDict()  # for late frames, bounded
        self._finished_ids: OrderedDict[str, None] = OrderedDict()  # for late text, bounded

    @property
    def max_contexts(self) -> int:
        return int(self.ready.get("max_contexts", P.Limits().max_contexts))

    @property
    def open_contexts(self) -> list[SessionContext]:
        return list(self._contexts.values())

    def get(self, context_id: str) -> SessionContext | None:
        return self._contexts.get(context_id)

    def was_finished(self, context_id: str) -> bool:
        """Whether a context of this id finished here lately: a driver that keys contexts by id
        (Pipecat) must not start it again for a late token of the turn that was cancelled."""
        return context_id in self._finished_ids

    # ------------------------------------------------------------ outgoing
    def start(
        self,
        context_id: str,
        *,
        owner: Any = None,
        voice: str | None = None,
        sample_rate: int | None = None,
        encoding: str | None = None,
        pace: bool | None = None,
        text: str | None = None,
        speed: float | None = None,
    ) -> tuple[SessionContext, str]:
        """Register a context and return it with its ``start`` message."""
        if context_id in self._contexts:
            raise SessionError(f"context {context_id!r} is already open on this connection")
        ctx = SessionContext(context_id, owner=owner)
        self._contexts[context_id] = ctx
        start = P.start(
            context_id, voice=voice, sample_rate=sample_rate, encoding=encoding, pace=pace, text=text, speed=speed
        )
        return ctx, start

    def text(self, ctx: SessionContext, text: str) -> str | None:
        """The ``text`` message, or ``None`` when the context takes no more text (ended, gated, finished)."""
        if ctx.ended or ctx.gated or ctx.finished:
            return None
        return P.text(ctx.context_id, text)

    def flush(self, ctx: SessionContext) -> str | None:
        if ctx.ended or ctx.gated or ctx.finished:
            return None
        return P.flush(ctx.context_id)

    def end(self, ctx: SessionContext) -> str | None:
        """The ``end`` message (once), or ``None`` when it would mean nothing."""
        if ctx.ended or ctx.gated or ctx.finished:
            return None
        ctx.ended = True
        return P.end(ctx.context_id)

    @staticmethod
    def gate(ctx: SessionContext) -> bool:
        """Stop delivering the context's frames; True if it was not gated before."""
        if ctx.gated:
            return False
        ctx.gated = True
        return True

    def cancel(self, ctx: SessionContext) -> str | None:
        """Gate the context; return the ``cancel`` to send, or ``None`` when the server holds
        nothing of it any more (finished) or a cancel is already on its way."""
        self.gate(ctx)
        if ctx.finished or ctx.cancel_sent:
            return None
        ctx.cancel_sent = True
        return P.cancel(ctx.context_id)

    def forget(self, ctx: SessionContext, outcome: str = "cancelled") -> None:
        """Finish a context on the driver's word (e.g. its ``start`` was never sent)."""
        self._finish(ctx, outcome)

    @staticmethod
    def ping(ping_id: Any) -> str:
        return P.ping(ping_id)

    # ------------------------------------------------------------ incoming
    def receive(self, data: str | bytes) -> Event:
        """One server message -> one event. Raises ``ValueError`` for a malformed message."""
        if isinstance(data, bytes | bytearray | memoryview):
            return self.receive_audio(bytes(data))
        return self.receive_message(P.parse_server_message(data))

    def receive_audio(self, data: bytes) -> Audio:
        """One binary message: a frame, attributed by its header's stream number."""
        self.messages += 1
        stream, seq, payload = P.unpack_frame(data)
        ctx = self._by_stream.get(stream) or self._finished.get(stream)
        stale = ctx is None or ctx.gated or ctx.finished
        if stale:
            self.frames_dropped += 1
            if ctx is not None:
                ctx.dropped += 1
        else:
            ctx.frames += 1  # type: ignore[union-attr]
        return Audio(ctx, stream, seq, payload, stale)

    def receive_message(self, msg: dict[str, Any]) -> Event:
        """One JSON message, already decoded (``protocol.parse_server_message``)."""
        self.messages += 1
        mtype = msg["type"]
        ctx_id = msg.get("context_id")
        ctx = self._contexts.get(ctx_id) if isinstance(ctx_id, str) else None
        if mtype == MsgType.STARTED and ctx is not None:
            ctx.stream = int(msg["stream"])
            ctx.sample_rate = int(msg["sample_rate"])
            ctx.encoding = str(msg.get("encoding", P.PCM_S16LE))
            self._by_stream[ctx.stream] = ctx
            return Started(ctx)
        if mtype == MsgType.WORDS and ctx is not None:
            words = [Word(str(w["word"]), float(w["start"]), float(w["end"])) for w in msg.get("words", [])]
            return Words(ctx, words)
        if mtype == MsgType.DONE and ctx is not None:
            ctx.audio_ms = float(msg.get("audio_ms", 0.0))
            self._finish(ctx, "done")
            return Done(ctx, int(msg.get("frames", ctx.frames)), ctx.audio_ms)
        if mtype == MsgType.CANCELLED:
            if ctx is not None:
                self._finish(ctx, "cancelled")
            return Acked(ctx, str(ctx_id or ""), int(msg.get("frames_dropped", 0)), msg)
        if mtype == MsgType.ERROR:
            return self._error(msg, ctx)
        if mtype == MsgType.PONG:
            return Pong(msg.get("id"))
        if mtype == MsgType.DRAINING:
            notice = Draining(_int_or_none(msg.get("retry_after_ms")), msg)
            self.draining, self.drain_notice = True, notice
            return notice
        return Unknown(msg, stray=mtype in _SERVER_TYPES)

    def _error(self, msg: dict[str, Any], ctx: SessionContext | None) -> Failed:
        extra = {k: v for k, v in msg.items() if k not in ("type", "code", "message", "context_id", "context_ended")}
        code = str(msg.get("code", "unknown"))
        # An error for a context ends it unless the server says otherwise (protocol.md).
        ended = bool(msg.get("context_ended", True)) if ctx is not None else bool(msg.get("context_ended", False))
        failed = Failed(ctx, code, str(msg.get("message", "")), ended, extra)
        if code == DRAINING_CODE:
            self.draining = True
        if ctx is not None and ended:
            ctx.error = failed
            self._finish(ctx, "error")
        return failed

    # ------------------------------------------------------------ the connection
    def lose(self) -> list[SessionContext]:
        """The connection is gone: every open context is finished ("lost"); returned for the driver."""
        lost = list(self._contexts.values())
        for ctx in lost:
            self._finish(ctx, "lost")
        return lost

    def _finish(self, ctx: SessionContext, outcome: str) -> None:
        if ctx.outcome is None:
            ctx.outcome = outcome
        if self._contexts.get(ctx.context_id) is ctx:
            del self._contexts[ctx.context_id]
            self._finished_ids[ctx.context_id] = None
            if len(self._finished_ids) > _FINISHED_STREAMS_KEPT:
                self._finished_ids.popitem(last=False)
        if ctx.stream is not None and self._by_stream.get(ctx.stream) is ctx:
            del self._by_stream[ctx.stream]
            self._finished[ctx.stream] = ctx
            if len(self._finished) > _FINISHED_STREAMS_KEPT:
                self._finished.popitem(last=False)


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)
