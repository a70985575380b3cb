"""BargeIn: the caller talks over the bot -> silence now, acknowledged cancel, clean next turn.

On a VAD ``speech_start`` while the bot is speaking (and the utterance allows interruption, and
the caller has spoken for ``min_speech_ms``), :class:`BargeIn` does, in this order:

1. **flush the playback sink and the jitter buffer** - synchronously, in the same call that
   handled the VAD event, with the optional 10-30 ms soft-stop fade (``SpeechOutput.fade_ms``).
   Silence comes first: nothing below waits on the network;
2. **send ``cancel``** for the live context on the existing connection (``cancel_nowait``);
3. the client **drops and counts every frame of that context** still arriving (it gated the
   context in step 2, before any await), and so does :class:`~agent.runtime.speech.SpeechOutput` for a
   frame already on its way to the jitter buffer;
4. **await the server's ``cancelled`` ack**, bounded by ``TTSClient(cancel_ack_timeout_s=...)``; on a
   timeout the client drops the connection and reconnects in the background, and this is logged;
5. only then **mark the turn ready** (:meth:`BargeIn.wait_ready`): the next reply starts on a
   clean pipeline and, normally, on the same connection.

**Yield, then confirm** (``BargeInOptions.yield_on_onset``, on by default). Waiting for the
VAD's ``min_speech_ms`` (200 ms) before the bot falls quiet is what makes a barge-in feel slow,
while barging in on the first speech window would let every cough cost the caller the reply. So
the controller does both halves: at the VAD's *first* speech window (``onset``) while an
interruptible utterance plays, it **pauses** the output (:meth:`SpeechOutput.pause`: the same
immediate flush, but the place is kept); on **confirmed** speech (the VAD's ``speech_start`` and
``min_speech_ms``) it runs the five steps below, with the bot already quiet; when the candidate
is dropped (the VAD's ``onset_dropped``, or ``speech_end`` before ``min_speech_ms``) or not
confirmed within ``resume_after_ms`` of the onset, it **resumes** from the paused point and
reports a :class:`FalseInterruption`. Nothing is replayed or skipped, and what the utterance
says was heard (``heard_ms``, ``heard_words``) stops at the pause when the barge-in is confirmed.

Each barge-in yields a :class:`BargeInRecord` (onset -> silent, decision -> silent, cancel ->
ack, frames dropped after the cancel, audio played after the onset), delivered to callbacks and
an ``asyncio.Queue`` (:attr:`BargeIn.events`) and recorded as Prometheus metrics
(:class:`BargeInMetrics`, one per process, on a registry you choose). Speech starts that do not
barge in (bot silent, utterance not interruptible, too short) yield :class:`BargeInIgnored`.

Times: the VAD counts seconds of caller audio; :meth:`BargeIn.feed` maps them to the clock by
taking the end of each chunk as captured at ``captured_at`` (default: now). ``onset_at`` is when
the caller started (the VAD's first speech window), ``decided_at`` when the VAD could say so.

**Lost connection policy.** A turn is never resumed or restarted on another connection, and
audio the caller already heard is never replayed:

* connection lost while the bot speaks (no barge-in): the utterance is *abandoned*: the output
  stops at once with the soft fade, status ``LOST``, ``heard_words`` says how far the caller
  got; the application decides what to say next (a new context, new text). The next
  ``say``/``open`` reconnects (``TTSClient.connections`` goes up by one);
* connection lost during a barge-in (before the ack): the caller already hears silence (step 1
  does not need the network), the record says ``outcome="lost"``, the turn is marked ready;
* no ack within the timeout: ``outcome="timeout"``; the client has dropped that connection (its
  state cannot be trusted) and reconnects in the background; the turn is marked ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram

from tts_service.client import CancelResult

from .speech import PauseResult, SpeechOutput, StopResult, Utterance, UtteranceStatus
from .vad import SileroVAD, VADEvent

__all__ = [
    "BargeIn",
    "BargeInEvent",
    "BargeInIgnored",
    "BargeInMetrics",
    "BargeInOptions",
    "BargeInRecord",
    "FalseInterruption",
]

log = logging.getLogger(__name__)

Outcome = Literal["acked", "finished", "timeout", "lost"]
IgnoredReason = Literal["not_speaking", "denied", "too_short"]
ResumeReason = Literal["dropped", "too_short", "timeout"]

_SILENCE_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5, 2.0)
_ACK_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0)


@dataclass(frozen=True, slots=True)
class BargeInOptions:
    """``min_speech_ms``: caller speech (from its onset) needed before barging in. The VAD's own
    ``min_speech_ms`` (200 ms by default) already applies; a larger value here waits longer (the
    bot keeps talking over a cough); 0 barges in as soon as the VAD declares speech.
    ``fade``: soft stop (``SpeechOutput.fade_ms``) instead of a hard cut.
    ``ack_grace_s``: extra wait beyond the client's ``cancel_ack_timeout_s`` before giving up on a
    cancel task that neither acked nor timed out (a safety net, never reached normally).
    ``yield_on_onset``: pause at the VAD's first speech window (yield, then confirm);
    ``resume_after_ms``: a pause not confirmed within this long of the onset resumes."""

    min_speech_ms: float = 0.0
    fade: bool = True
    ack_grace_s: float = 2.0
    # yield, then confirm: pause at the first speech window, resume if not confirmed within
    # resume_after_ms of it (never sooner than a confirmation can take: VAD + our min speech)
    yield_on_onset: bool = True
    resume_after_ms: float = 500.0

    def __post_init__(self) -> None:
        if self.min_speech_ms < 0:
            raise ValueError(f"min_speech_ms must be >= 0, got {self.min_speech_ms}")
        if self.resume_after_ms <= 0:
            raise ValueError(f"resume_after_ms must be > 0, got {self.resume_after_ms}")


@dataclass(frozen=True, slots=True)
class BargeInRecord:
    """One barge-in, measured. Times are on the controller's clock (seconds)."""

    index: int
    utterance_id: int
    context_id: str
    outcome: Outcome
    acked: bool
    onset_at: float  # the caller started speaking (VAD's first speech window)
    decided_at: float  # the VAD (and min_speech) said so
    yielded_at: float | None  # the output was quiet after the yield's pause (None: no yield)
    handled_at: float  # this controller acted (flush)
    silent_at: float  # the sink is silent (end of the fade)
    cancel_sent_at: float
    ready_at: float  # ack received (or given up): the next turn may start
    cancel_to_ack_ms: float
    fade_ms: float
    sink_dropped_ms: float
    jitter_dropped_ms: float
    frames_dropped_client: int  # frames of the context that arrived after the cancel (client gate)
    frames_dropped_local: int  # frames already on their way to the jitter buffer (SpeechOutput)
    frames_dropped_server: int  # computed or queued frames the server never sent (from the ack)
    audio_after_onset_ms: float  # bot audio the sink played from the onset to silence
    stale_frames_played: int  # frames of the stopped utterance played after the flush (must be 0)

    @property
    def onset_to_silence_ms(self) -> float:
        return 1000.0 * (self.silent_at - self.onset_at)

    @property
    def yield_ms(self) -> float | None:
        """Onset -> the bot paused (quiet); the caller's "it stopped" moment when it yielded."""
        return None if self.yielded_at is None else 1000.0 * (self.yielded_at - self.onset_at)

    @property
    def decision_to_silence_ms(self) -> float:
        return 1000.0 * (self.silent_at - self.decided_at)

    @property
    def vad_decision_ms(self) -> float:
        """Onset -> decision: the VAD's min speech plus window granularity."""
        return 1000.0 * (self.decided_at - self.onset_at)

    @property
    def react_ms(self) -> float:
        """Decision -> flush: chunking of the caller audio plus this process's scheduling."""
        return 1000.0 * (self.handled_at - self.decided_at)

    @property
    def frames_dropped(self) -> int:
        """Frames of the context that arrived after the cancel and were dropped."""
        return self.frames_dropped_client + self.frames_dropped_local

    def to_dict(self) -> dict:
        d = asdict(self)
        for name in (
            "yield_ms",
            "onset_to_silence_ms",
            "decision_to_silence_ms",
            "vad_decision_ms",
            "react_ms",
            "frames_dropped",
        ):
            d[name] = getattr(self, name)
        return d


