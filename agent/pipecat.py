"""streamvox for Pipecat 1.14: ``StreamvoxTTSService``, a WebSocket TTS service with acknowledged barge-in.

Drop-in for any Pipecat pipeline (``examples/pipecat_tts.py``)::

    tts = StreamvoxTTSService(url="ws://127.0.0.1:8765/v1/stream")
    pipeline = Pipeline([transport.input(), stt, user_agg, llm, tts, transport.output(), assistant_agg])

Why it differs from Pipecat's stock WebSocket TTS services:

* **One persistent connection.** ``InterruptibleTTSService`` re-opens its socket on every
  interruption, putting a handshake in front of the next turn's first byte. Here an interruption
  is a protocol ``cancel`` on the same socket, which is replaced only when it fails (the receive
  loop ends, a send fails, or a cancel is never acknowledged).
* **A thin transport.** The protocol state is ``tts_service.session.ClientSession`` (one per
  connection) and the connection policy - replica placement, a start refused with
  ``overloaded``/``draining`` re-opened elsewhere with the text it had, the cancel-ack deadline,
  back-off, leaving a draining replica *between turns* - is ``tts_service.driver.ClientDriver``,
  both shared with ``TTSClient``; this module owns the socket and the tasks and maps the events
  onto Pipecat frames. A socket that dies mid-turn ends that turn with an ``ErrorFrame``; its
  audio is never replayed.
* **Tokens in, segmentation on the server** (``TextAggregationMode.TOKEN``); one Pipecat audio
  context is one protocol context, ended by ``flush_audio``.
* **Cancel without delay, ack in the background.** ``on_audio_context_interrupted`` runs before the
  ``InterruptionFrame`` reaches the output transport, so it only gates the context (later frames
  are dropped and counted) and a background task waits for the ack.
* **Only spoken words reach the context.** Word timings go to ``add_word_timestamps`` as their
  audio arrives, shifted by any delivery lag, so after a barge-in the assistant message holds what
  the caller heard.
* **PCM at the pipeline's rate** when the server offers it, resampled here otherwise (the Twilio
  serializer makes mu-law itself).

No jitter buffer: Pipecat's output transport queues what it is given and plays it on the
real-time clock, and the server paces a bounded lead ahead of that clock, so a buffer would only
add its priming depth to every first byte. A server that falls behind real time cannot be hidden
by a client buffer; ``stats.max_lag_s`` measures it. Measured figures: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from loguru import logger
from pipecat.frames.frames import (
    EagerEndOfTurnCancelFrame,
    ErrorFrame,
    Frame,
    InterruptionFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessorSetup
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TextAggregationMode, WebsocketTTSService
from websockets.protocol import State

from agent.pipecat_speculation import SpeculativeResponseFrame
from tts_service import protocol as P
from tts_service.client import Replica, wait_for_ack
from tts_service.driver import RENAMED, ClientDriver, ConnectionSettings, StreamvoxStats, renamed_settings
from tts_service.session import (
    Acked,
    ClientSession,
    Done,
    Draining,
    Failed,
    SessionContext,
    Started,
    Unknown,
    Words,
    check_ready,
)

__all__ = ["StreamvoxStats", "StreamvoxTTSService"]

DEFAULT_URL = f"ws://127.0.0.1:{P.DEFAULT_PORT}{P.WS_PATH}"


@dataclass(eq=False)
class _Context:
    """Pipecat's side of one protocol context: word timing against the audio delivered."""

    s: SessionContext  # the protocol state (tts_service.session)
    words: deque[tuple[str, float]] = field(default_factory=deque)  # (word, start s) not yet due
    audio_s: float = 0.0  # audio received so far
    play_end: float = 0.0  # when a real-time player started at the first frame finishes it
    first_at: float | None = None
    lag_s: float = 0.0  # how far delivery has fallen behind that player (underruns), never shrinks
    # Until ``started``: the start options and the messages sent after the start, so that a start
    # refused for lack of room (nothing spoken yet) can be opened again on another replica.
    start_opts: dict[str, Any] = field(default_factory=dict)
    unconfirmed: list[str] | None = field(default_factory=list)
    moves: int = 0

    @property
    def context_id(self) -> str:
        return self.s.context_id


