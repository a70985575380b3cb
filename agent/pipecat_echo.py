"""The agent's echo canceller (:mod:`agent.runtime.echo`) in a Pipecat pipeline: three small processors.

    canceller = PipecatEcho()
    Pipeline([transport.input(), canceller.cleaner(), stt, canceller.transcripts(), pair.user(), llm, tts,
              YieldGate(...), transport.output(), canceller.reference(), pair.assistant()])

* :meth:`PipecatEcho.reference` sits just after ``transport.output()``, which passes each
  ``OutputAudioRawFrame`` on once it has written it: so the frame goes to the canceller's far end
  with the time it left (after the audio sent before it, which the far end's player still
  plays). Not before the output: there a frame's time is when it was queued, and a busy event
  loop writes behind the queue, more and more (on a loaded phone call, 1 s behind after 2 s of
  greeting), so the echo came back later than the canceller's whole delay range and passed.
  An ``InterruptionFrame`` makes the transport drop what it had queued (and a phone's player its
  buffer): the far end is truncated there. The words of ``TTSTextFrame``s (word-timed, the output
  passes them on with their audio) are kept a few seconds for the transcript check.
* :meth:`PipecatEcho.cleaner` sits just after ``transport.input()``: each ``InputAudioRawFrame``'s
  audio is replaced by the cancelled audio, so Pipecat's VAD (in the user aggregator), the
  YieldGate's own VAD and the STT all read the caller without the bot.
* :meth:`PipecatEcho.transcripts` sits just after the STT: a ``TranscriptionFrame`` that only
  repeats words the bot just played is dropped (and logged), so even an echo that got through does
  not become a turn the LLM answers. Not when the STT says the bot's audio did not overlap the
  segment (``result["bot_audio"]`` False, as ``pipelines.pipecat_stt`` marks it): a caller who
  answers "Where would you like to go today?" with "I would like to go." repeats the bot's words, and
  that was dropped as echo.

Upstream frames and everything else pass untouched. One :class:`PipecatEcho` per call.

The canceller's work runs on a thread of the call's own (``thread=True``, the default), in the
order the frames came: every call's frames share one event loop, and the canceller was a third of
its samples at four phone calls (AEC3 itself most of that; it releases the GIL, so the second
core runs it while the loop moves the other frames on: docs/BENCHMARKS.md, "Calls at once").
The cleaner awaits each frame's cleaned audio before passing it on, so everything downstream
(the VADs, the YieldGate's margin check, the STT) sees what it saw before, in the same order.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

from loguru import logger
from pipecat.frames.frames import (
    Frame,
    InputAudioRawFrame,
    InterruptionFrame,
    OutputAudioRawFrame,
    TranscriptionFrame,
    TTSTextFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from .runtime.echo import RATE, SEGMENT_S, EchoCanceller, echo_transcript, residue_transcript

__all__ = ["PipecatEcho"]

PLAYED_WORDS_S = 8.0  # how far back a transcript is compared with the bot's words (delay + STT time)


class PipecatEcho:
    """One call's canceller and the three processors that feed and use it."""

    def __init__(self, canceller: EchoCanceller | None = None, *, clock=time.monotonic, thread: bool = True) -> None:
        self.canceller = canceller or EchoCanceller(clock=clock)
        self._clock = clock
        self._play_end = 0.0  # when the audio handed to the transport so far has played out
        self._words: deque[tuple[float, str]] = deque()  # (played at, text)
        self.dropped_transcripts: list[str] = []
        # one worker: the far end's audio, its truncations and the caller's frames reach the
        # canceller in the order the pipeline handed them on (module docstring)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="echo") if thread else None
        self._closed = False

    def close(self) -> None:
        """The call is over: its worker thread ends (what is still queued is dropped), and what the
        canceller saw is logged once (the delays it adopted: how much the echo path moved)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        if not self._closed:
            self._closed = True
            if self.canceller.stats.far_frames:
                logger.info(f"echo canceller: {self.summary()}")

    def summary(self) -> str:
        """One line of the call's canceller figures (the benchmark scripts read it from the log)."""
        st = self.canceller.stats
        moves = " ".join(f"{t:.1f}s:{ms:.0f}" for t, ms, _ in st.delay_history)
        return (
            f"frames {st.frames}, with the bot's echo {st.far_frames}, muted {st.muted_frames} (late echo "
            f"{st.late_frames}, lost echo {st.lost_frames}), double talk "
            f"{st.talk_frames}; delays adopted {st.delay_updates} [{moves}] ms (first ones refused "
            f"{st.false_firsts}); ERLE {_fmt(st.erle_db)} dB; "
            f"transcripts dropped as echo {len(self.dropped_transcripts)}"
        )

    def _later(self, fn, /, *args, **kwargs) -> None:
        """Run ``fn`` on the canceller's thread after what is queued there (inline once closed)."""
        if self._pool is None:
            fn(*args, **kwargs)
            return
        self._pool.submit(fn, *args, **kwargs).add_done_callback(_log_failure)

    def reference(self) -> FrameProcessor:
        return _Tap(self, name="EchoReference")

    def cleaner(self) -> FrameProcessor:
        return _Tap(self, name="EchoCleaner")

    def transcripts(self) -> FrameProcessor:
        return _Tap(self, name="EchoTranscripts")

    # ---------------------------------------------------------------- what the taps do

    def played(self, frame: OutputAudioRawFrame) -> None:
        now = self._clock()
        start = max(now, self._play_end)
        seconds = len(frame.audio) / (2 * frame.num_channels * frame.sample_rate)
        self._play_end = start + seconds
        self._later(self.canceller.far, _mono(frame.audio, frame.num_channels), frame.sample_rate, t=start)

    def located(self) -> bool:
        """Whether the canceller has found the bot's echo in the caller's audio on this call."""
        return self.canceller.delay.delay is not None

    def surely_caller(self, seconds: float) -> bool:
        """Whether the last ``seconds`` of the caller's audio stood clear of what the bot's echo can
        leave (``SURE_DB`` above the residue the gate expects, or no echo possible): a VAD run in it
        is the caller, not echo residue (the YieldGate's ``caller_sure``)."""
        return self.canceller.surely_caller(seconds)

    def interrupted(self) -> None:
        now = self._clock()
        self._later(self.canceller.truncate_far, t=now)
        self._play_end = now

    def spoken(self, text: str) -> None:
        now = self._clock()
        self._words.append((max(now, self._play_end), text))
        while self._words and self._words[0][0] < now - PLAYED_WORDS_S:
            self._words.popleft()

    async def clean(self, frame: InputAudioRawFrame) -> None:
        """Replace the frame's audio with the cancelled audio (on the canceller's thread, awaited)."""
        near = functools.partial(
            self.canceller.near, _mono(frame.audio, frame.num_channels), frame.sample_rate, t=self._clock()
        )
        pool = self._pool
        frame.audio = near() if pool is None else await asyncio.get_running_loop().run_in_executor(pool, near)
        frame.sample_rate, frame.num_channels = RATE, 1
        frame.num_frames = len(frame.audio) // 2

    def is_echo(self, text: str, bot_audio: bool | None = None) -> bool:
        """Whether ``text`` only repeats what the bot just played; never for a segment the STT says the
        bot's audio did not overlap (``bot_audio`` False; None: not known, the words decide). Under the
        bot (``bot_audio`` True) garbled words count too where the audio never stood clear of the
        echo's residue (:func:`~agent.runtime.echo.residue_transcript`)."""
        if bot_audio is False:
            return False
        now = self._clock()
        played = " ".join(t for at, t in self._words if at >= now - PLAYED_WORDS_S)
        if echo_transcript(text, played):
            self.dropped_transcripts.append(text)
            logger.info(f"echo: dropped a transcript that repeats the bot's own words: {text!r}")
            return True
        if bot_audio and residue_transcript(text, played, margin := self.canceller.caller_margin_db(SEGMENT_S)):
            self.dropped_transcripts.append(text)
            logger.info(f"echo: dropped a transcript of the echo's residue ({margin:.0f} dB above it): {text!r}")
            return True
        return False