@dataclass(frozen=True, slots=True)
class BargeInIgnored:
    """A caller speech start that did not barge in, and why."""

    reason: IgnoredReason
    onset_at: float
    at: float
    utterance_id: int | None = None


@dataclass(frozen=True, slots=True)
class FalseInterruption:
    """A yield that was not confirmed: the bot paused, then resumed where it stopped."""

    utterance_id: int
    onset_at: float  # the candidate's first speech window
    silent_at: float  # the output was quiet (end of the pause's fade-out)
    resumed_at: float
    reason: ResumeReason
    held_ms: float  # audio taken back from the sink and played first on resume

    @property
    def yield_ms(self) -> float:
        return 1000.0 * (self.silent_at - self.onset_at)

    @property
    def gap_ms(self) -> float:
        """How long the caller heard the bot quiet."""
        return 1000.0 * (self.resumed_at - self.silent_at)


BargeInEvent = BargeInRecord | BargeInIgnored | FalseInterruption


@dataclass(slots=True)
class _Yield:
    """A pause waiting for confirmation."""

    utt: Utterance
    onset_at: float
    onset_s: float | None  # in VAD audio seconds, when fed through feed()
    pause: PauseResult
    timer: asyncio.TimerHandle | None = None


@dataclass(slots=True)
class _Cut:
    """What a barge-in knew when it flushed, handed to the task that awaits the ack."""

    utt: Utterance
    finished_on_server: bool
    connected: bool
    cancel: asyncio.Future[CancelResult]
    cancel_sent_at: float
    onset_at: float
    decided_at: float
    yielded_at: float | None
    stop: StopResult
    after_onset_ms: float
    stale_before: int