class StreamvoxTTSService(WebsocketTTSService):
    """Pipecat TTS service for a streamvox server (protocol v1), one persistent WebSocket."""

    def __init__(
        self,
        *,
        url: str | Sequence[str] = DEFAULT_URL,
        api_key: str | None = None,
        voice: str | None = None,
        sample_rate: int | None = None,
        pace: bool = True,
        cancel_ack_timeout_s: float = 1.0,
        connect_timeout_s: float = 5.0,
        reconnect_backoff_s: float = 0.2,
        reconnect_backoff_max_s: float = 5.0,
        discover: bool = False,
        resolver=None,
        settings: TTSSettings | None = None,
        **kwargs: Any,
    ) -> None:
        """Create the service; it connects when the pipeline starts.

        Args:
            url: the server's WebSocket endpoint (``ws://host:port/v1/stream``), or a list of
                replicas' endpoints; each connection goes to the less loaded of two (``/readyz``).
            api_key: sent as ``Authorization: Bearer`` when the server requires one.
            voice: voice name (default: the server's default voice); runtime-updatable through
                ``TTSUpdateSettingsFrame(delta=TTSSettings(voice=...))``, applied from the next
                context on.
            sample_rate: output rate; default the pipeline's ``audio_out_sample_rate``.
            pace: let the server pace audio a bounded lead ahead of real time (cheap cancels,
                fair sharing). ``False`` renders as fast as possible.
            cancel_ack_timeout_s: how long a cancel may go unacknowledged before the connection
                is replaced.
            connect_timeout_s: bound on the handshake plus the server's ``ready``.
            reconnect_backoff_s, reconnect_backoff_max_s: backoff between failed reconnects,
                doubling from the first to the second (and a failed replica's back-off). The
                setting names are those of every streamvox client; ``reconnect_backoff_min_s``
                (the earlier name) still works, with a DeprecationWarning.
            discover: ``url``'s host name has one address per replica (a headless Service).
            resolver: ``async (host, port) -> [address, ...]`` instead of the system resolver.
            settings: Pipecat TTS settings (``voice`` is used; ``model``/``language`` are not).
            **kwargs: passed to ``WebsocketTTSService`` / ``TTSService``.
        """
        renamed = {k: kwargs.pop(k) for k in list(kwargs) if k in RENAMED}
        settings_s = ConnectionSettings(
            **renamed_settings(
                "StreamvoxTTSService",
                renamed,
                {
                    "cancel_ack_timeout_s": cancel_ack_timeout_s,
                    "connect_timeout_s": connect_timeout_s,
                    "reconnect_backoff_s": reconnect_backoff_s,
                    "reconnect_backoff_max_s": reconnect_backoff_max_s,
                },
            )
        )
        base = TTSSettings(model=None, voice=voice, language=None)
        if settings is not None:
            base.apply_update(settings)
        kwargs.setdefault("text_aggregation_mode", TextAggregationMode.TOKEN)
        super().__init__(
            push_text_frames=False,  # words come from the server's timings, as they are played
            push_start_frame=True,  # the base opens the audio context and starts TTFB per context
            pause_frame_processing=False,  # frames carry their context's stream tag
            sample_rate=sample_rate,
            settings=base,
            **kwargs,
        )
        # The connection policy and the stats; this class is the transport that acts on them.
        self._driver = ClientDriver.for_urls(url, settings_s, discover=discover, resolver=resolver)
        self._replicas = self._driver.replicas
        self._url = url if isinstance(url, str) else self._replicas.label  # for messages
        self._api_key = api_key
        self._pace = pace
        # WebsocketService's own defaults (seconds) suit cloud rate limits, not a co-located server.
        self._reconnect_backoff_min_wait = settings_s.reconnect_backoff_s
        self._reconnect_backoff_max_wait = settings_s.reconnect_backoff_max_s
        self.stats: StreamvoxStats = self._driver.stats
        self.server_info: dict[str, Any] = {}
        self._request_rate: int | None = None
        self._session = ClientSession()  # the protocol state of the current connection
        self._replica: Replica | None = None  # where the current connection goes
        self._http: aiohttp.ClientSession | None = None  # /readyz probes (several replicas only)
        self._acks: dict[str, asyncio.Future] = {}
        self._ack_tasks: set[asyncio.Task] = set()
        self._receive_task: asyncio.Task | None = None
        self._condemned: Any = None  # the socket aborted for a missing ack (not a replica failure)
        self._unspoken_context: str | None = None  # the context already told "not connected"
        # speculative audio (agent.pipecat_speculation): whether what is synthesised now answers a
        # turn not yet confirmed, and whether the user's turn has ended since it last started
        self._speculative = False
        self._turn_ended = False
        self.withdrawn = 0  # speculative replies whose synthesis was cancelled (figures)

    def can_generate_metrics(self) -> bool:
        return True

    @property
    def _connect_failures(self) -> int:
        """Consecutive failed connects (the driver's count; on-demand connects back off by it)."""
        return self._driver.connect_failures

    # ------------------------------------------------------------------ lifecycle

    async def setup(self, setup: FrameProcessorSetup) -> None:
        await super().setup(setup)
        # The server resamples to any of its rates; other rates are resampled here.
        self._request_rate = self.sample_rate if self.sample_rate in P.SAMPLE_RATES else None
        await self._connect()

    async def _connect(self) -> None:
        await super()._connect()
        await self._connect_websocket()
        if self._websocket and (self._receive_task is None or self._receive_task.done()):
            self._receive_task = self.create_task(self._receive_task_handler(self._report_error), "streamvox-recv")

    async def _disconnect(self) -> None:
        await super()._disconnect()
        for task in list(self._ack_tasks):
            await self.cancel_task(task)
        self._ack_tasks.clear()
        if self._receive_task:
            await self.cancel_task(self._receive_task)
            self._receive_task = None
        await self._disconnect_websocket()
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _dial(self) -> tuple[Any, dict[str, Any], Replica]:
        """Open a socket on the best replica that answers (``ready`` checked)."""
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession()
        order = self._driver.candidates(await self._replicas.choose(self._http))
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        last: Exception | None = None
        for replica in order:
            ws = None
            try:
                ws = await self._websocket_connect(
                    replica.url, additional_headers=headers, open_timeout=self._driver.settings.connect_timeout_s
                )
                info = check_ready(await asyncio.wait_for(ws.recv(), self._driver.settings.connect_timeout_s))
            except Exception as exc:
                if ws is not None:
                    await ws.close()
                last = exc
                self._driver.dial_failed(replica, str(exc), time.monotonic())
                continue
            self._driver.dialled(replica)
            return ws, info, replica
        raise last or ConnectionError("no replica to connect to")

    async def _connect_websocket(self, *, replace: bool = False) -> None:
        ws = self._open_socket()
        if ws is not None and not self._session.draining and not replace:
            return
        try:
            ws, info, replica = await self._dial()
        except Exception as exc:
            self._driver.placement_failed(time.monotonic())  # on-demand connects wait it out
            # No secrets in the message: the URL carries none (the key travels in a header).
            await self.push_error(error_msg=f"cannot connect to streamvox at {self._url}: {exc}", exception=exc)
            if self._open_socket() is None:
                self._websocket = None
            await self._call_event_handler("on_connection_error", f"{exc}")
            return
        await self._end_lost_contexts(self._new_session(info), "connection replaced")
        self._websocket, self._replica = ws, replica
        self.server_info = info
        logger.debug(f"{self} connected to {replica.url} (connection {self.stats.connections})")
        await self._call_event_handler("on_connected")

    async def _disconnect_websocket(self) -> None:
        ws, self._websocket = self._websocket, None
        try:
            await self.cancel_ttfb_metrics()  # audio still due on this socket will not come
            if ws is not None:
                await ws.close()
        except Exception as exc:
            logger.warning(f"{self} error closing the connection: {exc}")
        finally:
            await self._end_lost_contexts(self._new_session({}), "connection closed")
            await self._call_event_handler("on_disconnected")

    def _new_session(self, info: dict[str, Any]) -> list[SessionContext]:
        """Contexts, stream numbers and acks belong to one connection: start a new session;
        return the contexts the old one still had open."""
        lost = self._session.lose()
        self._session = ClientSession(info)
        for fut in self._acks.values():
            if not fut.done():
                fut.set_exception(ConnectionError("connection replaced"))
                fut.exception()  # retrieved: a tracker may already have given up on it
        self._acks.clear()
        return lost

    async def _end_lost_contexts(self, lost: list[SessionContext], reason: str) -> None:
        """A context cut by a lost connection ends with an error; its audio is never replayed."""
        for s in lost:
            if s.gated or self._disconnecting or not self.audio_context_available(s.context_id):
                continue
            self.stats.contexts_lost += 1
            await self.push_error(
                error_msg=f"{self}: streamvox connection lost mid-turn ({reason}); context {s.context_id} ended,"
                " its audio is not replayed"
            )
            await self.cancel_ttfb_metrics()
            await self.append_to_audio_context(s.context_id, TTSStoppedFrame(context_id=s.context_id))
            await self.remove_audio_context(s.context_id)

    async def _switch_replica(self, why: str, *, drained: bool = True) -> None:
        """Between turns: replace the connection (its replica drains, or refused a start) by one on
        another replica."""
        old = self._websocket
        if drained:
            self._driver.left()
        logger.info(f"{self} {why}: moving to another replica between turns")
        await self._connect_websocket(replace=True)
        if old is not None and self._websocket is not old:
            await old.close()

    def _open_socket(self):
        ws = self._websocket
        return ws if ws is not None and ws.state is State.OPEN else None

    # ------------------------------------------------------------------ text in

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """Send one token (or sentence) of ``context_id``; its audio arrives on the receive task."""
        s = self._session.get(context_id)
        if s is None and self._driver.leave_now(self._session):
            await self._switch_replica("the replica is draining")  # a new turn: never mid-context
        ws = self._open_socket()
        if ws is None and self._driver.may_connect(time.monotonic()):
            await self._connect()
            ws = self._open_socket()
        if ws is None:
            if self._unspoken_context != context_id:  # one error per context, not one per token
                self._unspoken_context = context_id
                yield ErrorFrame(error=f"{self}: not connected to {self._url}; text not spoken")
            return
        s = self._session.get(context_id)
        try:
            if s is None:
                if self._session.was_finished(context_id):
                    return  # late tokens of a finished (or cancelled) turn: never spoken again
                voice = self._settings.voice
                opts = {
                    "voice": voice if isinstance(voice, str) and voice else None,
                    "sample_rate": self._request_rate,
                    "encoding": P.PCM_S16LE,
                    "pace": self._pace,
                }
                # Registered before the send, so an interruption racing it still cancels it.
                s, message = self._session.start(context_id, text=text, **opts)
                s.owner = _Context(s, start_opts={**opts, "text": text})
                self.stats.contexts += 1
            else:
                message = self._session.text(s, text)
                if message is not None and s.owner.unconfirmed is not None:
                    s.owner.unconfirmed.append(message)
            if message is not None:
                await ws.send(message)
            await self.start_tts_usage_metrics(text)
        except Exception as exc:
            # The receive loop sees the broken socket and reconnects; this text is lost.
            yield ErrorFrame(error=f"{self}: sending text failed: {exc}")
            return
        yield None

    async def flush_audio(self, context_id: str | None = None) -> None:
        """End of the turn: no more text for this context; ``done`` follows its last frame."""
        s = self._session.get(context_id or self.get_active_audio_context_id() or "")
        ws = self._open_socket()
        message = self._session.end(s) if s is not None and ws is not None else None
        if message is None:
            return
        if s.owner.unconfirmed is not None:
            s.owner.unconfirmed.append(message)
        try:
            await ws.send(message)
        except Exception as exc:
            logger.warning(f"{self} sending 'end' failed: {exc}")

    # ------------------------------------------------------------------ barge-in

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        if isinstance(frame, SpeculativeResponseFrame):
            self._speculative = not self._turn_ended  # a turn already over: nothing speculative left
        elif isinstance(frame, UserStartedSpeakingFrame):
            self._turn_ended = False
        elif isinstance(frame, UserStoppedSpeakingFrame):
            self._turn_ended, self._speculative = True, False  # confirmed: this is the reply
        elif isinstance(frame, EagerEndOfTurnCancelFrame) and self._speculative:
            await self._withdraw_speculation()
        await super().process_frame(frame, direction)

    async def _withdraw_speculation(self) -> None:
        """The caller went on: stop synthesising a reply that answered half a turn (acknowledged,
        as a barge-in is) and drop its text still queued here; nothing of it was heard (the hold
        after this service drops its audio)."""
        self._speculative = False
        self.withdrawn += 1
        await self._start_interruption()  # the stopped inference's text still in this queue
        await self._handle_interruption(InterruptionFrame(), FrameDirection.DOWNSTREAM)  # cancels its contexts

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        """Gate the context now; cancel and track the ack in the background.

        This runs before the ``InterruptionFrame`` reaches the output transport, so nothing here
        waits on the network: the flush of what is already queued for playback is not delayed.
        """
        await self.cancel_ttfb_metrics()  # an interrupted context's TTFB is not a TTFB
        s = self._session.get(context_id)
        if s is not None:
            message = self._session.cancel(s)  # gates it; None when a cancel is already on its way
            if message is not None:
                self._driver.cancel_sent(context_id, time.monotonic())
                task = self.create_task(self._cancel_and_track(s, message), f"streamvox-cancel-{context_id}")
                self._ack_tasks.add(task)
                task.add_done_callback(self._ack_tasks.discard)
        await super().on_audio_context_interrupted(context_id)

    async def _cancel_and_track(self, s: SessionContext, message: str) -> None:
        ws = self._open_socket()
        if ws is None:
            self._driver.cancel_abandoned(s.context_id)
            return  # the connection is gone, and with it the context
        fut = self._acks[s.context_id] = asyncio.get_running_loop().create_future()
        try:
            await ws.send(message)
            await wait_for_ack(self._driver, s.context_id, fut)  # counted and logged as it arrives
        except TimeoutError:
            logger.warning(
                f"{self} cancel of {s.context_id} not acknowledged within"
                f" {self._driver.settings.cancel_ack_timeout_s:.1f} s: replacing the connection"
            )
            self._acks.pop(s.context_id, None)
            if self._websocket is ws:
                # Abort rather than close: a peer that ignores a cancel may ignore a close too.
                # The receive loop then ends with an error and WebsocketService reconnects.
                self._condemned = ws
                ws.transport.abort()
            return
        except Exception as exc:  # send failed or the connection was replaced meanwhile
            self._driver.cancel_abandoned(s.context_id)
            logger.debug(f"{self} cancel of {s.context_id} not tracked: {exc}")

    # ------------------------------------------------------------------ audio and events out

    async def _receive_messages(self) -> None:
        """Read the current connection; when it is replaced between turns, read the new one."""
        while True:
            ws = self._websocket
            if ws is None:
                raise ConnectionError(f"{self} not connected")
            try:
                async for message in ws:
                    if isinstance(message, bytes):
                        await self._on_audio(message)
                    else:
                        await self._on_message(P.parse_server_message(message))
                    if self._websocket is not ws:
                        break  # replaced (the replica drains): go on with the new connection
            except Exception as exc:
                self._died(ws, f"{type(exc).__name__}: {exc}")
                raise
            if self._websocket is not ws and self._open_socket() is not None:
                continue
            if self._session.draining and not self._disconnecting:
                # The draining server closed the socket (its drain deadline): what was still
                # live got its error; place the next connection ourselves, on another replica.
                await self._switch_replica("the draining replica closed the connection")
                if self._websocket is not ws and self._open_socket() is not None:
                    continue
            self._died(ws, "the server closed the connection")
            return  # closed: WebsocketService's reconnect takes over

    def _died(self, ws: Any, reason: str) -> None:
        """The current socket ended under us: the driver backs its replica off (unless we aborted
        it ourselves for a missing ack), so WebsocketService's reconnect goes elsewhere."""
        if ws is self._websocket and self._replica is not None and not self._disconnecting:
            left = ws is self._condemned or self._session.draining
            # contexts=0: the cut turns are counted per Pipecat audio context in _end_lost_contexts
            self._driver.lost(self._replica, reason, retired=left, contexts=0, now=time.monotonic())

    async def _on_audio(self, data: bytes) -> None:
        ev = self._session.receive_audio(data)
        if ev.stale or ev.ctx is None:
            # Late frames of a cancelled context (or of one the server knows and we do not).
            self.stats.frames_dropped += 1
            return
        s, pcm = ev.ctx, ev.payload
        await self._time_words(s.owner, len(pcm) / 2 / s.sample_rate)
        if s.sample_rate != self.sample_rate:
            pcm = await self._resampler.resample(pcm, s.sample_rate, self.sample_rate)
        frame = TTSAudioRawFrame(audio=pcm, sample_rate=self.sample_rate, num_channels=1, context_id=s.context_id)
        await self.append_to_audio_context(s.context_id, frame)

    async def _time_words(self, ctx: _Context, frame_s: float | None) -> None:
        """Queue the words that start in the frame about to be queued, timed as it will play.

        The server times words from the start of the context's audio, and Pipecat turns those
        times into presentation times from the first audio frame, which is right only while
        audio arrives ahead of real time. When the server or the link falls behind, the player
        has gaps and wall-clock word times run ahead of the audio: after a barge-in the context
        would hold words nobody heard. So each word is held until the frame holding its start
        arrives and shifted by the delivery lag of a real-time player started at the first
        frame. (If the context waits behind another one, the lag only delays words a little.)
        """
        if frame_s is None:  # the context is done: whatever is left is due now
            end = float("inf")
        else:
            now = time.monotonic()
            if ctx.first_at is None:
                ctx.first_at = ctx.play_end = now
            start = max(now, ctx.play_end)
            ctx.lag_s = max(ctx.lag_s, start - (ctx.first_at + ctx.audio_s))
            self.stats.max_lag_s = max(self.stats.max_lag_s, ctx.lag_s)
            ctx.play_end = start + frame_s
            ctx.audio_s += frame_s
            end = ctx.audio_s
        due: list[tuple[str, float]] = []
        while ctx.words and ctx.words[0][1] < end:
            word, at = ctx.words.popleft()
            due.append((word, at + ctx.lag_s))
        if due:
            await self.add_word_timestamps(due, ctx.context_id)

    async def _on_message(self, msg: dict[str, Any]) -> None:
        ev = self._session.receive_message(msg)
        if isinstance(ev, Started):
            ev.ctx.owner.unconfirmed = None  # admitted: from here on nothing is ever re-sent
            if ev.ctx.encoding != P.PCM_S16LE:  # a server bug: we never ask for anything else
                self._session.gate(ev.ctx)
                await self.push_error(error_msg=f"{self}: server sent {ev.ctx.encoding!r}, not pcm_s16le")
        elif isinstance(ev, Words):
            if not ev.ctx.gated:
                ev.ctx.owner.words.extend((w.word, w.start) for w in ev.words)
        elif isinstance(ev, Done):
            s = ev.ctx
            if not s.gated and self.audio_context_available(s.context_id):
                await self._time_words(s.owner, None)
                await self.append_to_audio_context(s.context_id, TTSStoppedFrame(context_id=s.context_id))
                await self.remove_audio_context(s.context_id)
            await self._after_finish()
        elif isinstance(ev, Acked):
            latency = self._driver.acked(ev.context_id, time.monotonic(), ev.frames_dropped)
            if latency is not None:
                logger.debug(
                    f"{self} cancel of {ev.context_id} acknowledged in {1000 * latency:.1f} ms "
                    f"({ev.frames_dropped} frames never sent, {ev.ctx.dropped if ev.ctx else 0} dropped here)"
                )
            fut = self._acks.pop(ev.context_id, None)
            if fut is not None and not fut.done():
                fut.set_result(ev)
            await self._after_finish()
        elif isinstance(ev, Failed):
            await self._on_error(ev)
            await self._after_finish()
        elif isinstance(ev, Draining):
            if self._replica is not None:
                self._driver.draining(self._replica, time.monotonic())
            await self._after_finish()
        elif isinstance(ev, Unknown) and not ev.stray:
            logger.warning(f"{self} unknown server message type {ev.msg.get('type')!r}: {str(ev.msg)[:200]}")

    async def _after_finish(self) -> None:
        """A draining connection is replaced as soon as its last context has finished."""
        if self._driver.leave_now(self._session) and not self._disconnecting:
            await self._switch_replica("the replica is draining")

    async def _move_refused(self, ev: Failed) -> bool:
        """A start refused for lack of room (``overloaded``/``draining``, nothing spoken) is opened
        again on another replica, with the text it had; True if it was."""
        s = ev.ctx
        ctx: _Context | None = s.owner if s is not None else None
        if (
            ctx is None
            or self._replica is None
            or not ev.retry_elsewhere
            or ctx.unconfirmed is None  # already admitted: something may have been spoken
            or s.gated
            or self._session.open_contexts  # other live turns keep this connection
        ):
            return False
        refusal = self._driver.refused(
            self._replica, ev.code, ev.retry_after_ms, tries=ctx.moves + 1, now=time.monotonic()
        )
        if not refusal.retry_elsewhere:
            return False
        await self._switch_replica(f"start refused ({ev.code})", drained=False)
        ws = self._open_socket()
        if ws is None or self._session.get(s.context_id) is not None:
            return False
        moved, start = self._session.start(s.context_id, **ctx.start_opts)
        moved.owner, ctx.s, ctx.moves = ctx, moved, ctx.moves + 1
        try:
            for message in [start, *ctx.unconfirmed]:
                await ws.send(message)
        except Exception as exc:
            logger.warning(f"{self} re-opening {s.context_id} on another replica failed: {exc}")
            return False
        moved.ended = s.ended
        self._driver.moved()
        return True

    async def _on_error(self, ev: Failed) -> None:
        if await self._move_refused(ev):
            return
        text = f"streamvox {ev.code}: {ev.message}"
        if ev.retry_after_ms is not None:
            text += f" (retry after {ev.retry_after_ms} ms)"
        s = ev.ctx
        if s is None:
            await self.push_error(error_msg=text)
            return
        if not s.gated:
            await self.push_error(error_msg=f"{text} [context {s.context_id}]")
        if ev.ended and not s.gated and self.audio_context_available(s.context_id):
            await self.cancel_ttfb_metrics()
            await self.append_to_audio_context(s.context_id, TTSStoppedFrame(context_id=s.context_id))
            await self.remove_audio_context(s.context_id)
