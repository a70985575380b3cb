"""Yield, then confirm, for Pipecat: a processor placed just before ``transport.output()``.

Why a processor of ours: in Pipecat 1.14 the bot stops only on an ``InterruptionFrame``, which
follows the user turn start (``VADUserTurnStartStrategy`` on ``VADUserStartedSpeakingFrame``,
itself ``VADParams.start_secs`` = 0.2 s of speech above ``confidence`` 0.7 and ``min_volume``
0.6 after the onset). And by then the TTS service has handed the output transport everything
the server sent: streamvox paces ~400 ms ahead of real time, and the transport's audio queue
(which the interruption resets) holds all of it. :class:`YieldGate` does two things there:

* **paces** bot audio to the transport only ``lead_ms`` ahead of the clock (the rest waits here,
  in order with the text and control frames behind it, so word-timed ``TTSTextFrame``s still
  reach the assistant aggregator only as their audio is handed on);
* **yields**: at the caller's first speech window (its own Silero VAD on the
  ``InputAudioRawFrame``s that flow past, ``agent.runtime.vad.SileroVAD(report_onsets=True)``, or
  Pipecat's ``VADUserStartedSpeakingFrame`` if that comes first) it stops handing audio on, so
  the bot falls quiet within the ``lead_ms`` already downstream. The normal interruption
  confirms it: on ``InterruptionFrame`` the held audio and text are dropped (uninterruptible
  frames and control frames are kept) and the frame goes on to the transport. When no
  interruption comes - the VAD dropped the candidate (a cough), the caller stopped, or
  ``resume_after_ms`` of the caller's audio passed without a VAD confirming speech (audio time,
  not the clock: on a loaded machine the frames arrive late; ``hold_max_ms`` when a VAD did: a
  turn strategy such as min-words may wait for a transcript) - the gate **resumes** from the
  first frame it held back: nothing played twice, nothing lost, and the context gets only the
  words whose audio went out. After a word-long run that nothing confirmed (``word_ms``), it first
  waits ``lull_ms`` of the caller's silence: "Wait," and a breath before the rest of the sentence
  is one barge-in, not a pause, the bot talking on over the breath, and a second pause.
  (A first version resumed after ``resume_after_ms`` whatever the
  VAD said; in the WebRTC room test Pipecat's own VAD, with its ``min_volume``, sometimes fired
  later than that after ours, so the bot came back for a moment before the interruption; the
  runs: docs/BENCHMARKS.md, "Barge-in", in the record "Transport: audio downstream of a flush".)

**Words confirm** (``words_confirm``, a predicate asked at each pause; the demo's phone path with
``STREAMVOX_BARGE_IN_CONFIRM=words`` asks "has this call's echo canceller located the bot's echo?"):
on a speakerphone, what is left of the bot's echo can pass a VAD as speech, and Pipecat's VAD start
then interrupts the bot for it, and the empty turn that follows had the LLM ask a silent caller to
repeat. Measured both ways it trades: no residue cut the bot, but a caller talking over the echo
was heard later at the ear, so it is not the demo's default (docs/BENCHMARKS.md, "Echo").
Such a pause is confirmed by the caller's words instead: :meth:`YieldGate.start_strategy` replaces
Pipecat's ``VADUserTurnStartStrategy`` and lets a VAD start through only when the gate is not
waiting for words (Pipecat's ``TranscriptionUserTurnStartStrategy`` then starts the turn on the
transcript, whose interruption confirms the pause as usual), and :meth:`YieldGate.decodes`, a tap
after the STT, tells the gate when the segment's decode is over: with no words (the echo check
dropped them, or there were none) the gate resumes. The bot is silent at the ear from the onset
either way; what waits for the words is only the flush. The LiveKit worker does the same with
LiveKit's own false-interruption resume (``pipelines.livekit_agent``).

Figures: :attr:`YieldGate.yields` (one :class:`GateYield` per pause: onset, quiet, outcome)
and :attr:`YieldGate.downstream_ms` (audio handed on but not yet due, sampled at each pause:
what still plays after it).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from loguru import logger
from pipecat.frames.frames import (
    CancelFrame,
    DataFrame,
    EndFrame,
    Frame,
    InputAudioRawFrame,
    InterruptionFrame,
    OutputAudioRawFrame,
    StartFrame,
    SystemFrame,
    TranscriptionFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.turns.types import ProcessFrameResult
from pipecat.turns.user_start import VADUserTurnStartStrategy

from tts_service.aio import wait_set

from .runtime.vad import SileroVAD, VADParams

__all__ = ["GateYield", "YieldGate"]

Outcome = Literal["interrupted", "resumed"]


@dataclass(slots=True)
class GateYield:
    """One pause. Times are ``time.monotonic()``."""

    onset_at: float  # the caller's first speech window (estimated from the audio it came in)
    paused_at: float  # the gate stopped handing audio on
    quiet_at: float  # the audio already handed on ran out: the bot is quiet from here
    trigger: Literal["vad", "pipecat_vad"]
    outcome: Outcome | None = None
    ended_at: float | None = None
    dropped_ms: float = 0.0  # held audio dropped by the interruption
    by_words: bool = False  # confirmed by the caller's words, not by a VAD start (``words_confirm``)
    segment: bool = False  # Pipecat's VAD started a segment in this pause: its decode is awaited
    stopped_at: float | None = None  # Pipecat's VAD stop in this pause
    decoded_at: float | None = None  # the last segment decode that ended in this pause
    run_ms: float = 0.0  # the longest run of speech our VAD dropped in this pause (a cough, a word)
    breaths: int = 0  # times the pause was kept through the caller's silence after a word (``lull_ms``)

    @property
    def yield_ms(self) -> float:
        return 1000.0 * (self.quiet_at - self.onset_at)


class YieldGate(FrameProcessor):
    """Paces bot audio ``lead_ms`` ahead of the clock; pauses at the caller's speech onset.

    ``vad``: our Silero VAD on the caller audio passing by (``True``: one at the input rate,
    16 or 8 kHz); ``False`` to yield only on Pipecat's ``VADUserStartedSpeakingFrame``.
    ``words_confirm``: asked at each pause; when true the pause waits for the caller's words (the
    module docstring; use :meth:`start_strategy` and :meth:`decodes` with it): for the decode at
    most ``decode_wait_ms`` after Pipecat's VAD stop, and ``decode_max_ms`` for the interruption
    after a decode that brought words. A caller Pipecat's VAD hears for ``talk_ms`` after its start
    is a caller, words or not (:meth:`start_strategy` starts the turn): what AEC3 leaves of a
    caller talking over the echo can decode to nothing, and the bot must not talk on over them.
    ``lull_ms``: after a word-long run of speech (``word_ms`` or more) that no interruption followed,
    the pause waits this long of the caller's silence for more before it resumes (0: at once);
    ``caller_sure``, when given, is asked first with the run's seconds: False (what is left of a
    speakerphone's echo can make runs as long as a word) resumes at once, as for a cough.
    """

    def __init__(
        self,
        *,
        lead_ms: float = 80.0,
        resume_after_ms: float = 500.0,
        hold_max_ms: float = 2000.0,
        vad: SileroVAD | bool = True,
        words_confirm: Callable[[], bool] | None = None,
        talk_ms: float = 600.0,
        decode_wait_ms: float = 1000.0,
        decode_max_ms: float = 1500.0,
        words_max_ms: float = 15000.0,
        lull_ms: float = 600.0,
        word_ms: float = 120.0,
        caller_sure: Callable[[float], bool] | None = None,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        if lead_ms < 10.0:
            raise ValueError(f"lead_ms must be >= 10 (the transport writes 10 ms chunks), got {lead_ms}")
        if resume_after_ms <= 0 or hold_max_ms <= 0:
            raise ValueError(f"resume_after_ms and hold_max_ms must be > 0, got {resume_after_ms}, {hold_max_ms}")
        if lull_ms < 0 or word_ms < 0:
            raise ValueError(f"lull_ms and word_ms must be >= 0, got {lull_ms}, {word_ms}")
        self.lead_s = lead_ms / 1000.0
        self.resume_after_s = resume_after_ms / 1000.0
        self.hold_max_s = max(hold_max_ms, resume_after_ms) / 1000.0
        self.words_confirm = words_confirm
        self.talk_s = talk_ms / 1000.0
        self.decode_wait_s = decode_wait_ms / 1000.0
        self.decode_max_s = decode_max_ms / 1000.0
        self.words_max_s = words_max_ms / 1000.0
        self.lull_s = lull_ms / 1000.0
        self.word_s = word_ms / 1000.0
        self.caller_sure = caller_sure
        self._pipecat_speaking = False  # between Pipecat's VAD start and stop frames
        self._vad: SileroVAD | None = vad if isinstance(vad, SileroVAD) else None
        self._want_vad = vad is not False
        if self._vad is not None:
            self._vad.report_onsets = True
        self._held: deque[Frame] = deque()
        self._released_until = 0.0  # when the audio handed on so far has played out
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._pause: GateYield | None = None
        self._resume_timer: asyncio.TimerHandle | None = None
        self.yields: list[GateYield] = []
        self.downstream_ms: list[float] = []
        self._warned_rate = False
        self._fed = 0  # caller samples given to the VAD
        self._onset_s: float | None = None  # the pause's onset in the VAD's audio time (our VAD's pauses)
        self._window_s = self.resume_after_s  # how much caller audio from _onset_s before _window_over resumes
        self._listen_at = 0.0  # the clock at the pause's latest onset: hold_max_ms counts from here
        self._lull = False  # the pause waits out the caller's silence after a word
        self._run_onset_s = 0.0  # our VAD's latest onset, in its audio time

    # ------------------------------------------------------------------ state

    @property
    def paused(self) -> bool:
        return self._pause is not None

    @property
    def held_ms(self) -> float:
        return 1000.0 * sum(_duration(f) for f in self._held if isinstance(f, OutputAudioRawFrame))

    @property
    def awaiting_words(self) -> bool:
        """Paused, and this pause is confirmed by the caller's words (not by a VAD start)."""
        return self._pause is not None and self._pause.by_words

    def start_strategy(self) -> VADUserTurnStartStrategy:
        """Pipecat's VAD start, except while this gate waits for the caller's words."""
        return _VADStartUnlessAwaitingWords(self)

    def decodes(self, segment_done: type[Frame]) -> FrameProcessor:
        """A tap for just after the STT (after any check that drops transcripts): ``segment_done`` is
        the STT's frame for "this segment's decode is over" (with ``queued``: decodes still to come)."""
        return _DecodeTap(self, segment_done)

    def _bot_speaking(self, now: float) -> bool:
        return now < self._released_until or any(isinstance(f, OutputAudioRawFrame) for f in self._held)

    # ------------------------------------------------------------------ frames

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction is FrameDirection.UPSTREAM:
            await self.push_frame(frame, direction)
            return
        if isinstance(frame, StartFrame):
            await self.push_frame(frame, direction)
            self._task = self.create_task(self._release_loop(), "yield-gate-release")
        elif isinstance(frame, InputAudioRawFrame):
            await self.push_frame(frame, direction)
            self._run_vad(frame)
        elif isinstance(frame, VADUserStartedSpeakingFrame):
            await self.push_frame(frame, direction)
            self._pipecat_speaking = True
            if self._pause is not None:
                self._pause.segment = True  # Pipecat's STT decodes the segment this frame opens
                self._pause.decoded_at = None  # ... and its decode is the one awaited
                self._hold()  # Pipecat's VAD agrees: its turn strategies decide now
            else:
                self._yield(time.monotonic() - float(getattr(frame, "start_secs", 0.0) or 0.0), "pipecat_vad")
                if self._pause is not None and self._pause.by_words:
                    self._pause.segment = True
                    self._hold()
        elif isinstance(frame, VADUserStoppedSpeakingFrame):
            await self.push_frame(frame, direction)
            self._pipecat_speaking = False
            if self._pause is not None:
                self._pause.stopped_at = time.monotonic()
            if (self._vad is None or not self._vad.speaking) and not self._lull:
                word = self._vad is not None and self._sure(self._heard_s() - self._run_onset_s)
                self._speech_over(quiet_s=self._heard_s() if word else None)
        elif isinstance(frame, InterruptionFrame):
            self._interrupted()
            await self.push_frame(frame, direction)
        elif isinstance(frame, CancelFrame):
            await self._stop_task()
            await self.push_frame(frame, direction)
        elif isinstance(frame, SystemFrame):
            await self.push_frame(frame, direction)
        else:
            if isinstance(frame, EndFrame):
                self._resume()  # let everything drain before the end
            self._held.append(frame)
            self._wake.set()

    async def cleanup(self) -> None:
        await self._stop_task()
        await super().cleanup()

    async def _stop_task(self) -> None:
        self._cancel_timer()
        if self._task is not None:
            await self.cancel_task(self._task)
            self._task = None

    # ------------------------------------------------------------------ pacing

    async def _release_loop(self) -> None:
        while True:
            if not self._held or self._pause is not None:
                self._wake.clear()
                await self._wake.wait()
                continue
            frame = self._held[0]
            if isinstance(frame, OutputAudioRawFrame):
                now = time.monotonic()
                wait = self._released_until - self.lead_s - now
                if wait > 0:
                    self._wake.clear()  # a pause or an interruption may come meanwhile
                    await wait_set(self._wake, wait)
                    continue
                self._released_until = max(now, self._released_until) + _duration(frame)
            self._held.popleft()
            await self.push_frame(frame)
            if isinstance(frame, EndFrame):
                return

    # ------------------------------------------------------------------ yield, then confirm

    def _run_vad(self, frame: InputAudioRawFrame) -> None:
        if not self._want_vad or frame.num_channels != 1:
            return
        if self._vad is None:
            if frame.sample_rate not in (8000, 16000):
                if not self._warned_rate:
                    logger.warning(f"{self}: caller audio at {frame.sample_rate} Hz; yielding on Pipecat's VAD only")
                    self._warned_rate = True
                return
            self._vad = SileroVAD(VADParams(sample_rate=frame.sample_rate), report_onsets=True)
        if frame.sample_rate != self._vad.params.sample_rate:
            return
        arrived = time.monotonic()
        self._fed += len(frame.audio) // 2
        end_s = self._fed / frame.sample_rate  # the frame's last sample, in VAD audio time, arrived now
        for ev in self._vad.feed(frame.audio):
            if ev.kind == "onset":
                self._run_onset_s = ev.onset_s
                if self._lull:
                    self._listen(ev.onset_s)  # the caller goes on after a breath: the same pause
                else:
                    self._yield(arrived - max(0.0, end_s - ev.onset_s), "vad", onset_s=ev.onset_s)
            elif ev.kind == "speech_start":
                self._hold()  # real speech: wait for Pipecat's interruption, not the short window
            elif ev.kind == "onset_dropped":  # a cough, a blip of echo residue, or one short word
                run_s = ev.decided_s - ev.onset_s
                if self._pause is not None:
                    self._pause.run_ms = max(self._pause.run_ms, 1000.0 * run_s)
                # a blip after a word (the pause kept through a breath) is the caller's too
                word = run_s >= self.word_s and self._sure(self._heard_s() - ev.onset_s)
                word = word or (self._pause is not None and self._pause.breaths > 0)
                self._speech_over(quiet_s=ev.decided_s if word else None)
            else:  # speech_end: speech Pipecat did not take as a turn (yet)
                word = self._sure(self._heard_s() - self._run_onset_s)
                self._speech_over(quiet_s=ev.onset_s if word else None)

    def _yield(self, onset_at: float, trigger: Literal["vad", "pipecat_vad"], onset_s: float | None = None) -> None:
        """Pause at a caller's onset (``onset_s``: in our VAD's audio time, when it saw it)."""
        now = time.monotonic()
        if self._pause is not None or not self._bot_speaking(now):
            return
        head = next((f for f in self._held if isinstance(f, OutputAudioRawFrame)), None)
        if head is not None and not getattr(head, "interruptible", True):
            return
        downstream = max(0.0, self._released_until - now)
        self.downstream_ms.append(1000.0 * downstream)
        by_words = bool(self.words_confirm is not None and self.words_confirm())
        self._pause = GateYield(
            onset_at=min(onset_at, now), paused_at=now, quiet_at=now + downstream, trigger=trigger, by_words=by_words
        )
        self.yields.append(self._pause)
        self._listen_at, self._lull = now, False
        logger.debug(
            f"{self}: yield ({trigger}{', words confirm' if by_words else ''}), {1000 * downstream:.0f} ms "
            f"already downstream, {self.held_ms:.0f} ms held"
        )
        self._watch(onset_s, self.resume_after_s)
        self._wake.set()

    def _sure(self, seconds: float) -> bool:
        """The last ``seconds`` of the caller's audio were surely the caller (``caller_sure``; yes without it)."""
        return self.caller_sure is None or self.caller_sure(min(max(seconds, 0.05), 2.0))

    def _heard_s(self) -> float:
        """Caller audio our VAD has been given, in seconds: its clock."""
        return self._fed / self._vad.params.sample_rate if self._vad is not None else 0.0

    def _listen(self, onset_s: float) -> None:
        """A new onset while the pause waits out a breath: listen to it as to the first
        (``resume_after_ms`` of its audio for a VAD to confirm it, ``hold_max_ms`` from now)."""
        self._lull, self._listen_at = False, time.monotonic()
        self._watch(onset_s, self.resume_after_s)

    def _watch(self, from_s: float | None, window_s: float, wait_s: float | None = None) -> None:
        """Resume once ``window_s`` of the caller's audio from ``from_s`` (our VAD's audio time) has
        passed without a VAD confirming speech: first looked at after ``wait_s`` on the clock
        (``window_s`` by default), then :meth:`_window_over` judges it in audio time."""
        self._cancel_timer()
        self._onset_s, self._window_s = from_s, window_s
        delay = window_s if wait_s is None else wait_s
        self._resume_timer = asyncio.get_running_loop().call_later(delay, self._window_over)

    def _window_over(self) -> None:
        """The window passed on the clock (``resume_after_ms`` from an onset, ``lull_ms`` from the end
        of a word). Resume, unless the caller's audio since then has not reached our VAD yet: on a
        loaded machine the audio frames queue behind the event loop, the wall clock ran out before
        the VAD could confirm, and the bot came back for ~100 ms over a caller who was talking (a
        room test under load with 2 % uplink loss). The window is judged in the caller's audio time
        then, ``hold_max_ms`` at most."""
        pause, vad = self._pause, self._vad
        if pause is not None and vad is not None and self._onset_s is not None:
            heard_s = self._heard_s() - self._onset_s
            left_s = self._listen_at + self.hold_max_s - time.monotonic()
            if heard_s < self._window_s and left_s > 0:
                wait = min(left_s, max(0.02, self._window_s - heard_s))
                self._resume_timer = asyncio.get_running_loop().call_later(wait, self._window_over)
                return
        self._resume()

    def _hold(self) -> None:
        """Speech confirmed by a VAD: stay paused until the interruption, up to ``hold_max_ms`` (up to
        ``words_max_ms`` while a pause waits for words: the caller may talk on, then the decode)."""
        if self._pause is not None:
            self._cancel_timer()
            self._lull = False
            longest = self.words_max_s if self._pause.by_words else self.hold_max_s
            left = max(self._pause.paused_at, self._listen_at) + longest - time.monotonic()
            self._resume_timer = asyncio.get_running_loop().call_later(max(0.0, left), self._resume)

    def _speech_over(self, quiet_s: float | None = None) -> None:
        """The caller stopped (or the onset was dropped): resume, unless a segment's words are awaited
        or the caller said a word and may go on (``quiet_s``: when their silence began, in our VAD's
        audio time; None for a blip, which resumes at once).

        A caller who barges in with "Wait," and a breath before the rest says a word too short for
        any VAD to confirm (``min_speech_ms`` 200 ms, Pipecat's ``start_secs`` the same): resumed
        at once, the bot talked on through the breath and was stopped only by what came after. So
        after a word-long run the pause waits ``lull_ms`` of the caller's silence for more, and an
        onset in it continues the same pause (:meth:`_listen`)."""
        pause = self._pause
        if pause is not None and pause.by_words and pause.segment:
            # the segment's decode decides (segment_decoded), within decode_wait_ms of Pipecat's VAD stop:
            # a slow decode (Whisper's full window) must not be dead air; words it brings later still
            # start a turn, which interrupts
            if not self._pipecat_speaking and pause.decoded_at is None:
                self._cancel_timer()
                self._resume_timer = asyncio.get_running_loop().call_later(self.decode_wait_s, self._resume)
            return
        if pause is not None and quiet_s is not None and self.lull_s > 0:
            pause.breaths += 1
            self._lull = True
            self._watch(quiet_s, self.lull_s, wait_s=max(0.02, self.lull_s - (self._heard_s() - quiet_s)))
            return
        self._resume()

    def segment_decoded(self, words: bool, queued: int = 0) -> None:
        """A segment's decode is over (``words``: it brought words that went on to the turn). For a
        pause that waits for words: none, and nothing more coming, resumes; words keep it until the
        interruption their turn sends, ``decode_max_ms`` at most."""
        pause = self._pause
        if pause is None or not pause.by_words or not pause.segment:
            return
        pause.decoded_at = time.monotonic()
        if words:
            self._cancel_timer()
            self._resume_timer = asyncio.get_running_loop().call_later(self.decode_max_s, self._resume)
        elif queued == 0 and not self._pipecat_speaking and (self._vad is None or not self._vad.speaking):
            self._resume()

    def _resume(self) -> None:
        pause, self._pause = self._pause, None
        self._lull = False
        self._cancel_timer()
        if pause is None:
            return
        pause.outcome, pause.ended_at = "resumed", time.monotonic()
        logger.debug(f"{self}: resumed after {1000 * (pause.ended_at - pause.paused_at):.0f} ms (not confirmed)")
        self._released_until = max(self._released_until, pause.ended_at)
        self._wake.set()

    def _interrupted(self) -> None:
        """Confirmed: drop what is held (as the transport drops its queue), keep control frames."""
        dropped = 0.0
        kept: deque[Frame] = deque()
        for f in self._held:
            if isinstance(f, OutputAudioRawFrame) and getattr(f, "interruptible", True):
                dropped += _duration(f)
            elif not _is_data(f) or not getattr(f, "interruptible", True):
                kept.append(f)
        self._held = kept
        self._released_until = time.monotonic()  # the transport resets its queue too
        pause, self._pause = self._pause, None
        self._lull = False
        self._cancel_timer()
        if pause is not None:
            pause.outcome, pause.ended_at, pause.dropped_ms = "interrupted", time.monotonic(), 1000.0 * dropped
        self._wake.set()

    def _cancel_timer(self) -> None:
        if self._resume_timer is not None:
            self._resume_timer.cancel()
            self._resume_timer = None


