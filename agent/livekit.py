"""LiveKit Agents plug-in (livekit-agents 1.8.9): streamvox as a streaming TTS.

Example::

    from livekit.agents import AgentSession
    from agent.livekit import StreamvoxTTS

    session = AgentSession(vad=..., stt=..., llm=..., tts=StreamvoxTTS(url="ws://127.0.0.1:8765/v1/stream"))

How it maps onto the framework (read from the 1.8.9 source):

* **One stream = one segment = one streamvox context.** The session opens a ``SynthesizeStream``
  per spoken segment, pushes LLM tokens with ``push_text`` and ends with ``end_input()``
  (= ``flush()`` + close). Text pushed after the first ``flush()`` is dropped by the framework,
  so that flush sends protocol ``flush`` *and* ``end``: the server then finishes the context and
  the segment completes (metrics included) even if ``end_input()`` never comes.
* **No client-side sentence holding.** Every token goes to the server as it arrives (the first
  one inside ``start``); the server segments. ``_mark_started()`` is called as the first text
  leaves, so LiveKit's TTFB is first text sent -> first audio.
* **Cancellation that does not cost the next turn.** On barge-in the session closes the stream;
  ``aclose()`` cancels ``_run`` and waits for it, so ``_run`` only *gates* the context (no frame
  of it is emitted any more; late frames are counted and dropped by the client), hands the
  cancel to a background task owned by the TTS, and returns. That task waits for the server's
  ack and only then gives the connection lease back. A missing ack makes the client drop that
  socket (and reconnect); the next stream gets the fresh one.
* **Pooled persistent connections.** ``utils.ConnectionPool.connection()`` is not used: it
  discards the socket on any exception, the cancellation of every interrupted turn included.
  A ``TTSClient`` multiplexes contexts, so streams take *leases* on pooled clients; a stream
  may start on the client whose previous context still waits for its cancel ack. A new socket
  is opened only when every pooled client holds ``max_streams_per_connection`` leases.
  ``acquire_time`` and ``connection_reused`` are reported in ``TTSMetrics``.
* **Replicas.** ``url`` may be a list of replicas, or one DNS name with ``discover=True``: every
  pooled ``TTSClient`` places its connection on the less loaded of two replicas, skips one that
  refuses, drains or does not answer, and replaces a draining connection between turns.
* **A thin plug-in.** Placement, refusals, the cancel-ack deadline, reconnects and drains are
  ``TTSClient``'s, that is ``tts_service.driver``'s - the same policy and setting names as the
  Pipecat service - and the counters are the same ``StreamvoxStats`` type.
* Errors are translated once, at this boundary, into ``APIError`` subclasses (``from None``,
  no key or query string in messages).

Measured figures (TTFB, cancel-ack latency): docs/BENCHMARKS.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from livekit.agents import (
    DEFAULT_API_CONNECT_OPTIONS,
    NOT_GIVEN,
    APIConnectionError,
    APIConnectOptions,
    APIError,
    APIStatusError,
    APITimeoutError,
    NotGivenOr,
    tts,
    utils,
)
from livekit.agents.types import TimedString

from tts_service import protocol as P
from tts_service.client import (
    AudioFrame,
    CancelResult,
    TTSClient,
    TTSConnectionError,
    TTSContext,
    TTSError,
    TTSOverloaded,
    WordTimings,
)
from tts_service.client import Resolver as _Resolver
from tts_service.driver import StreamvoxStats, renamed_settings

log = logging.getLogger(__name__)

DEFAULT_URL = f"ws://127.0.0.1:{P.DEFAULT_PORT}{P.WS_PATH}"
DEFAULT_SAMPLE_RATE = 24000  # a LiveKit-friendly rate; the server resamples from the voice's own

# How LiveKit should treat each server error code: (HTTP-like status, retryable).
_STATUS = {
    P.ErrorCode.BAD_REQUEST: 400,
    P.ErrorCode.UNAUTHORIZED: 401,
    P.ErrorCode.UNKNOWN_VOICE: 404,
    P.ErrorCode.TEXT_TOO_LONG: 413,
    P.ErrorCode.TOO_MANY_CONTEXTS: 429,
    P.ErrorCode.OVERLOADED: 503,
    P.ErrorCode.DRAINING: 503,
    P.ErrorCode.SHUTTING_DOWN: 503,
    P.ErrorCode.INTERNAL: 500,
}


@dataclass
class _TTSOptions:
    url: str | tuple[str, ...]  # one server, or the replicas (each connection placed by load)
    api_key: str | None
    voice: str | None
    sample_rate: int
    pace: bool
    persistent: bool
    cancel_ack_timeout_s: float
    max_streams_per_connection: int
    discover: bool = False  # url's host name has one address per replica (a headless Service)
    resolver: _Resolver | None = None

    def client(self, *, connect_attempts: int = 1) -> TTSClient:
        # One attempt per connect by default: LiveKit's retry policy (conn_options) owns retries;
        # within one attempt a refusing or unreachable replica is still skipped for the next.
        return TTSClient(
            self.url if isinstance(self.url, str) else list(self.url),
            api_key=self.api_key,
            cancel_ack_timeout_s=self.cancel_ack_timeout_s,
            connect_attempts=connect_attempts,
            discover=self.discover,
            resolver=self.resolver,
        )


@dataclass(frozen=True, slots=True)
class CancelReport:
    """One cancelled context, as reported by the ``stream_cancelled`` event."""

    context_id: str
    acked: bool
    latency_s: float  # gate (inside aclose) -> server ack
    frames_dropped_client: int  # arrived after the gate, discarded
    frames_dropped_server: int  # computed, never sent


def _clean(message: str, api_key: str | None) -> str:
    """An error message fit for logs: no API key, no URL query string."""
    if api_key:
        message = message.replace(api_key, "***")
    return re.sub(r"(wss?://[^\s?]+)\?\S*", r"\1", message)


def _pieces(text: str, limit: int = P.Limits().max_text_chars) -> list[str]:
    """``text`` in messages the server accepts (it refuses longer ones rather than truncating)."""
    return [text[i : i + limit] for i in range(0, len(text), limit)] or [""]


def _translate(exc: BaseException, api_key: str | None) -> APIError:
    """The single mapping from client failures to LiveKit's error types."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, TimeoutError):
        return APITimeoutError("streamvox: timed out waiting for the TTS server")
    if isinstance(exc, TTSConnectionError):
        return APIConnectionError(f"streamvox: {_clean(exc.message, api_key)}")
    if isinstance(exc, TTSOverloaded):  # overloaded or draining: nothing was spoken, retry (elsewhere)
        state = "draining" if exc.code == P.ErrorCode.DRAINING else "overloaded"
        return APIStatusError(
            f"streamvox server {state}, retry in {exc.retry_after_ms} ms: {_clean(exc.message, api_key)}",
            status_code=503,
            retryable=True,
        )
    if isinstance(exc, TTSError):
        return APIStatusError(f"streamvox: {_clean(str(exc), api_key)}", status_code=_STATUS.get(exc.code, 500))
    return APIConnectionError(f"streamvox: unexpected {type(exc).__name__}: {_clean(str(exc), api_key)}")


