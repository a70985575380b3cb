"""Pipecat's Whisper service on ``pipelines.stt``: a shared model and turn-sized decoding.

Pipecat's ``WhisperSTTService`` queues each VAD segment when the VAD stops and transcribes it in
the background; the decode changes here (see ``pipelines.stt`` for why and how), and every decode
ends with a :class:`SegmentTranscribedFrame`, words or none.

Why that frame: a turn whose last segment brings no words (a cough, a word Whisper drops, an echo
transcript dropped on the way) used to be closed by the user aggregator's stop timeout, a fixed
guess at how long a decode takes. Too short, and a slow decode (the 30 s window on a loaded
machine: over 4 s on CI's two cores) lost its words to an empty turn; long enough, and every cough
was seconds of dead air. The stop strategy (``pipelines.pipecat_turns``) now knows when the decode
is done instead of guessing.

``line="phone"`` (``pipelines.stt.short_window_verdict``) takes a caller's unsure words from the
short window instead of waiting seconds for the full one; it applies only to segments with no bot
audio in them. Under the bot a speakerphone's echo residue is speech-like, and the lenient rule
took its garbled words for a caller's ("I love it.", answered): there the wideband rule stands.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import numpy as np
from loguru import logger
from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    DataFrame,
    ErrorFrame,
    Frame,
    TranscriptionFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.whisper.stt import WhisperSTTService
from pipecat.utils.time import time_now_iso8601

from pipelines.stt import DecodeOptions, shared_whisper, transcribe


@dataclass
class SegmentTranscribedFrame(DataFrame):
    """One VAD segment's decode is over; its ``TranscriptionFrame``, if it had words, came just before.

    A data frame, so it stays behind that transcript on the way down. ``queued``: segments still
    waiting for their decode (a turn with more to come is not over).
    """

    queued: int = 0


# after Pipecat's BotStoppedSpeakingFrame (itself 0.35 s after the last audio written), how long the
# bot's echo may still reach the caller's microphone (the phone's buffers, the echo path, the room)
ECHO_TAIL_S = 0.4


class LocalWhisperSTTService(WhisperSTTService):
    """Pipecat's Whisper service with a shared model and turn-sized decoding: the short encoder
    window by default, or faster-whisper's own path with ``decode`` options."""

    def __init__(self, *, decode: DecodeOptions | None = None, line: str = "wideband", **kwargs) -> None:
        self._decode = decode
        self.line = line  # "phone" on a telephone call: pipelines.stt.short_window_verdict
        self._bot_since: float | None = None  # the bot speaking since (monotonic; None: silent)
        self._bot_spans: deque[tuple[float, float]] = deque(maxlen=64)  # its recent speech, (start, end)
        self._speech_since: float | None = None  # the VAD start of the segment being spoken
        self._segments: deque[tuple[float, float]] = deque()  # each queued segment's VAD (start, stop)
        super().__init__(**kwargs)

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        if isinstance(frame, BotStartedSpeakingFrame) and self._bot_since is None:
            self._bot_since = time.monotonic()
        elif isinstance(frame, BotStoppedSpeakingFrame) and self._bot_since is not None:
            self._bot_spans.append((self._bot_since, time.monotonic()))
            self._bot_since = None
        elif isinstance(frame, VADUserStartedSpeakingFrame):
            self._speech_since = time.monotonic() - (frame.start_secs or 0.0)
        elif isinstance(frame, VADUserStoppedSpeakingFrame) and self.is_usable:
            now = time.monotonic()  # the base queues the segment just below
            self._segments.append((self._speech_since or now, now - (frame.stop_secs or 0.0)))
        await super().process_frame(frame, direction)

    def bot_in(self, start: float, end: float) -> bool:
        """Whether the bot's audio (or its echo's tail) overlaps ``start``-``end`` (monotonic)."""
        if self._bot_since is not None and self._bot_since < end:
            return True
        return any(s < end and e + ECHO_TAIL_S > start for s, e in self._bot_spans)

    def next_segment(self) -> tuple[str, bool]:
        """For the segment just taken off the queue: its rule (``line``, or wideband where the bot's
        audio overlaps the caller's speech in it, from its VAD start to its stop) and that overlap."""
        now = time.monotonic()
        start, end = self._segments.popleft() if self._segments else (now, now)
        bot = self.bot_in(start, end)
        return ("wideband" if bot else self.line), bot

    def _load(self) -> None:
        self._model = shared_whisper(str(self._settings.model))

    async def run_stt(self, audio: bytes) -> AsyncGenerator[Frame, None]:
        line, bot = self.next_segment()
        try:
            async for frame in self._decode_segment(audio, line, bot):
                yield frame
        except Exception as exc:  # the segment is lost, not the call: the turn still learns it is over
            logger.exception(f"{self}: transcription failed")
            yield ErrorFrame(f"transcription failed: {exc!r}")
        yield SegmentTranscribedFrame(queued=self._segment_queue.qsize())

    async def _decode_segment(self, audio: bytes, line: str, bot: bool) -> AsyncGenerator[Frame, None]:
        if not self._model:
            yield ErrorFrame("Whisper model not available")
            return
        await self.start_processing_metrics()
        samples = np.frombuffer(audio, dtype=np.int16).astype(np.float32) / 32768.0
        language = self._settings.language
        language = str(language) if isinstance(language, str) else "en"
        threshold = self._settings.no_speech_prob
        trace: list[str] = []
        heard: dict[str, float] = {}
        text = await asyncio.to_thread(
            transcribe,
            self._model,
            samples,
            language=language,
            options=self._decode,
            no_speech_threshold=threshold if isinstance(threshold, float) else None,
            trace=trace,
            line=line,
            info=heard,
        )
        await self.stop_processing_metrics()
        logger.debug(f"{self}: {samples.size / 16000:.2f} s of speech, {line} rule -> {text!r} ({'; '.join(trace)})")
        if text:
            # how sure the decoder was of the words (the end of turn may weigh garbled words by it), and
            # whether the bot's audio overlapped them (only then can they be its echo: agent.pipecat_echo)
            result = {"bot_audio": bot}
            if "text_logprob" in heard:
                result["text_logprob"] = heard["text_logprob"]
            yield TranscriptionFrame(text, self._user_id, time_now_iso8601(), language, result=result)