def _duration(frame: OutputAudioRawFrame) -> float:
    return len(frame.audio) / (2 * frame.num_channels * frame.sample_rate)


def _is_data(frame: Frame) -> bool:
    return isinstance(frame, DataFrame)


class _VADStartUnlessAwaitingWords(VADUserTurnStartStrategy):
    """Pipecat's VAD start strategy, held while the gate waits for the caller's words: the transcript
    then starts the turn (``TranscriptionUserTurnStartStrategy``, next in the list), or the VAD
    segment going on for the gate's ``talk_ms`` does."""

    def __init__(self, gate: YieldGate, **kwargs) -> None:
        super().__init__(**kwargs)
        self._gate = gate
        self._talk: asyncio.Task | None = None

    async def process_frame(self, frame: Frame) -> ProcessFrameResult:
        if isinstance(frame, VADUserStartedSpeakingFrame) and self._gate.awaiting_words:
            logger.debug(f"{self}: a VAD start over the bot's echo; the caller's words or more speech start the turn")
            self._cancel_talk()
            self._talk = asyncio.get_running_loop().create_task(self._still_talking())
            return ProcessFrameResult.CONTINUE
        if isinstance(frame, VADUserStoppedSpeakingFrame):
            self._cancel_talk()
        return await super().process_frame(frame)

    async def _still_talking(self) -> None:
        await asyncio.sleep(self._gate.talk_s)
        self._talk = None
        if self._gate.awaiting_words:
            logger.debug(f"{self}: the caller talks on over the bot's echo: a turn, words or not")
            await self.trigger_user_turn_started()

    def _cancel_talk(self) -> None:
        if self._talk is not None:
            self._talk.cancel()
            self._talk = None

    async def cleanup(self) -> None:
        self._cancel_talk()
        await super().cleanup()


class _DecodeTap(FrameProcessor):
    """After the STT: whether each segment's decode brought words, told to the gate at its end."""

    def __init__(self, gate: YieldGate, segment_done: type[Frame]) -> None:
        super().__init__(name="YieldGateDecodes")
        self._gate = gate
        self._done = segment_done
        self._words = False

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction is FrameDirection.DOWNSTREAM:
            if isinstance(frame, TranscriptionFrame) and frame.text.strip():
                self._words = True
            elif isinstance(frame, self._done):
                words, self._words = self._words, False
                self._gate.segment_decoded(words, int(getattr(frame, "queued", 0) or 0))
        await self.push_frame(frame, direction)