class _Tap(FrameProcessor):
    """One of the three places (by ``name``): reference before the output, cleaner after the input,
    transcripts after the STT."""

    def __init__(self, echo: PipecatEcho, *, name: str) -> None:
        super().__init__(name=name)
        self._echo = echo
        self._role = name

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction is FrameDirection.DOWNSTREAM:
            if self._role == "EchoReference":
                if isinstance(frame, OutputAudioRawFrame):
                    self._echo.played(frame)
                elif isinstance(frame, InterruptionFrame):
                    self._echo.interrupted()
                elif isinstance(frame, TTSTextFrame):
                    self._echo.spoken(frame.text)
            elif self._role == "EchoCleaner" and isinstance(frame, InputAudioRawFrame):
                await self._echo.clean(frame)
            elif self._role == "EchoTranscripts" and isinstance(frame, TranscriptionFrame):
                result = frame.result if isinstance(frame.result, dict) else {}
                if self._echo.is_echo(frame.text, result.get("bot_audio")):
                    return
        await self.push_frame(frame, direction)

    async def cleanup(self) -> None:
        await super().cleanup()
        self._echo.close()  # the pipeline is over (each of the three taps says so; once is enough)


def _log_failure(future: Future) -> None:
    if not future.cancelled() and future.exception() is not None:
        logger.error(f"echo canceller: {future.exception()!r}")


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def _mono(pcm: bytes, channels: int) -> bytes:
    if channels == 1:
        return pcm
    import numpy as np

    return np.frombuffer(pcm, np.int16).reshape(-1, channels).mean(axis=1).astype(np.int16).tobytes()
