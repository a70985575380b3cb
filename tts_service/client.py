"""Async client for protocol v1: persistent WebSockets, many contexts, acknowledged cancel, replicas.

Example::

    async with TTSClient("ws://127.0.0.1:8765/v1/stream") as client:
        ctx = await client.open(sample_rate=16000)
        await ctx.send_text("Hello there. ")
        await ctx.end()
        async for item in ctx:
            if isinstance(item, AudioFrame):
                play(item.pcm)

    # several replicas: a list, or one DNS name with an address per replica (headless Service)
    TTSClient(["ws://tts-1:8765/v1/stream", "ws://tts-2:8765/v1/stream"])
    TTSClient("ws://streamvox-replicas:8765/v1/stream", discover=True)

Why it looks like this: a voice agent talks in many short turns and is interrupted often.
Reconnecting per turn costs a handshake on the next turn's first byte, so the socket is kept
across contexts and cancels. Frames are routed by the server's per-context ``stream`` number;
any frame whose stream is not live (cancelled, finished, unknown) is dropped and counted, so a
late frame can never play after a barge-in. A cancel resolves when the server's ack arrives;
a missing ack means the connection cannot be trusted, so it is dropped and re-established.

This module is only the asyncio transport: the protocol state of a connection is
:mod:`tts_service.session` and the connection policy - where a connection goes, back-off,
a start refused with ``overloaded``/``draining`` opened again on another replica, the cancel-ack
deadline, leaving a draining replica between turns, the :class:`StreamvoxStats` - is
:mod:`tts_service.driver`, both shared with the Pipecat and LiveKit plug-ins. A connection that
dies fails its live contexts with :class:`TTSConnectionError`; their audio is never replayed.
Measured figures (TTFB, cancel latency) are in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from . import protocol as P
from .driver import RENAMED, ClientDriver, ConnectionSettings, StreamvoxStats, renamed_settings
from .replicas import Replica, ReplicaSet, Resolver
from .session import (
    DRAINING_CODE,
    Acked,
    ClientSession,
    Done,
    Draining,
    Failed,
    Pong,
    SessionContext,
    SessionError,
    Started,
    Unknown,
    Word,
    Words,
    check_ready,
)
from .session import Audio as _Audio

log = logging.getLogger(__name__)

__all__ = [
    "AudioFrame",
    "CancelResult",
    "ConnectionSettings",
    "Replica",
    "ReplicaSet",
    "Resolver",
    "StreamvoxStats",
    "TTSClient",
    "TTSConnectionError",
    "TTSContext",
    "TTSDraining",
    "TTSError",
    "TTSOverloaded",
    "Word",
    "WordTimings",
    "wait_for_ack",
]


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


class TTSDraining(TTSOverloaded):
    """The replica is shutting down and takes no new contexts; another one may."""


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


async def wait_for_ack(driver: ClientDriver, context_id: str, fut: asyncio.Future) -> Any:
    """What ``fut`` (resolved by the transport when the ``cancelled`` arrives) resolves to, or
    TimeoutError once ``driver`` says the cancel is overdue - the connection must then be replaced.
    Every transport waits for an ack this way, so the deadline is the driver's alone."""
    while True:
        try:
            return await asyncio.wait_for(asyncio.shield(fut), driver.ack_wait_s(context_id, time.monotonic()))
        except TimeoutError:
            if fut.done():
                return fut.result()
            if not driver.awaiting_ack(context_id) or driver.ack_overdue(context_id, time.monotonic()):
                raise


def _error(failed: Failed) -> TTSError:
    """The one translation of a server ``error`` into an exception."""
    cls = {P.ErrorCode.OVERLOADED: TTSOverloaded, DRAINING_CODE: TTSDraining}.get(failed.code, TTSError)
    context_id = failed.ctx.context_id if failed.ctx is not None else None
    return cls(failed.code, failed.message, context_id, context_ended=failed.ended, **failed.extra)


