"""SpeechOutput: a TTS context -> adaptive jitter buffer -> playback sink, paced in real time.

Why a separate piece: the barge-in controller must be able to silence the bot *now* and know
exactly what was heard. So everything between the socket and the sink lives in one object that
owns the jitter buffer, the playout clock and the bookkeeping:

* a **feeder** task per utterance reads the context's frames and pushes them into the
  :class:`~agent.runtime.jitter.AdaptiveJitterBuffer`; once an utterance is stopped it refuses (and
  counts) every frame it still sees, so a stopped utterance can never reach the sink again;
* one **playout** task ticks every ``block_ms`` on the clock and keeps the sink fed with up to
  ``sink_lead_ms`` of audio: the sink's own queue stays shallow, so a flush drops little and the
  jitter buffer (not the sink) absorbs the network's jitter. A frame arriving at an idle buffer
  wakes it at once, so the first frame of a reply does not wait for the next tick;
* :meth:`SpeechOutput.stop` is synchronous: flush the sink, flush the jitter buffer, then (soft
  stop) write a ``fade_ms`` raised-cosine fade of the audio that was due next, instead of a hard
  cut that clicks. The fade is the only bot audio written after the flush; ``silent_at`` is when
  it ends;
* every frame pushed is tagged with its utterance, so ``frames_played`` counts frames handed to
  the sink in full, and ``stale_frames_played`` counts frames of an already stopped utterance
  that reached the sink after its flush: **it must stay 0** (a regression guard, kept by
  construction: the flush clears the tags with the buffer and the feeder refuses late frames).

Yield, then confirm: :meth:`SpeechOutput.pause` is the first half of a barge-in. It silences the
sink as fast as :meth:`stop` (flush, then a short ``pause_fade_ms`` fade-out) but *keeps the
place*: the samples the flush took back from the sink are held, the jitter buffer keeps what it
has and keeps receiving, and :meth:`resume` plays on from the first sample not yet heard (with a
matching fade-in), so a cough costs the caller a short gap, never a lost or repeated word. A
confirmed barge-in calls :meth:`stop` during the pause: the held samples and the jitter buffer
are dropped, no second fade is written (the bot is already quiet), and ``heard_ms`` /
``heard_words`` end at the pause point.

Lost connection mid-utterance (the policy the barge-in controller documents too): the utterance
is **abandoned, never resumed or restarted**. The feeder sees ``TTSConnectionError``, the output
stops at once with the soft fade (status ``LOST``), and :attr:`Utterance.heard_words` /
:attr:`Utterance.heard_ms` report how far the caller got, so the application can decide what to
say next. Nothing already heard is replayed: the next turn is a new context with new text, and
``TTSClient.open`` reconnects on its way.

Audio is mono little-endian int16 at ``sample_rate`` (the contexts are opened at that rate).
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tts_service import protocol as P
from tts_service.aio import wait_set
from tts_service.client import AudioFrame, TTSClient, TTSConnectionError, TTSContext, TTSError, Word, WordTimings

from .jitter import AdaptiveJitterBuffer, JitterState
from .playback import PlaybackSink

__all__ = ["PauseResult", "SpeechOutput", "SpeechStats", "StopResult", "Utterance", "UtteranceStatus"]

log = logging.getLogger(__name__)

# how much of the recent playout is kept to build a fade from (must cover the sink's queue)
_RECENT_S = 2.0
# (time, samples heard) history for "audio played after onset"; 20 ms ticks -> 10 s
_HISTORY_LEN = 500


class UtteranceStatus(enum.Enum):
    SPEAKING = "speaking"  # context live or audio not yet played out
    FINISHED = "finished"  # every sample was played
    INTERRUPTED = "interrupted"  # stopped (barge-in): the rest was dropped
    LOST = "lost"  # the connection was lost mid-utterance: abandoned, never resumed
    FAILED = "failed"  # the server reported an error for the context


@dataclass(eq=False)
class Utterance:
    """One reply being spoken: its context, its counters and its outcome."""

    id: int
    context: TTSContext = field(repr=False)
    allow_interruptions: bool
    sample_rate: int
    started_at: float  # clock time the reply was requested (before ``open``)
    status: UtteranceStatus = UtteranceStatus.SPEAKING
    first_frame_at: float | None = None  # first audio frame received
    first_play_at: float | None = None  # first sample written to the sink
    stopped_at: float | None = None
    ended_at: float | None = None  # finished, stopped or abandoned
    frames_in: int = 0  # frames pushed into the jitter buffer
    frames_played: int = 0  # frames handed to the sink in full
    frames_refused: int = 0  # frames that arrived after the stop and were dropped here
    samples_in: int = 0
    samples_played: int = 0  # written to the sink
    samples_heard: int | None = None  # played by the sink (known once it ended)
    words: list[Word] = field(default_factory=list, repr=False)
    error: BaseException | None = None
    _feed_done: bool = field(default=False, repr=False)
    _done: asyncio.Future | None = field(default=None, repr=False)
    _playing: asyncio.Future | None = field(default=None, repr=False)

    @property
    def active(self) -> bool:
        return self.status is UtteranceStatus.SPEAKING

    @property
    def ttfb_s(self) -> float | None:
        """Request -> first audio frame received."""
        return None if self.first_frame_at is None else self.first_frame_at - self.started_at

    @property
    def first_play_s(self) -> float | None:
        """Request -> first sample handed to the sink."""
        return None if self.first_play_at is None else self.first_play_at - self.started_at

    @property
    def heard_ms(self) -> float:
        samples = self.samples_heard if self.samples_heard is not None else self.samples_played
        return 1000.0 * samples / self.sample_rate

    @property
    def heard_words(self) -> list[Word]:
        """Words whose start the caller heard (from the server's word timings)."""
        heard_s = self.heard_ms / 1000.0
        return [w for w in self.words if w.start < heard_s]

    async def wait(self, timeout: float | None = None) -> UtteranceStatus:
        """Until the utterance finished, was stopped or abandoned; returns its status."""
        assert self._done is not None
        await asyncio.wait_for(asyncio.shield(self._done), timeout)
        return self.status

    async def wait_playing(self, timeout: float | None = None) -> float:
        """Until its first sample reached the sink (or it ended); returns that clock time."""
        assert self._playing is not None and self._done is not None
        await asyncio.wait_for(asyncio.wait([self._playing, self._done], return_when=asyncio.FIRST_COMPLETED), timeout)
        if self.first_play_at is None:
            raise RuntimeError(f"utterance {self.id} ended ({self.status.value}) before any audio played")
        return self.first_play_at


@dataclass(frozen=True, slots=True)
class StopResult:
    """What :meth:`SpeechOutput.stop` did. Times are on the output's clock."""

    at: float  # when the flush was done (the old queue played nothing after this)
    silent_at: float  # when the sink is silent (end of the fade; ``at`` for a hard cut)
    fade_ms: float  # length of the fade actually written (0 when nothing was playing)
    sink_dropped_ms: float
    jitter_dropped_ms: float
    utterance: Utterance | None


@dataclass(frozen=True, slots=True)
class PauseResult:
    """What :meth:`SpeechOutput.pause` did. Times are on the output's clock."""

    at: float  # when the sink was flushed
    silent_at: float  # end of the fade-out: the bot is quiet from here
    fade_ms: float
    held_ms: float  # audio taken back from the sink, played first on resume
    utterance: Utterance | None


@dataclass(frozen=True, slots=True)
class SpeechStats:
    frames_in: int
    frames_played: int
    frames_refused: int
    stale_frames_played: int
    underruns: int
    jitter_target_ms: float
    jitter_depth_ms: float
    sink_queued_ms: float
    stops: int
    pauses: int = 0
    resumes: int = 0


class SpeechOutput:
    """Plays TTS contexts through a jitter buffer into a :class:`PlaybackSink`, one at a time.

    Use as ``async with SpeechOutput(sink, sample_rate=16000) as out:`` (or ``await out.start()``
    / ``await out.aclose()``), then ``utt = await out.say(client, text)`` or
    ``out.play(context)`` for a context you feed yourself (LLM tokens).
    """

    def __init__(
        self,
        sink: PlaybackSink,
        *,
        sample_rate: int,
        jitter: AdaptiveJitterBuffer | None = None,
        block_ms: float = 20.0,
        sink_lead_ms: float = 60.0,
        fade_ms: float = 20.0,
        pause_fade_ms: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if sample_rate <= 0:
            raise ValueError(f"sample_rate must be > 0, got {sample_rate}")
        if block_ms <= 0 or sink_lead_ms < block_ms:
            raise ValueError(f"need block_ms > 0 and sink_lead_ms >= block_ms, got {block_ms}, {sink_lead_ms}")
        if not 0 <= fade_ms <= 100:
            raise ValueError(f"fade_ms must be in [0, 100] (10-30 ms avoids a click), got {fade_ms}")
        if not 0 <= pause_fade_ms <= 50:
            raise ValueError(f"pause_fade_ms must be in [0, 50] (a pause must be quick), got {pause_fade_ms}")
        self.sink = sink
        self.sample_rate = sample_rate
        self.jitter = jitter if jitter is not None else AdaptiveJitterBuffer(sample_rate=sample_rate, clock=clock)
        if self.jitter.sample_rate != sample_rate:
            raise ValueError(f"jitter buffer rate {self.jitter.sample_rate} != sample_rate {sample_rate}")
        self.block_ms = block_ms
        self.sink_lead_ms = sink_lead_ms
        self.fade_ms = fade_ms
        self.pause_fade_ms = pause_fade_ms
        self.clock = clock
        self._block = max(1, round(block_ms * sample_rate / 1000))
        self._ids = itertools.count(1)
        self._current: Utterance | None = None
        # one [utterance, samples not yet written] per frame in the jitter buffer, same order
        self._tags: deque[list] = deque()
        self._recent = np.zeros(0, dtype=np.int16)  # the last samples written to the sink
        self._recent_max = int(_RECENT_S * sample_rate)
        self._written = 0  # samples written to the sink and not flushed, all utterances
        self._history: deque[tuple[float, int]] = deque(maxlen=_HISTORY_LEN)  # (time, samples heard)
        self._wake = asyncio.Event()
        self._playout: asyncio.Task | None = None
        self._feeders: set[asyncio.Task] = set()
        self.frames_in = 0
        self.frames_played = 0
        self.frames_refused = 0
        self.stale_frames_played = 0
        self.stops = 0
        self.pauses = 0
        self.resumes = 0
        self.last_stop: StopResult | None = None
        self._pause: PauseResult | None = None  # set while paused
        self._held = np.zeros(0, dtype=np.int16)  # taken back from the sink by the pause
        self._fade_in = np.zeros(0, dtype=np.int32)  # the rest of the resume's ramp, in 1/32768

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._playout is None:
            self._playout = asyncio.create_task(self._playout_loop(), name="streamvox-playout")

    async def aclose(self) -> None:
        """Stop playing (hard cut), cancel the tasks. Contexts are not cancelled here."""
        if self._current is not None and self._current.active:
            self.stop(fade=False)
        tasks = [t for t in (self._playout, *self._feeders) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._playout = None

    async def __aenter__(self) -> SpeechOutput:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ utterances

    @property
    def current(self) -> Utterance | None:
        """The latest utterance (possibly already ended)."""
        return self._current

    @property
    def speaking(self) -> bool:
        """True from :meth:`play` (for :meth:`say`: once its context is open) until the last sample
        played or the utterance was stopped."""
        return self._current is not None and self._current.active

    async def say(
        self,
        client: TTSClient,
        text: str,
        *,
        allow_interruptions: bool = True,
        voice: str | None = None,
    ) -> Utterance:
        """Open a context at this output's rate, send ``text``, end it, and play it."""
        started = self.clock()
        ctx = await client.open(voice=voice, sample_rate=self.sample_rate, encoding=P.PCM_S16LE)
        await ctx.send_text(text)
        await ctx.end()
        return self.play(ctx, allow_interruptions=allow_interruptions, started_at=started)

    def play(
        self,
        context: TTSContext,
        *,
        allow_interruptions: bool = True,
        started_at: float | None = None,
    ) -> Utterance:
        """Play an open context (you send its text). One utterance at a time."""
        if self._playout is None:
            raise RuntimeError("SpeechOutput is not running; use `async with` or await .start() first")
        if self.speaking:
            raise RuntimeError("an utterance is still playing; await utterance.wait() or stop() it first")
        if context.sample_rate != self.sample_rate or context.encoding != P.PCM_S16LE:
            raise ValueError(
                f"context delivers {context.encoding} at {context.sample_rate} Hz; open it with "
                f"sample_rate={self.sample_rate}, encoding={P.PCM_S16LE!r}"
            )
        loop = asyncio.get_running_loop()
        utt = Utterance(
            id=next(self._ids),
            context=context,
            allow_interruptions=allow_interruptions,
            sample_rate=self.sample_rate,
            started_at=self.clock() if started_at is None else started_at,
            _done=loop.create_future(),
            _playing=loop.create_future(),
        )
        self._current = utt
        task = asyncio.create_task(self._feed(utt), name=f"streamvox-feed-{utt.id}")
        self._feeders.add(task)
        task.add_done_callback(self._feeders.discard)
        return utt

    def stop(self, *, fade: bool = True, status: UtteranceStatus = UtteranceStatus.INTERRUPTED) -> StopResult:
        """Silence now: flush the sink and the jitter buffer, then write the soft-stop fade.

        Synchronous on purpose (no await between the decision and the flush). Cancelling the
        context on the server is the caller's job (see :class:`agent.runtime.bargein.BargeIn`).
        """
        now = self.clock()
        utt = self._current
        paused, self._pause = self._pause, None
        self._held = np.zeros(0, dtype=np.int16)  # never heard: not part of the utterance any more
        self._fade_in = np.zeros(0, dtype=np.int32)
        # while paused the bot is already quiet (or fading): a second fade would be audio after silence
        fade_n = round(self.fade_ms * self.sample_rate / 1000) if fade and paused is None else 0
        sink_ms = float(self.sink.flush())
        queued = self._samples(sink_ms)  # what the flush dropped (the device plays on until then)
        upcoming = self._upcoming(fade_n, queued) if fade_n else np.zeros(0, dtype=np.int16)
        jitter_ms = self.jitter.flush()
        flushed_at = self.clock()  # the sink played nothing of the old queue after this
        self._written -= queued  # written but never played: not part of what was heard
        self._tags.clear()
        self._recent = np.zeros(0, dtype=np.int16)
        self.stops += 1
        silent_at = flushed_at  # while paused: quiet since the pause, silent for good from here
        if upcoming.size:
            # raised-cosine 1 -> 0 over the audio that was due next: continuous with what was heard
            ramp = 0.5 * (1.0 + np.cos(np.linspace(0.0, math.pi, upcoming.size + 1)[1:]))
            faded = np.round(upcoming.astype(np.float64) * ramp).astype(np.int16)
            self.sink.write(faded.tobytes())
            self._written += faded.size
            # read after the write: the sink started the fade no later than this
            silent_at = self.clock() + faded.size / self.sample_rate
        if utt is not None and utt.active:
            utt.samples_heard = max(0, utt.samples_played - queued)
            self._end(utt, status, now)
            utt.stopped_at = now
        self.last_stop = StopResult(
            at=flushed_at,
            silent_at=silent_at,
            fade_ms=1000.0 * upcoming.size / self.sample_rate,
            sink_dropped_ms=sink_ms,
            jitter_dropped_ms=jitter_ms,
            utterance=utt,
        )
        return self.last_stop

    @property
    def paused(self) -> bool:
        return self._pause is not None

    def pause(self) -> PauseResult:
        """Yield: silence now (flush + ``pause_fade_ms`` fade-out) but keep the place.

        Synchronous, like :meth:`stop`. Calling it again while paused returns the same result.
        The samples the flush took back are held for :meth:`resume`; the faded ones count as heard.
        """
        if self._pause is not None:
            return self._pause
        utt = self._current
        queued = self._samples(float(self.sink.flush()))  # exactly what was dropped: resumed from there
        flushed_at = self.clock()
        start = max(0, self._recent.size - queued)
        held = self._recent[start:].copy()
        self._recent = self._recent[:start]
        self._written -= queued
        fade_n = min(held.size, round(self.pause_fade_ms * self.sample_rate / 1000))
        silent_at = flushed_at
        if fade_n:
            ramp = 0.5 * (1.0 + np.cos(np.linspace(0.0, math.pi, fade_n + 1)[1:]))
            self.sink.write(np.round(held[:fade_n].astype(np.float64) * ramp).astype(np.int16).tobytes())
            self._written += fade_n
            self._recent = np.concatenate((self._recent, held[:fade_n]))
            silent_at = self.clock() + fade_n / self.sample_rate
        self._held = held[fade_n:]
        if utt is not None and utt.active:
            utt.samples_played -= self._held.size  # written, never heard (yet)
        self.pauses += 1
        self._pause = PauseResult(
            at=flushed_at,
            silent_at=silent_at,
            fade_ms=1000.0 * fade_n / self.sample_rate,
            held_ms=1000.0 * self._held.size / self.sample_rate,
            utterance=utt,
        )
        return self._pause

    def resume(self) -> float | None:
        """Play on from the first unheard sample (fade-in over ``pause_fade_ms``); returns the
        clock time playback resumed, or None when not paused."""
        if self._pause is None:
            return None
        self._pause = None
        held, self._held = self._held, np.zeros(0, dtype=np.int16)
        utt = self._current
        now = self.clock()
        # the first samples after the gap, held or from the jitter buffer, ramp up from silence
        self._fade_in = np.round(
            0.5
            * (1.0 - np.cos(np.linspace(0.0, math.pi, round(self.pause_fade_ms * self.sample_rate / 1000) + 1)[1:]))
            * 32768
        ).astype(np.int32)
        if utt is not None and utt.active and held.size:
            self._sink_write(held)
            self._written += held.size
            self._recent = np.concatenate((self._recent, held))[-self._recent_max :]
            utt.samples_played += held.size
        self.resumes += 1
        self._wake.set()
        return now

    # ------------------------------------------------------------------ figures

    def heard_samples_at(self, t: float) -> int:
        """Samples the sink had played by clock time ``t`` (interpolated between playout ticks)."""
        hist = self._history
        if not hist or t >= hist[-1][0]:
            return self._heard_samples()
        if t <= hist[0][0]:
            return hist[0][1]
        times = [h[0] for h in hist]
        i = int(np.searchsorted(times, t))
        (t0, s0), (t1, s1) = hist[i - 1], hist[i]
        return round(s0 + (s1 - s0) * (t - t0) / (t1 - t0)) if t1 > t0 else s1

    def stats(self) -> SpeechStats:
        return SpeechStats(
            frames_in=self.frames_in,
            frames_played=self.frames_played,
            frames_refused=self.frames_refused,
            stale_frames_played=self.stale_frames_played,
            underruns=self.jitter.underruns,
            jitter_target_ms=self.jitter.target_ms,
            jitter_depth_ms=self.jitter.depth_ms,
            sink_queued_ms=self.sink.queued_ms,
            stops=self.stops,
            pauses=self.pauses,
            resumes=self.resumes,
        )

    # ------------------------------------------------------------------ internals

    async def _feed(self, utt: Utterance) -> None:
        try:
            async for item in utt.context:
                if not utt.active:  # stopped while this frame was on its way: never play it
                    if isinstance(item, AudioFrame):
                        utt.frames_refused += 1
                        self.frames_refused += 1
                    continue
                if isinstance(item, AudioFrame):
                    self._push(utt, item)
                elif isinstance(item, WordTimings):
                    utt.words.extend(item.words)
        except TTSConnectionError as exc:
            if utt.active:
                log.warning("connection lost mid-utterance %d (%s): abandoning it, not resuming", utt.id, exc)
                utt.error = exc
                self.stop(fade=True, status=UtteranceStatus.LOST)
            return
        except TTSError as exc:
            if utt.active:
                log.warning("TTS error in utterance %d: %s", utt.id, exc)
                utt.error = exc
                self.stop(fade=True, status=UtteranceStatus.FAILED)
            return
        if utt.active:
            utt._feed_done = True
            self.jitter.end_of_stream()
            self._wake.set()

    def _push(self, utt: Utterance, frame: AudioFrame) -> None:
        samples = np.frombuffer(frame.pcm, dtype="<i2")
        if samples.size == 0:
            return
        idle = self.jitter.state in (JitterState.IDLE, JitterState.PRIMING, JitterState.REBUFFERING)
        self.jitter.push(samples)
        self._tags.append([utt, samples.size])
        utt.frames_in += 1
        utt.samples_in += samples.size
        self.frames_in += 1
        if utt.first_frame_at is None:
            utt.first_frame_at = self.clock()
        if idle:
            self._wake.set()  # a buffer that was waiting may be able to start now

    async def _playout_loop(self) -> None:
        block_s = self.block_ms / 1000.0
        while True:
            try:
                self._pump()
            except Exception:  # a broken sink must not kill playout silently
                log.exception("playout failed; stopping the current utterance")
                if self._current is not None and self._current.active:
                    self._current.error = RuntimeError("playout failed")
                    self.stop(fade=False, status=UtteranceStatus.FAILED)
            self._wake.clear()
            await wait_set(self._wake, block_s)  # not wait_for: aclose() once waited forever for this task

    def _pump(self) -> None:
        now = self.clock()
        if self._pause is not None:  # yielding: the jitter buffer keeps its audio for resume()
            self._history.append((now, self._heard_samples()))
            return
        queued_ms = self.sink.queued_ms
        while queued_ms < self.sink_lead_ms and self.jitter.state is not JitterState.IDLE:
            before = self._jitter_samples()
            block, _underrun = self.jitter.pull(self._block, now)
            took = before - self._jitter_samples()
            if took <= 0:  # priming or rebuffering: nothing to write yet
                break
            self._write(block[:took], now)
            queued_ms += 1000.0 * took / self.sample_rate
        self._history.append((now, self._heard_samples()))
        utt = self._current
        if (
            utt is not None
            and utt.active
            and utt._feed_done
            and self.jitter.state is JitterState.IDLE
            and not self._tags
            and self.sink.queued_ms <= 0.0
        ):
            utt.samples_heard = utt.samples_played
            self._end(utt, UtteranceStatus.FINISHED, now)

    def _sink_write(self, samples: np.ndarray) -> None:
        """Write to the sink, applying what is left of a resume's fade-in."""
        ramp = self._fade_in
        if ramp.size:
            k = min(ramp.size, samples.size)
            samples = samples.copy()
            samples[:k] = (samples[:k].astype(np.int32) * ramp[:k]) // 32768
            self._fade_in = ramp[k:]
        self.sink.write(samples.tobytes())

    def _write(self, samples: np.ndarray, now: float) -> None:
        self._sink_write(samples)
        self._written += samples.size
        recent = np.concatenate((self._recent, samples))
        self._recent = recent[-self._recent_max :]
        left = samples.size
        while left and self._tags:
            tag = self._tags[0]
            utt: Utterance = tag[0]
            k = min(left, tag[1])
            tag[1] -= k
            left -= k
            utt.samples_played += k
            if utt.first_play_at is None:
                utt.first_play_at = now
                if utt._playing is not None and not utt._playing.done():
                    utt._playing.set_result(now)
            if tag[1] == 0:
                self._tags.popleft()
                utt.frames_played += 1
                self.frames_played += 1
                if not utt.active:  # cannot happen: stop() clears the tags with the buffer
                    self.stale_frames_played += 1
                    log.error("stale frame of stopped utterance %d reached the sink", utt.id)

    def _upcoming(self, n: int, queued: int) -> np.ndarray:
        """The next ``n`` samples the listener would have heard: sink queue, then jitter buffer."""
        start = max(0, self._recent.size - queued)
        out = self._recent[start : start + n]
        if out.size < n and self.jitter.state is JitterState.PLAYING:
            before = self._jitter_samples()
            more, _ = self.jitter.pull(n - out.size)
            out = np.concatenate((out, more[: before - self._jitter_samples()]))
        return out

    def _end(self, utt: Utterance, status: UtteranceStatus, now: float) -> None:
        utt.status = status
        utt.ended_at = now
        for fut in (utt._done, utt._playing):
            if fut is not None and not fut.done():
                fut.set_result(status)

    def _heard_samples(self) -> int:
        return self._written - self._samples(self.sink.queued_ms)

    def _jitter_samples(self) -> int:
        return self._samples(self.jitter.depth_ms)

    def _samples(self, ms: float) -> int:
        return round(ms * self.sample_rate / 1000.0)