# ---------------------------------------------------------------- connections


async def _connected(client: TTSClient) -> TTSClient:
    """``client`` once connected; closed (its HTTP session too) if it cannot connect."""
    try:
        await client.connect()
    except BaseException:
        await client.close()
        raise
    return client


@dataclass(eq=False)
class _Lease:
    client: TTSClient
    reused: bool
    pool: _ClientPool | None  # None: a private connection, closed when the lease ends

    async def release(self) -> None:
        if self.pool is not None:
            self.pool.put(self.client)
        else:
            await self.client.close()


class _ClientPool:
    """``TTSClient`` objects for one server; streams hold leases, clients stay connected."""

    def __init__(self, opts: _TTSOptions) -> None:
        self._opts = opts
        self._leases: dict[TTSClient, int] = {}  # insertion order = preference order
        self._lock = asyncio.Lock()

    def _new_client(self) -> TTSClient:
        return self._opts.client()

    def _limit(self, client: TTSClient) -> int:
        # Never more leases than the server allows live contexts on one connection.
        return min(self._opts.max_streams_per_connection, int(client.server_info.get("max_contexts", 1 << 30)))

    async def get(self) -> tuple[TTSClient, bool]:
        """A client with a free lease; ``(client, reused)`` where reused means no handshake."""
        # The lock makes two streams that start together share one new socket, not open two.
        async with self._lock:
            for client, n in self._leases.items():
                if client.connected and n < self._limit(client):
                    self._leases[client] = n + 1
                    return client, True
            for client, n in self._leases.items():
                if not client.connected and n < self._limit(client):
                    # Its socket was dropped (a missing ack, a lost connection): reconnect this
                    # client - or wait for the reconnection it already started - rather than add one.
                    await client.connect()
                    self._leases[client] = n + 1
                    return client, False
            client = await _connected(self._new_client())
            self._leases[client] = 1
            return client, False

    def put(self, client: TTSClient) -> None:
        if client in self._leases:
            self._leases[client] = max(0, self._leases[client] - 1)

    @property
    def connections_opened(self) -> int:
        return sum(c.connections for c in self._leases)

    async def aclose(self) -> None:
        clients, self._leases = list(self._leases), {}
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)