class BargeInMetrics:
    """Prometheus series of barge-in; create one per process and share it between controllers."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.total = Counter("streamvox_bargein", "Barge-ins by outcome", ["outcome"], registry=r)
        self.ignored = Counter(
            "streamvox_bargein_ignored", "Caller speech starts that did not barge in", ["reason"], registry=r
        )
        self.false_interruptions = Counter(
            "streamvox_bargein_false_interruptions",
            "Yields not confirmed as speech: the bot resumed where it paused",
            ["reason"],
            registry=r,
        )
        self.yield_time = Histogram(
            "streamvox_bargein_yield_seconds",
            "Caller speech onset to bot paused (yield, then confirm)",
            buckets=_SILENCE_BUCKETS,
            registry=r,
        )
        self.onset_to_silence = Histogram(
            "streamvox_bargein_onset_to_silence_seconds",
            "Caller speech onset to bot silent",
            buckets=_SILENCE_BUCKETS,
            registry=r,
        )
        self.decision_to_silence = Histogram(
            "streamvox_bargein_decision_to_silence_seconds",
            "VAD decision to bot silent",
            buckets=_ACK_BUCKETS,
            registry=r,
        )
        self.cancel_ack = Histogram(
            "streamvox_bargein_cancel_ack_seconds", "Cancel sent to ack received", buckets=_ACK_BUCKETS, registry=r
        )
        self.audio_after_onset = Histogram(
            "streamvox_bargein_audio_after_onset_seconds",
            "Bot audio played after the caller's onset",
            buckets=_SILENCE_BUCKETS,
            registry=r,
        )
        self.frames_dropped = Counter(
            "streamvox_bargein_frames_dropped", "Frames that arrived after a cancel and were dropped", registry=r
        )
        self.stale_frames = Counter(
            "streamvox_bargein_stale_frames_played", "Frames played after a barge-in flush (must stay 0)", registry=r
        )

    def observe(self, rec: BargeInRecord) -> None:
        self.total.labels(rec.outcome).inc()
        if rec.yielded_at is not None:
            self.yield_time.observe(max(0.0, rec.yielded_at - rec.onset_at))
        self.onset_to_silence.observe(max(0.0, rec.silent_at - rec.onset_at))
        self.decision_to_silence.observe(max(0.0, rec.silent_at - rec.decided_at))
        if rec.outcome == "acked":
            self.cancel_ack.observe(rec.cancel_to_ack_ms / 1000.0)
        self.audio_after_onset.observe(rec.audio_after_onset_ms / 1000.0)
        self.frames_dropped.inc(rec.frames_dropped)
        self.stale_frames.inc(rec.stale_frames_played)


class BargeIn:
    """Barge-in controller for one conversation (one caller, one :class:`SpeechOutput`).

    Drive it with caller audio (:meth:`feed`, runs the Silero VAD) or with another VAD's events
    (:meth:`speech_onset` / :meth:`speech_started` / :meth:`speech_ended`). Call from the event
    loop's thread.
    """

    def __init__(
        self,
        output: SpeechOutput,
        *,
        vad: SileroVAD | None = None,
        options: BargeInOptions | None = None,
        metrics: BargeInMetrics | None = None,
        on_event: Callable[[BargeInEvent], None] | None = None,
        events_maxsize: int = 64,
    ) -> None:
        self.output = output
        self.vad = vad
        self.options = options or BargeInOptions()
        if vad is not None and self.options.yield_on_onset:
            vad.report_onsets = True  # this controller owns the VAD's stream (it resets it too)
        self.metrics = metrics if metrics is not None else BargeInMetrics()
        self.clock = output.clock
        self.records: list[BargeInRecord] = []
        self.ignored: list[BargeInIgnored] = []
        self.false_interruptions: list[FalseInterruption] = []
        self._yield: _Yield | None = None
        self.events: asyncio.Queue[BargeInEvent] = asyncio.Queue(maxsize=events_maxsize)
        self._listeners: list[Callable[[BargeInEvent], None]] = [on_event] if on_event else []
        self._ready = asyncio.Event()
        self._ready.set()
        self._pending: set[asyncio.Task] = set()
        # (onset_at, decided_at, onset in VAD audio seconds or None) of a start awaiting min speech
        self._armed: tuple[float, float, float | None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._fed = 0  # caller samples given to the VAD since its reset

    # ------------------------------------------------------------------ public API

    def add_listener(self, callback: Callable[[BargeInEvent], None]) -> None:
        self._listeners.append(callback)

    @property
    def ready(self) -> bool:
        """False from a barge-in until its cancel is acknowledged (or given up)."""
        return self._ready.is_set()

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until the last barge-in completed (step 5); start the next reply after this."""
        await asyncio.wait_for(self._ready.wait(), timeout)

    def reset_vad(self) -> None:
        """Forget the caller stream (new call, or a gap in the audio)."""
        if self.vad is not None:
            self.vad.reset()
        self._fed = 0
        self._disarm()
        self._resume("dropped")

    def feed(self, pcm: np.ndarray | bytes, *, captured_at: float | None = None) -> list[VADEvent]:
        """Caller audio at the VAD's rate; its last sample was captured at ``captured_at``.

        Runs the VAD and acts on its events at once (the flush happens inside this call).
        """
        if self.vad is None:
            raise RuntimeError("BargeIn was created without a VAD; pass vad=SileroVAD() or call speech_started()")
        now = self.clock()
        captured = now if captured_at is None else captured_at
        n = len(pcm) // 2 if isinstance(pcm, (bytes, bytearray, memoryview)) else len(pcm)
        self._fed += n
        events = self.vad.feed(pcm)
        sr = self.vad.params.sample_rate
        end_s = self._fed / sr

        def wall(t: float) -> float:
            return captured - (end_s - t)

        for ev in events:
            if ev.kind == "onset":
                self._on_onset(wall(ev.onset_s), onset_s=ev.onset_s)
            elif ev.kind == "onset_dropped":
                if self._armed is None:
                    self._resume("dropped")
            elif ev.kind == "speech_start":
                self._on_start(wall(ev.onset_s), wall(ev.decided_s), onset_s=ev.onset_s)
            else:
                self.speech_ended()
        y = self._yield
        if y is not None and y.onset_s is not None and self._resume_due(self.vad.time_s - y.onset_s):
            self._resume("timeout")  # judged in audio time too: audio fed faster than real time
        armed = self._armed
        if armed is not None and armed[2] is not None:
            # judged in audio time, so that audio fed faster than real time is judged the same
            heard_s = self.vad.time_s - armed[2]
            if heard_s >= self.options.min_speech_ms / 1000.0 - 1e-9 and self.vad.speaking:
                if self.vad.last_prob >= self.vad.params.threshold:
                    self._disarm()
                    self._fire(armed[0], wall(self.vad.time_s))
        return events

    def speech_onset(self, *, onset_at: float | None = None) -> None:
        """Another VAD saw a first speech window (or a speech start it will confirm later): yield.

        Resumes by itself after ``resume_after_ms`` unless :meth:`speech_started` confirms it;
        :meth:`speech_ended` before that resumes at once."""
        self._on_onset(self.clock() if onset_at is None else onset_at, onset_s=None)

    def speech_started(self, *, onset_at: float | None = None, decided_at: float | None = None) -> None:
        """Another VAD declared caller speech (times on this controller's clock; default now)."""
        now = self.clock()
        decided = now if decided_at is None else decided_at
        self._on_start(decided if onset_at is None else onset_at, decided, onset_s=None)

    def speech_ended(self) -> None:
        """The caller stopped: a pending (too short) barge-in is dropped."""
        if self._armed is not None:
            onset_at = self._armed[0]
            self._disarm()
            utt = self.output.current
            self._ignore("too_short", onset_at, utt.id if utt is not None else None)
            self._resume("too_short")
        elif self._yield is not None:
            self._resume("dropped")

    async def aclose(self) -> None:
        self._disarm()
        self._resume("dropped")
        for task in list(self._pending):
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)

    # ------------------------------------------------------------------ yield, then confirm

    def _on_onset(self, onset_at: float, *, onset_s: float | None) -> None:
        out = self.output
        utt = out.current
        if not self.options.yield_on_onset or self._yield is not None or out.paused:
            return
        if utt is None or not utt.active or not utt.allow_interruptions:
            return  # nothing to yield; the confirmed start (if any) reports why
        y = _Yield(utt=utt, onset_at=onset_at, onset_s=onset_s, pause=out.pause())
        delay = max(0.0, onset_at + self._resume_window_s() - self.clock())
        y.timer = asyncio.get_running_loop().call_later(delay, self._resume, "timeout")
        self._yield = y

    def _resume_window_s(self) -> float:
        """``resume_after_ms``, but never shorter than a confirmation can take."""
        need = self.options.min_speech_ms / 1000.0
        if self.vad is not None:
            need += self.vad.params.min_speech_ms / 1000.0 + 2 * self.vad.params.window_s
        return max(self.options.resume_after_ms / 1000.0, need)

    def _resume_due(self, since_onset_s: float) -> bool:
        return self._armed is None and since_onset_s >= self._resume_window_s() - 1e-9

    def _resume(self, reason: ResumeReason) -> None:
        """Not confirmed: play on from the paused point (no-op when not yielding)."""
        y, self._yield = self._yield, None
        if y is None:
            return
        if y.timer is not None:
            y.timer.cancel()
        if not y.utt.active or self.output.current is not y.utt:
            return  # stopped meanwhile (finished, lost): nothing to resume
        if reason == "timeout" and self._armed is not None:
            self._yield = y  # a confirmed start is waiting for min speech: keep quiet
            return
        resumed_at = self.output.resume()
        ev = FalseInterruption(
            utterance_id=y.utt.id,
            onset_at=y.onset_at,
            silent_at=y.pause.silent_at,
            resumed_at=resumed_at if resumed_at is not None else self.clock(),
            reason=reason,
            held_ms=y.pause.held_ms,
        )
        self.false_interruptions.append(ev)
        self.metrics.false_interruptions.labels(reason).inc()
        self._emit(ev)

    # ------------------------------------------------------------------ decision

    def _on_start(self, onset_at: float, decided_at: float, *, onset_s: float | None) -> None:
        need = self.options.min_speech_ms / 1000.0
        if decided_at - onset_at >= need - 1e-9:
            self._fire(onset_at, decided_at)
            return
        self._disarm()
        self._armed = (onset_at, decided_at, onset_s)
        if onset_s is None:  # no audio of ours to watch: decide on the clock, unless speech_ended() comes first
            delay = max(0.0, onset_at + need - self.clock())
            self._timer = asyncio.get_running_loop().call_later(delay, self._timer_fired)

    def _timer_fired(self) -> None:
        self._timer = None
        if self._armed is not None:
            onset_at = self._armed[0]
            self._armed = None
            self._fire(onset_at, self.clock())

    def _disarm(self) -> None:
        self._armed = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self, onset_at: float, decided_at: float) -> None:
        out = self.output
        utt = out.current
        y, self._yield = self._yield, None
        if y is not None and y.timer is not None:
            y.timer.cancel()
        if y is not None and y.utt is utt:
            onset_at = min(onset_at, y.onset_at)  # the caller started at the yield's window
        if utt is None or not utt.active:
            self._ignore("not_speaking", onset_at, utt.id if utt is not None else None)
            return
        if not utt.allow_interruptions:
            self._ignore("denied", onset_at, utt.id)
            return
        stale_before = out.stale_frames_played
        heard_at_onset = out.heard_samples_at(onset_at)
        heard_now = out.heard_samples_at(self.clock())
        # 1. silence first: no await between the decision and the flush
        stop = out.stop(fade=self.options.fade, status=UtteranceStatus.INTERRUPTED)
        # 2 + 3. cancel on the existing connection; the client gates the context synchronously
        ctx = utt.context
        cut = _Cut(
            utt=utt,
            finished_on_server=ctx.done,
            connected=ctx.client.connected,
            cancel=ctx.cancel_nowait(),
            cancel_sent_at=self.clock(),
            onset_at=onset_at,
            decided_at=decided_at,
            yielded_at=y.pause.silent_at if y is not None and y.utt is utt else None,
            stop=stop,
            after_onset_ms=1000.0 * max(0, heard_now - heard_at_onset) / out.sample_rate + stop.fade_ms,
            stale_before=stale_before,
        )
        self._ready.clear()
        task = asyncio.create_task(self._complete(cut), name=f"streamvox-bargein-{utt.id}")
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _complete(self, cut: _Cut) -> None:
        ctx = cut.utt.context
        client = ctx.client
        # 4. the ack, bounded: the client times out after its cancel_ack_timeout_s and reconnects
        result: CancelResult | None = None
        try:
            result = await asyncio.wait_for(
                asyncio.shield(cut.cancel), client.cancel_ack_timeout_s + self.options.ack_grace_s
            )
        except TimeoutError:
            log.error("barge-in: cancel of %s neither acked nor timed out; giving up", ctx.context_id)
        except Exception as exc:  # the connection broke in a way the client did not translate
            log.warning("barge-in: cancel of %s failed: %s", ctx.context_id, exc)
        ready_at = self.clock()
        outcome = self._outcome(cut, result)
        rec = BargeInRecord(
            index=len(self.records),
            utterance_id=cut.utt.id,
            context_id=ctx.context_id,
            outcome=outcome,
            acked=outcome in ("acked", "finished"),
            onset_at=cut.onset_at,
            decided_at=cut.decided_at,
            yielded_at=cut.yielded_at,
            handled_at=cut.stop.at,
            silent_at=cut.stop.silent_at,
            cancel_sent_at=cut.cancel_sent_at,
            ready_at=ready_at,
            cancel_to_ack_ms=1000.0 * (result.latency_s if result is not None else ready_at - cut.cancel_sent_at),
            fade_ms=cut.stop.fade_ms,
            sink_dropped_ms=cut.stop.sink_dropped_ms,
            jitter_dropped_ms=cut.stop.jitter_dropped_ms,
            frames_dropped_client=ctx.dropped_after_cancel,
            frames_dropped_local=cut.utt.frames_refused,
            frames_dropped_server=result.frames_dropped_server if result is not None else 0,
            audio_after_onset_ms=cut.after_onset_ms,
            stale_frames_played=self.output.stale_frames_played - cut.stale_before,
        )
        self.records.append(rec)
        self.metrics.observe(rec)
        # 5. only now is the pipeline clean for the next reply
        self._ready.set()
        self._emit(rec)

    @staticmethod
    def _outcome(cut: _Cut, result: CancelResult | None) -> Outcome:
        ctx_id = cut.utt.context.context_id
        timeout = cut.utt.context.client.cancel_ack_timeout_s
        if result is not None and result.acked and cut.connected:
            # a context the server had finished needs no cancel there: acked at once, locally
            return "finished" if cut.finished_on_server else "acked"
        if cut.connected and result is not None and result.latency_s >= timeout * 0.99:
            log.warning(
                "barge-in: no cancel ack for %s within %.2f s; the client dropped the connection and "
                "reconnects in the background",
                ctx_id,
                timeout,
            )
            return "timeout"
        log.warning(
            "barge-in: connection lost while cancelling %s; the caller already hears silence, the next turn reconnects",
            ctx_id,
        )
        return "lost"

    def _ignore(self, reason: IgnoredReason, onset_at: float, utterance_id: int | None) -> None:
        ev = BargeInIgnored(reason, onset_at, self.clock(), utterance_id)
        self.ignored.append(ev)
        self.metrics.ignored.labels(reason).inc()
        self._emit(ev)

    def _emit(self, ev: BargeInEvent) -> None:
        if self.events.full():  # bounded: the oldest event goes, the newest is kept
            with contextlib.suppress(asyncio.QueueEmpty):
                self.events.get_nowait()
        self.events.put_nowait(ev)
        for cb in self._listeners:
            try:
                cb(ev)
            except Exception:
                log.exception("barge-in listener failed")