class _Connection:
    """One WebSocket of a client: its replica, its protocol session, its reader and waiters."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, replica: Replica, info: dict[str, Any]) -> None:
        self.ws = ws
        self.replica = replica
        self.session = ClientSession(info)
        self.reader: asyncio.Task | None = None
        self.acks: dict[str, list[asyncio.Future]] = {}
        self.pings: dict[Any, asyncio.Future] = {}
        self.retired = False  # takes no new contexts (draining, refused, replaced); closed once empty
        self.closing = False  # its close between turns is under way
        self.lost = asyncio.Event()
        self.lost_reason = ""

    @property
    def open(self) -> bool:
        return not self.ws.closed and not self.lost.is_set()

    @property
    def usable(self) -> bool:
        return self.open and not self.retired and not self.session.draining


class TTSContext:
    """One utterance (or one LLM turn) on the shared connection."""

    def __init__(
        self,
        client: TTSClient,
        context_id: str,
        stream: int = 0,
        sample_rate: int = 0,
        encoding: str = P.PCM_S16LE,
        *,
        session_context: SessionContext | None = None,
        connection: _Connection | None = None,
    ) -> None:
        """Made by :meth:`TTSClient.open`; the positional form builds a detached context (tests)."""
        self.client = client
        if session_context is None:
            session_context = SessionContext(context_id, stream=stream or None, sample_rate=sample_rate)
            session_context.encoding = encoding
        self._s = session_context
        self._s.owner = self
        self._conn = connection
        self._queue: asyncio.Queue = asyncio.Queue()
        self._started: asyncio.Future | None = None
        self._report_start_errors = False  # open(wait=False): start errors go to the iterator
        self._dropped_queued = 0  # frames already queued when the context was gated

    # -- state, read from the session
    @property
    def context_id(self) -> str:
        return self._s.context_id

    @property
    def stream(self) -> int:
        return self._s.stream or 0

    @property
    def sample_rate(self) -> int:
        return self._s.sample_rate

    @property
    def encoding(self) -> str:
        return self._s.encoding

    @property
    def frames(self) -> int:
        return self._s.frames

    @property
    def audio_ms(self) -> float:
        return self._s.audio_ms

    @property
    def done(self) -> bool:
        return self._s.done

    @property
    def cancelled(self) -> bool:
        return self._s.gated

    @property
    def dropped_after_cancel(self) -> int:
        return self._s.dropped + self._dropped_queued

    @property
    def replica_url(self) -> str:
        """The replica this context runs on."""
        return self._attached().replica.url

    def _attached(self) -> _Connection:
        if self._conn is None:
            raise TTSConnectionError("this context was not opened by TTSClient.open(); it has no connection")
        return self._conn

    # -- verbs
    async def send_text(self, text: str) -> None:
        conn = self._attached()
        await self.client._send(conn, conn.session.text(self._s, text))

    async def flush(self) -> None:
        conn = self._attached()
        await self.client._send(conn, conn.session.flush(self._s))

    async def end(self) -> None:
        conn = self._attached()
        await self.client._send(conn, conn.session.end(self._s))

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
    """Persistent connections to one streamvox server or a replica set, shared by many contexts.

    ``url``: one WebSocket URL, or a list of them (replicas). ``discover=True``: the URL's host
    name resolves to one address per replica (a headless Service); ``resolver`` replaces the
    system resolver (tests). ``connect_attempts`` bounds the tries of one connect (each try is
    one replica; with several replicas a failed one is skipped at once, with one the tries are
    spaced by a jittered exponential backoff from ``reconnect_backoff_s`` to
    ``reconnect_backoff_max_s``). ``cancel_ack_timeout_s``: how long a cancel waits for the
    server's ack before the connection is replaced. The setting names are those of every streamvox
    client (:class:`ConnectionSettings`); the names of earlier releases (``cancel_timeout``,
    ``connect_timeout``, ``open_timeout``, ``backoff_s``, ``max_backoff_s``) still work, with a
    DeprecationWarning.
    """

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        api_key: str | None = None,
        connect_timeout_s: float = 5.0,
        cancel_ack_timeout_s: float = 1.0,
        open_timeout_s: float = 5.0,
        connect_attempts: int = 5,
        reconnect_backoff_s: float = 0.2,
        reconnect_backoff_max_s: float = 5.0,
        discover: bool = False,
        resolver: Resolver | None = None,
        probe_timeout_s: float = 0.5,
        stats: StreamvoxStats | None = None,
        **renamed: float,
    ) -> None:
        given = {
            "connect_timeout_s": connect_timeout_s,
            "cancel_ack_timeout_s": cancel_ack_timeout_s,
            "open_timeout_s": open_timeout_s,
            "reconnect_backoff_s": reconnect_backoff_s,
            "reconnect_backoff_max_s": reconnect_backoff_max_s,
        }
        self.settings = ConnectionSettings(
            **renamed_settings("TTSClient", renamed, given),
            connect_attempts=max(1, connect_attempts),
            probe_timeout_s=probe_timeout_s,
        )
        self.driver = ClientDriver.for_urls(url, self.settings, discover=discover, resolver=resolver, stats=stats)
        self.replicas = self.driver.replicas
        self.stats = self.driver.stats
        self.url = url if isinstance(url, str) else self.replicas.label
        self.api_key = api_key
        self._http: aiohttp.ClientSession | None = None
        self._current: _Connection | None = None
        self._conns: set[_Connection] = set()
        self._ids = itertools.count(1)
        self._connect_lock = asyncio.Lock()
        self._closed = False
        self._background: set[asyncio.Task] = set()
        self._disconnected = asyncio.Event()
        self._lost_reason = ""

    # ------------------------------------------------------------ settings and counters
    @property
    def cancel_ack_timeout_s(self) -> float:
        return self.settings.cancel_ack_timeout_s

    def __getattr__(self, name: str) -> Any:
        """The settings' earlier attribute names (``client.cancel_timeout``...), for one release."""
        new = RENAMED.get(name)
        if new is None or name == "reconnect_backoff_min_s":
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        warnings.warn(f"TTSClient.{name} is deprecated; read .settings.{new}", DeprecationWarning, stacklevel=2)
        return getattr(self.settings, new)

    @property
    def connections(self) -> int:
        """Connections placed so far; 1 means the socket was never replaced."""
        return self.stats.connections

    @property
    def reconnects(self) -> int:
        return self.stats.reconnects

    @property
    def frames_dropped(self) -> int:
        """Stale frames discarded (cancelled or unknown streams)."""
        return self.stats.frames_dropped

    @property
    def retries_elsewhere(self) -> int:
        """Contexts refused (full/draining) and opened again on another replica."""
        return self.stats.contexts_moved

    # ------------------------------------------------------------ connection
    @property
    def connected(self) -> bool:
        """A connection that takes new contexts is open (a draining one does not count)."""
        return self._current is not None and self._current.usable

    @property
    def server_info(self) -> dict[str, Any]:
        return self._current.session.ready if self._current is not None else {}

    @property
    def replica_url(self) -> str | None:
        """The replica new contexts go to now."""
        return self._current.replica.url if self._current is not None else None

    async def __aenter__(self) -> TTSClient:
        try:
            await self.connect()
        except BaseException:
            await self.close()  # __aexit__ will not run: do not leak the HTTP session
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def connect(self) -> None:
        """Make sure a usable connection exists: place one on a replica if needed."""
        async with self._connect_lock:
            if self.connected:
                return
            if self._closed:
                raise TTSConnectionError("client is closed")
            if self._current is not None:
                self._retire(self._current)  # draining: it finishes its contexts, new ones go elsewhere
            conn = await self._place()
            self._current = conn
            self._disconnected.clear()

    async def _place(self) -> _Connection:
        """Try replicas in the driver's order until one connects; back off as it says between tries."""
        last = "no replica was tried"
        attempts = self.settings.connect_attempts
        for attempt in range(attempts):
            if self._closed:  # close() ran during a background reconnect
                raise TTSConnectionError("client is closed")
            try:
                chosen = await self.replicas.choose(self._session())
            except OSError as exc:
                chosen, last = [], str(exc)
            for replica in self.driver.candidates(chosen, last_attempt=attempt + 1 == attempts):
                try:
                    conn = await self._connect_to(replica)
                except TTSConnectionError:
                    raise
                except (aiohttp.ClientError, OSError, TimeoutError, SessionError) as exc:
                    if isinstance(exc, aiohttp.WSServerHandshakeError) and exc.status in (401, 403):
                        raise TTSConnectionError(f"server refused the API key (HTTP {exc.status})") from None
                    last = f"{exc or type(exc).__name__}"
                    self.driver.dial_failed(replica, last, time.monotonic())
                    continue
                self.driver.dialled(replica)
                return conn
            if attempt + 1 < attempts:
                await asyncio.sleep(self.driver.retry_delay(attempt, time.monotonic()))
        raise TTSConnectionError(f"cannot connect to {self.replicas.label}: {last}") from None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession()
        return self._http

    async def _connect_to(self, replica: Replica) -> _Connection:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        if replica.host_header:
            headers["Host"] = replica.host_header
        # Bounded as a whole: a pod's address can vanish without a reset (packets just dropped),
        # and TCP's own connect timeout is minutes - long enough to stall a turn.
        timeout_s = self.settings.connect_timeout_s
        async with asyncio.timeout(timeout_s):
            ws = await self._session().ws_connect(
                replica.url,
                headers=headers,
                timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=timeout_s),
                heartbeat=30.0,
                max_msg_size=0,
                server_hostname=replica.server_hostname,
            )
        try:
            msg = await asyncio.wait_for(ws.receive(), timeout_s)
            if msg.type not in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
                raise SessionError(f"expected a 'ready' message, got {msg.type!r}")
            info = check_ready(msg.data)
            if self._closed:
                raise TTSConnectionError("client is closed")
        except BaseException:
            await ws.close()
            raise
        conn = _Connection(ws, replica, info)
        self._conns.add(conn)
        conn.reader = asyncio.create_task(self._read(conn), name="streamvox-client-reader")
        return conn

    async def wait_disconnected(self) -> str:
        """Wait until the current connection is lost (or closed); return the reason."""
        await self._disconnected.wait()
        return self._lost_reason

    async def close(self) -> None:
        self._closed = True
        for conn in list(self._conns):
            await self._drop(conn, "client closed")
        self._disconnected.set()
        if self._http is not None:
            await self._http.close()
            self._http = None

    def _retire(self, conn: _Connection) -> None:
        """No new contexts on ``conn``; close it once its live contexts have finished."""
        conn.retired = True
        if self._current is conn:
            self._current = None
        self._close_if_idle(conn)

    def _close_if_idle(self, conn: _Connection) -> None:
        """Between turns: a retired connection whose last context has finished is closed."""
        if conn.retired and not conn.session.open_contexts and conn.open and not conn.closing:
            conn.closing = True
            if self.driver.leave_now(conn.session):
                self.driver.left()
            self._spawn(self._drop(conn, "replaced between turns"))

    async def _drop(self, conn: _Connection, reason: str) -> None:
        """Close ``conn`` and fail whatever still waits on it."""
        reader, conn.reader = conn.reader, None
        await conn.ws.close()
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        self._lost(conn, reason)

    def _lost(self, conn: _Connection, reason: str) -> None:
        """A lost connection is every waiter's problem: tell each of them (never replay)."""
        if conn.lost.is_set():
            return
        conn.lost_reason = reason
        conn.lost.set()
        self._conns.discard(conn)
        exc = TTSConnectionError(reason)
        for s in conn.session.lose():
            ctx = s.owner
            if ctx is None:
                continue
            if ctx._started is not None and not ctx._started.done():
                ctx._started.set_exception(exc)
                if ctx._report_start_errors:
                    ctx._started.exception()
            if not s.gated:
                ctx._queue.put_nowait(exc)
        for futs in conn.acks.values():
            for fut in futs:
                if not fut.done():
                    fut.set_exception(exc)
        for fut in conn.pings.values():
            if not fut.done():
                fut.set_exception(exc)
        conn.acks.clear()
        conn.pings.clear()
        if self._current is conn:
            self._current = None
            self._lost_reason = reason
            self._disconnected.set()

    async def _send(self, conn: _Connection, data: str | None) -> None:
        if data is None:
            return  # the session says nothing may be sent (gated, ended or finished context)
        if not conn.open:
            raise TTSConnectionError("not connected (the connection was lost; open a new context)")
        try:
            await conn.ws.send_str(data)
        except (ConnectionError, RuntimeError) as exc:
            await self._drop(conn, f"send failed: {exc}")
            raise TTSConnectionError(f"send failed: {exc}") from None

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

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
        speed: float | None = None,
    ) -> TTSContext:
        """Start a context; by default wait for the server's ``started`` (or its error).

        ``wait=False`` returns as soon as ``start`` is sent, saving a round trip before the next
        ``send_text``: a refusal (``overloaded``, ``unknown_voice``) then surfaces when the
        context is iterated. ``sample_rate`` and ``stream`` are known once ``started`` arrived,
        which is always before the first frame. ``speed``: the context's speaking rate (1.0: the
        voice's own; a rate the server's voices cannot render is refused with ``bad_request``).

        With several replicas and ``wait=True``, a refusal for lack of room (``overloaded``,
        ``draining``) is retried at once on another replica (nothing was spoken, so nothing is
        replayed); the refusing replica is backed off.
        """
        ctx_id = context_id or f"c{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        opts = {
            "voice": voice,
            "sample_rate": sample_rate,
            "encoding": encoding,
            "pace": pace,
            "text": text,
            "speed": speed,
        }
        tries = 1  # each replica gets one chance per open
        while (ctx := await self._open_once(ctx_id, opts, wait, tries)) is None:
            tries += 1
        return ctx

    async def _open_once(self, ctx_id: str, opts: dict[str, Any], wait: bool, tries: int) -> TTSContext | None:
        """One try of :meth:`open` on the current connection; ``None``: refused, try elsewhere."""
        if not self.connected:
            await self.connect()
        conn = self._current
        assert conn is not None
        try:
            s, start = conn.session.start(ctx_id, **opts)
        except SessionError as exc:
            raise TTSError(P.ErrorCode.BAD_REQUEST, str(exc)) from None
        ctx = TTSContext(self, ctx_id, session_context=s, connection=conn)
        ctx._started = asyncio.get_running_loop().create_future()
        ctx._report_start_errors = not wait
        sent = False
        try:
            await self._send(conn, start)
            sent = True
            self.stats.contexts += 1
            if wait:
                await asyncio.wait_for(ctx._started, self.settings.open_timeout_s)
        except TTSOverloaded as exc:
            # Refused for lack of room (nothing was spoken): the driver says whether to stop
            # using this connection and whether another replica gets the start.
            refusal = self.driver.refused(conn.replica, exc.code, exc.retry_after_ms, tries=tries, now=time.monotonic())
            if refusal.retire:
                self._retire(conn)
            if refusal.retry_elsewhere:
                self.driver.moved()
                return None
            raise
        except BaseException:
            if not s.finished:
                if sent and conn.open:
                    # Cancelled (or timed out) after the server got 'start': do not leave the
                    # context running there, holding one of the connection's context slots.
                    self._spawn(self._send_quietly(conn, conn.session.cancel(s)))
                conn.session.forget(s)
            self._close_if_idle(conn)
            raise
        return ctx

    async def _send_quietly(self, conn: _Connection, data: str | None) -> None:
        try:
            await self._send(conn, data)
        except TTSConnectionError:
            pass

    def _gate(self, ctx: TTSContext) -> None:
        """From now on nothing of this context is yielded; late frames are counted and dropped."""
        if not ClientSession.gate(ctx._s):
            return
        while not ctx._queue.empty():
            item = ctx._queue.get_nowait()
            if isinstance(item, AudioFrame):
                ctx._dropped_queued += 1
                self.stats.frames_dropped += 1
        ctx._queue.put_nowait(_END)

    async def _cancel(self, ctx: TTSContext, timeout: float | None) -> CancelResult:
        t0 = time.monotonic()
        conn, s = ctx._attached(), ctx._s
        already = s.finished
        self._gate(ctx)
        if already:
            # done before the cancel, or ended by an error / the connection meanwhile
            if s.outcome == "lost":
                return CancelResult(False, 0.0, 0, ctx.dropped_after_cancel, "disconnected")
            return CancelResult(True, 0.0, 0, ctx.dropped_after_cancel, "finished")
        if not conn.open:
            return CancelResult(False, 0.0, 0, ctx.dropped_after_cancel, "disconnected")
        fut = asyncio.get_running_loop().create_future()
        conn.acks.setdefault(s.context_id, []).append(fut)
        message = conn.session.cancel(s)  # None: another cancel of it is already on its way
        if message is not None:
            self.driver.cancel_sent(s.context_id, t0, timeout)
        try:
            await self._send(conn, message)
            ack = await self._ack(fut, s.context_id, t0, timeout, tracked=message is not None)
        except TimeoutError:
            limit = timeout if timeout is not None else self.settings.cancel_ack_timeout_s
            log.warning("no cancel ack for %s within %.1f s: reconnecting", s.context_id, limit)
            await self._drop(conn, "cancel was not acknowledged")
            if not self._closed:
                self._spawn(self._reconnect_quietly())
            return CancelResult(False, time.monotonic() - t0, 0, ctx.dropped_after_cancel, "timeout")
        except TTSConnectionError:
            return CancelResult(False, time.monotonic() - t0, 0, ctx.dropped_after_cancel, "disconnected")
        finally:
            if message is not None:
                self.driver.cancel_abandoned(s.context_id)  # no-op once acked or timed out
        return CancelResult(True, time.monotonic() - t0, ack.frames_dropped, ctx.dropped_after_cancel)

    async def _ack(self, fut: asyncio.Future, context_id: str, t0: float, timeout: float | None, *, tracked: bool):
        """The server's ack, or TimeoutError once the driver says the cancel is overdue. A second
        cancel of the same context (no message of its own) waits for the same ack, on its own clock."""
        if tracked:
            return await wait_for_ack(self.driver, context_id, fut)
        limit = timeout if timeout is not None else self.settings.cancel_ack_timeout_s
        return await asyncio.wait_for(fut, max(0.0, t0 + limit - time.monotonic()))

    async def _reconnect_quietly(self) -> None:
        try:
            await self.connect()
        except TTSConnectionError as exc:
            log.warning("reconnect failed: %s", exc)

    async def ping(self, timeout: float = 5.0) -> float:
        """Round-trip time of a ping, in seconds."""
        if not self.connected:
            await self.connect()
        conn = self._current
        assert conn is not None
        pid = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        conn.pings[pid] = fut
        t0 = time.monotonic()
        await self._send(conn, conn.session.ping(pid))
        await asyncio.wait_for(fut, timeout)
        return time.monotonic() - t0

    # ------------------------------------------------------------ receiving
    async def _read(self, conn: _Connection) -> None:
        ws = conn.ws
        reason = "server closed the connection"
        try:
            async for msg in ws:
                if msg.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT):
                    self._dispatch(conn, conn.session.receive(msg.data))
                elif msg.type == aiohttp.WSMsgType.ERROR:
                    reason = f"connection error: {ws.exception()}"
                    break
            if ws.close_code is not None and ws.close_code != 1000:
                reason = f"server closed the connection (code {ws.close_code})"
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a malformed server message: the connection is unusable
            log.exception("reader failed")
            reason = f"reader failed: {exc}"
        if conn.reader is asyncio.current_task():
            conn.reader = None
            await ws.close()
            live = sum(1 for s in conn.session.open_contexts if not s.gated)
            self.driver.lost(conn.replica, reason, retired=conn.retired, contexts=live, now=time.monotonic())
            self._lost(conn, reason)

    def _dispatch(self, conn: _Connection, ev: object) -> None:
        if isinstance(ev, _Audio):
            if ev.stale or ev.ctx is None:
                self.stats.frames_dropped += 1
                return
            ctx: TTSContext = ev.ctx.owner
            s = ev.ctx
            ctx._queue.put_nowait(
                AudioFrame(s.context_id, ev.seq, ev.payload, s.sample_rate, s.encoding, time.monotonic())
            )
        elif isinstance(ev, Started):
            fut = ev.ctx.owner._started
            if fut is not None and not fut.done():
                fut.set_result(None)
        elif isinstance(ev, Words):
            if not ev.ctx.gated:
                ev.ctx.owner._queue.put_nowait(WordTimings(ev.ctx.context_id, ev.words))
        elif isinstance(ev, Done):
            ev.ctx.owner._queue.put_nowait(_END)
            self._close_if_idle(conn)
        elif isinstance(ev, Acked):
            self.driver.acked(ev.context_id, time.monotonic(), ev.frames_dropped)
            for fut in conn.acks.pop(ev.context_id, []):
                if not fut.done():
                    fut.set_result(ev)
            self._close_if_idle(conn)
        elif isinstance(ev, Failed):
            self._on_error(conn, ev)
        elif isinstance(ev, Pong):
            fut = conn.pings.pop(ev.ping_id, None)
            if fut is not None and not fut.done():
                fut.set_result(None)
        elif isinstance(ev, Draining):
            log.info("%s is draining: new contexts go to another replica", conn.replica.url)
            self.driver.draining(conn.replica, time.monotonic())
            self._retire(conn)
        elif isinstance(ev, Unknown) and not ev.stray:
            log.warning("unknown server message type %r", ev.msg.get("type"))

    def _on_error(self, conn: _Connection, failed: Failed) -> None:
        exc = _error(failed)
        s = failed.ctx
        if s is None or s.owner is None:
            if failed.code == DRAINING_CODE:
                self._retire(conn)
            log.warning("server error: %s", exc)
            return
        ctx: TTSContext = s.owner
        if ctx._started is not None and not ctx._started.done() and failed.ended:
            ctx._started.set_exception(exc)
            if not ctx._report_start_errors:
                self._close_if_idle(conn)
                return
            ctx._started.exception()  # nobody awaits it: mark it retrieved
        if not s.gated:
            ctx._queue.put_nowait(exc)
        self._close_if_idle(conn)