# ---------------------------------------------------------------- the TTS


class StreamvoxTTS(tts.TTS[Literal["stream_cancelled"]]):
    """Streaming TTS on a streamvox server, with aligned transcripts and acknowledged cancel.

    Args:
        url: the server's WebSocket endpoint, or a list of replicas' endpoints (each new connection
            goes to the less loaded of two, ``/readyz``; a refusing or draining one is skipped).
        api_key: sent as ``Authorization: Bearer``; never put in messages.
        voice: a voice name the server knows (default: the server's default voice).
        sample_rate: output rate; the server resamples.
        pace: let the server pace audio a bounded lead ahead of real time (cheap cancels, fair
            sharing); ``synthesize()`` always renders unpaced.
        persistent_connection: pool connections across streams (the point of this plug-in).
            ``False`` opens a connection per stream and closes it after, as LiveKit's
            reference plug-ins effectively do on interruption; kept for comparison.
        cancel_ack_timeout_s: how long a cancel waits for the server's ack before the socket is
            dropped (the name every streamvox client uses; ``cancel_timeout``, the earlier one,
            still works with a DeprecationWarning).
        max_streams_per_connection: leases per pooled client before another socket is opened
            (keep it at or below the server's ``--max-contexts``).
        discover: ``url``'s host name resolves to one address per replica (a headless Service).
        resolver: ``async (host, port) -> [address, ...]`` in place of the system resolver.
    """

    def __init__(
        self,
        *,
        url: str | Sequence[str] = DEFAULT_URL,
        api_key: str | None = None,
        voice: str | None = None,
        sample_rate: int = DEFAULT_SAMPLE_RATE,
        pace: bool = True,
        persistent_connection: bool = True,
        cancel_ack_timeout_s: float = 1.0,
        max_streams_per_connection: int = 8,
        discover: bool = False,
        resolver: _Resolver | None = None,
        **renamed: float,
    ) -> None:
        cancel_ack_timeout_s = renamed_settings(
            "StreamvoxTTS", renamed, {"cancel_ack_timeout_s": cancel_ack_timeout_s}
        )["cancel_ack_timeout_s"]
        if sample_rate not in P.SAMPLE_RATES:
            raise ValueError(f"sample_rate {sample_rate} is not supported; use one of {list(P.SAMPLE_RATES)}")
        super().__init__(
            capabilities=tts.TTSCapabilities(streaming=True, aligned_transcript=True),
            sample_rate=sample_rate,
            num_channels=1,
        )
        self._opts = _TTSOptions(
            url=url if isinstance(url, str) else tuple(url),
            api_key=api_key,
            voice=voice,
            sample_rate=sample_rate,
            pace=pace,
            persistent=persistent_connection,
            cancel_ack_timeout_s=cancel_ack_timeout_s,
            max_streams_per_connection=max_streams_per_connection,
            discover=discover,
            resolver=resolver,
        )
        self._pools: dict[tuple[str, str | None], _ClientPool] = {}
        self._background: set[asyncio.Task] = set()
        self.stats = StreamvoxStats()

    @property
    def model(self) -> str:
        return self._opts.voice or "default"

    @property
    def provider(self) -> str:
        return "streamvox"

    @property
    def connections_opened(self) -> int:
        """WebSocket connections this TTS has opened so far (pooled ones)."""
        return sum(p.connections_opened for p in self._pools.values())

    def update_options(self, *, voice: NotGivenOr[str | None] = NOT_GIVEN, pace: NotGivenOr[bool] = NOT_GIVEN) -> None:
        """Change options for streams created from now on."""
        if utils.is_given(voice):
            self._opts.voice = voice
        if utils.is_given(pace):
            self._opts.pace = pace

    def stream(self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> SynthesizeStream:
        return SynthesizeStream(tts=self, conn_options=conn_options)

    def synthesize(self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> ChunkedStream:
        return ChunkedStream(tts=self, input_text=text, conn_options=conn_options)

    def prewarm(self) -> None:
        """Open the pooled connection now, so the first turn does not pay the handshake."""
        if not self._opts.persistent:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # called outside the event loop: the first stream connects instead
        opts = self._opts

        async def _prewarm() -> None:
            try:
                client, _ = await self._pool(opts).get()
                self._pool(opts).put(client)
            except (TTSError, TimeoutError, OSError) as exc:
                log.warning("streamvox prewarm failed: %s", _clean(str(exc), opts.api_key))

        self._spawn(_prewarm())

    async def aclose(self) -> None:
        # Pending cancels finish first (each is bounded by cancel_ack_timeout_s), then sockets close.
        if self._background:
            await asyncio.wait(set(self._background), timeout=self._opts.cancel_ack_timeout_s + 1.0)
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        pools, self._pools = list(self._pools.values()), {}
        await asyncio.gather(*(p.aclose() for p in pools), return_exceptions=True)

    # -- internals shared by both stream kinds
    def _pool(self, opts: _TTSOptions) -> _ClientPool:
        key = (opts.url, opts.api_key)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _ClientPool(opts)
        return pool

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def _acquire(self, opts: _TTSOptions, timeout: float) -> _Lease:
        async with asyncio.timeout(timeout):
            if opts.persistent:
                pool = self._pool(opts)
                client, reused = await pool.get()
                return _Lease(client, reused, pool)
            return _Lease(await _connected(opts.client()), False, None)

    async def _settle(
        self,
        lease: _Lease,
        open_task: asyncio.Task[TTSContext],
        cancel_task: asyncio.Future[CancelResult] | None,
        gated_at: float,
    ) -> None:
        """Background end of a stream closed before its context finished: ack, then release."""
        try:
            if lease.pool is None:
                # A private connection: closing it ends the context on the server, no cancel needed.
                await lease.release()
                await asyncio.gather(open_task, return_exceptions=True)  # fails now: retrieve it
                return
            if cancel_task is None:
                try:
                    ctx = await open_task  # a start still in flight: wait for it, then cancel it
                except (TTSError, TimeoutError):
                    return  # refused, or the connection failed: nothing to cancel
                if ctx.done:
                    return
                cancel_task = asyncio.ensure_future(ctx.cancel())
            result = await cancel_task
            self._record_cancel(open_task.result().context_id, result, time.perf_counter() - gated_at)
        except Exception:
            log.exception("streamvox: settling a cancelled stream failed")
        finally:
            if lease.pool is not None:
                await lease.release()

    def _record_cancel(self, context_id: str, result: CancelResult, latency_s: float) -> None:
        self.stats.cancels += 1
        self.stats.frames_dropped += result.frames_dropped_client
        self.stats.cancel_settled(
            acked=result.acked, latency_s=latency_s, frames_dropped_server=result.frames_dropped_server
        )
        if not result.acked:
            log.warning("streamvox: cancel of %s not acknowledged; the connection was dropped", context_id)
        self.emit(
            "stream_cancelled",
            CancelReport(
                context_id=context_id,
                acked=result.acked,
                latency_s=latency_s,
                frames_dropped_client=result.frames_dropped_client,
                frames_dropped_server=result.frames_dropped_server,
            ),
        )


# ---------------------------------------------------------------- one context


class _Turn:
    """One streamvox context driven by one LiveKit stream: text out, audio and words in."""

    def __init__(self, owner: StreamvoxTTS, opts: _TTSOptions, lease: _Lease, emitter: tts.AudioEmitter) -> None:
        self.owner = owner
        self.opts = opts
        self.lease = lease
        self.emitter = emitter
        self.open_task: asyncio.Task[TTSContext] | None = None
        self.live_on_server = True  # until an error says the server has forgotten the context
        self.opened: asyncio.Future[TTSContext | None] = asyncio.get_running_loop().create_future()

    def open(self, first_text: str, *, pace: bool) -> None:
        """Send ``start`` with the first text. It runs as its own task so that a cancellation
        of the stream cannot strand a context the server has already started."""
        self.open_task = asyncio.ensure_future(
            self.lease.client.open(
                voice=self.opts.voice,
                sample_rate=self.opts.sample_rate,
                encoding=P.PCM_S16LE,
                pace=pace,
                text=first_text,
            )
        )

    async def ctx(self) -> TTSContext:
        assert self.open_task is not None
        ctx = await asyncio.shield(self.open_task)
        if not self.opened.done():
            self.opened.set_result(ctx)
        return ctx

    def no_text(self) -> None:
        if not self.opened.done():
            self.opened.set_result(None)

    async def receive(self, *, segmented: bool) -> None:
        ctx = await self.opened
        if ctx is None:
            return
        if segmented:
            self.emitter.start_segment(segment_id=ctx.context_id)
        async for item in ctx:
            if isinstance(item, AudioFrame):
                self.emitter.push(item.pcm)
            elif isinstance(item, WordTimings):
                # Trailing space: LiveKit joins timed strings verbatim into the transcript.
                self.emitter.push_timed_transcript(
                    [TimedString(f"{w.word} ", start_time=w.start, end_time=w.end) for w in item.words]
                )
        if segmented:
            self.emitter.end_segment()

    def ended_by(self, exc: BaseException) -> None:
        """The stream failed with ``exc``: note whether its context can still be live on the server."""
        if isinstance(exc, TTSConnectionError):
            self.live_on_server = False  # the server drops a lost connection's contexts
        elif isinstance(exc, TTSError):
            self.live_on_server = exc.extra.get("context_ended") is False

    def finish(self) -> None:
        """Called in ``_run``'s ``finally``: release now, or gate now and cancel in the background."""
        task = self.open_task
        started = task is not None and not (task.done() and (task.cancelled() or task.exception() is not None))
        if not started or not self.live_on_server or (task.done() and task.result().done):
            self.owner._spawn(self.lease.release())  # nothing of this stream is left on the server
            return
        gated_at = time.perf_counter()
        cancel_task = None
        if task.done() and self.lease.pool is not None:
            # Gates synchronously, inside aclose(): from here no frame of the context is yielded
            # (late ones are counted and dropped by the client); the ack is awaited in _settle.
            cancel_task = task.result().cancel_nowait()
        self.owner._spawn(self.owner._settle(self.lease, task, cancel_task, gated_at))


async def _begin_turn(
    stream: SynthesizeStream | ChunkedStream, output_emitter: tts.AudioEmitter, *, stream_mode: bool
) -> _Turn:
    """What both stream kinds do first: set up the emitter, lease the shared connection (timed,
    for LiveKit's acquire_time/connection_reused metrics), and make the turn."""
    output_emitter.initialize(
        request_id=utils.shortuuid(),
        sample_rate=stream._opts.sample_rate,
        num_channels=1,
        mime_type="audio/pcm",
        stream=stream_mode,
    )
    t0 = time.perf_counter()
    try:
        lease = await stream._owner._acquire(stream._opts, stream._conn_options.timeout)
    except (TTSError, TimeoutError, OSError) as exc:
        raise _translate(exc, stream._opts.api_key) from None
    stream._acquire_time = time.perf_counter() - t0
    stream._connection_reused = lease.reused
    stream._owner.stats.streams += 1
    return _Turn(stream._owner, stream._opts, lease, output_emitter)


class SynthesizeStream(tts.SynthesizeStream):
    def __init__(self, *, tts: StreamvoxTTS, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._owner = tts
        self._opts = dataclasses.replace(tts._opts)  # options are fixed for the life of a stream

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        turn = await _begin_turn(self, output_emitter, stream_mode=True)
        send = asyncio.create_task(self._send(turn), name="streamvox-send")
        recv = asyncio.create_task(turn.receive(segmented=True), name="streamvox-recv")
        try:
            done, _ = await asyncio.wait({send, recv}, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()
        except (TTSError, TimeoutError, OSError) as exc:
            turn.ended_by(exc)
            raise _translate(exc, self._opts.api_key) from None
        finally:
            await utils.aio.cancel_and_wait(send, recv)  # both only wait on queues: immediate
            for task in (send, recv):
                if not task.cancelled():
                    task.exception()  # retrieved: the first failure was raised above
            turn.finish()

    async def _send(self, turn: _Turn) -> None:
        ctx: TTSContext | None = None
        async for item in self._input_ch:
            if isinstance(item, self._FlushSentinel):
                if ctx is None:
                    continue  # a flush before any text: an empty segment
                # One stream = one segment: the framework drops text after the first flush.
                await ctx.flush()
                await ctx.end()
                return
            pieces = _pieces(item)
            if ctx is None:
                self._mark_started()
                turn.open(pieces.pop(0), pace=self._opts.pace)
                ctx = await turn.ctx()
            for piece in pieces:
                await ctx.send_text(piece)
        if ctx is None:
            turn.no_text()
        else:
            await ctx.end()


class ChunkedStream(tts.ChunkedStream):
    """``synthesize()``: the whole text in one ``start``, rendered unpaced on a pooled connection."""

    def __init__(self, *, tts: StreamvoxTTS, input_text: str, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, input_text=input_text, conn_options=conn_options)
        self._owner = tts
        self._opts = dataclasses.replace(tts._opts)

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        turn = await _begin_turn(self, output_emitter, stream_mode=False)
        try:
            if self._input_text.strip():
                first, *rest = _pieces(self._input_text)
                turn.open(first, pace=False)
                ctx = await turn.ctx()
                for piece in rest:
                    await ctx.send_text(piece)
                await ctx.end()
            else:
                turn.no_text()
            async with asyncio.timeout(max(self._conn_options.timeout, 60.0)):
                await turn.receive(segmented=False)
        except (TTSError, TimeoutError, OSError) as exc:
            turn.ended_by(exc)
            raise _translate(exc, self._opts.api_key) from None
        finally:
            turn.finish()
        output_emitter.flush()


__all__ = ["CancelReport", "ChunkedStream", "StreamvoxStats", "StreamvoxTTS", "SynthesizeStream"]
