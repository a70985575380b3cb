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

**Early decode.** Pipecat queues the segment when the VAD stops, ``stop_secs`` of silence after
the last word, and only then does the decode start: the turn's transcript, and the speculative
reply that waits for it, come a decode after the VAD stop. When the caller has been quiet for
``early_after_s`` (far below the segment's own loudness: silence, not a soft syllable) and the bot
is silent, the audio so far is decoded at once; if the segment the VAD then queues is that audio
plus nothing but such silence, its decode is this one, already under way or done. A caller who
goes on voids it (counted in ``early``: decodes used and wasted). Off with ``early_after_s=None``.
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
    InputAudioRawFrame,
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
EARLY_AFTER_S = 0.1  # this much silence after speech starts an early decode (the VAD stops at ~0.2 s)
QUIET_BELOW_PEAK_DB = 30.0  # a frame this far under the segment's loudest is silence for the early decode


def level_db(pcm: bytes) -> float:
    """A 16-bit PCM frame's RMS level in dBFS (-120 for digital silence)."""
    x = np.frombuffer(pcm, dtype=np.int16).astype(np.float32)
    rms = float(np.sqrt(np.mean(x * x))) / 32768.0 if x.size else 0.0
    return 20.0 * np.log10(max(rms, 1e-6))


@dataclass
class EarlyDecode:
    """A decode started before the VAD's stop: the buffer it read, its rule, and whether it still stands."""

    pcm: bytes
    line: str
    task: asyncio.Task
    valid: bool = True


class LocalWhisperSTTService(WhisperSTTService):
    """Pipecat's Whisper service with a shared model and turn-sized decoding: the short encoder
    window by default, or faster-whisper's own path with ``decode`` options."""

    def __init__(
        self,
        *,
        decode: DecodeOptions | None = None,
        line: str = "wideband",
        early_after_s: float | None = EARLY_AFTER_S,
        **kwargs,
    ) -> None:
        self._decode = decode
        self.early_after_s = early_after_s
        self.early = {"used": 0, "wasted": 0}  # early decodes whose words the turn took / that were voided
        self._early: EarlyDecode | None = None
        self._peak_db = -120.0  # the segment's loudest frame so far
        self._quiet_s = 0.0  # silence since its last loud frame
        self.line = line  # "phone" on a telephone call: pipelines.stt.short_window_verdict
        self._bot_since: float | None = None  # the bot speaking since (monotonic; None: silent)
        self._bot_spans: deque[tuple[float, float]] = deque(maxlen=64)  # its recent speech, (start, end)
        self._speech_since: float | None = None  # the VAD start of the segment being spoken
        # each queued segment's VAD (start, stop) and the early decode of its audio, bound when the VAD
        # stopped: a caller who starts again before the segment's decode begins does not void it
        self._segments: deque[tuple[float, float, EarlyDecode | None]] = deque()
        super().__init__(**kwargs)

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        if isinstance(frame, BotStartedSpeakingFrame) and self._bot_since is None:
            self._bot_since = time.monotonic()
        elif isinstance(frame, BotStoppedSpeakingFrame) and self._bot_since is not None:
            self._bot_spans.append((self._bot_since, time.monotonic()))
            self._bot_since = None
        elif isinstance(frame, VADUserStartedSpeakingFrame):
            self._speech_since = time.monotonic() - (frame.start_secs or 0.0)
            self._peak_db, self._quiet_s = -120.0, 0.0
            self._void_early()
        elif isinstance(frame, VADUserStoppedSpeakingFrame) and self.is_usable:
            now = time.monotonic()  # the base queues the segment just below
            early, self._early = self._early, None
            self._segments.append((self._speech_since or now, now - (frame.stop_secs or 0.0), early))
        await super().process_frame(frame, direction)

    def bot_in(self, start: float, end: float) -> bool:
        """Whether the bot's audio (or its echo's tail) overlaps ``start``-``end`` (monotonic)."""
        if self._bot_since is not None and self._bot_since < end:
            return True
        return any(s < end and e + ECHO_TAIL_S > start for s, e in self._bot_spans)

    def next_segment(self) -> tuple[str, bool]:
        """For the segment just taken off the queue: its rule (``line``, or wideband where the bot's
        audio overlaps the caller's speech in it, from its VAD start to its stop) and that overlap."""
        line, bot, _ = self._next_segment()
        return line, bot

    def _next_segment(self) -> tuple[str, bool, EarlyDecode | None]:
        """:meth:`next_segment`, and the segment's early decode (None: none was started)."""
        now = time.monotonic()
        start, end, early = self._segments.popleft() if self._segments else (now, now, None)
        bot = self.bot_in(start, end)
        return ("wideband" if bot else self.line), bot, early

    async def process_audio_frame(self, frame: InputAudioRawFrame, direction: FrameDirection) -> None:
        await super().process_audio_frame(frame, direction)
        if self.early_after_s is None or not self._user_speaking:
            return
        level = level_db(frame.audio)
        self._peak_db = max(self._peak_db, level)
        if level > self._peak_db - QUIET_BELOW_PEAK_DB:
            self._quiet_s = 0.0
            self._void_early()  # the caller goes on: the early decode lacks these words
            return
        self._quiet_s += len(frame.audio) / (2 * frame.sample_rate * frame.num_channels)
        standing = self._early is not None and self._early.valid  # a voided one finishes unread in its thread
        if self._quiet_s >= self.early_after_s and not standing and self.is_usable and self._model:
            now = time.monotonic()
            if not self.bot_in(self._speech_since or now, now):  # under the bot the rule is another
                pcm = bytes(self._audio_buffer)
                line = self.line
                task = self.create_task(self._transcribe(pcm + self._trailing_silence(), line), f"{self}::early")
                self._early = EarlyDecode(pcm, line, task)

    def _void_early(self) -> None:
        if self._early is not None and self._early.valid:
            self._early.valid = False
            self.early["wasted"] += 1

    def _take_early(self, early: EarlyDecode | None, audio: bytes, line: str, bot: bool) -> asyncio.Task | None:
        """The segment's early decode if it stands for the segment: the same buffer, followed only by
        silence (no loud frame voided it), under the same rule, and no bot audio in the segment."""
        if early is None:
            return None
        if early.valid and not bot and early.line == line and audio.startswith(early.pcm):
            self.early["used"] += 1
            return early.task
        if early.valid:
            self.early["wasted"] += 1
        return None

    async def cleanup(self) -> None:
        if self.early["used"] or self.early["wasted"]:  # what the early decode saved and cost this call
            logger.info(f"{self}: early decodes: {self.early['used']} used, {self.early['wasted']} voided")
        await super().cleanup()

    def _load(self) -> None:
        self._model = shared_whisper(str(self._settings.model))

    async def run_stt(self, audio: bytes) -> AsyncGenerator[Frame, None]:
        line, bot, early = self._next_segment()
        try:
            async for frame in self._decode_segment(audio, line, bot, early):
                yield frame
        except Exception as exc:  # the segment is lost, not the call: the turn still learns it is over
            logger.exception(f"{self}: transcription failed")
            yield ErrorFrame(f"transcription failed: {exc!r}")
        yield SegmentTranscribedFrame(queued=self._segment_queue.qsize())

    @property
    def _language(self) -> str:
        language = self._settings.language
        return str(language) if isinstance(language, str) else "en"

    async def _transcribe(self, audio: bytes, line: str) -> tuple[str, dict[str, float], list[str]]:
        """``audio``'s words under ``line``'s rule, in a worker thread; with how sure the decoder was
        and its trace."""
        samples = np.frombuffer(audio, dtype=np.int16).astype(np.float32) / 32768.0
        threshold = self._settings.no_speech_prob
        trace: list[str] = [f"{samples.size / 16000:.2f} s"]
        heard: dict[str, float] = {}
        text = await asyncio.to_thread(
            transcribe,
            self._model,
            samples,
            language=self._language,
            options=self._decode,
            no_speech_threshold=threshold if isinstance(threshold, float) else None,
            trace=trace,
            line=line,
            info=heard,
        )
        return text, heard, trace

    async def _decode_segment(
        self, audio: bytes, line: str, bot: bool, early: EarlyDecode | None = None
    ) -> AsyncGenerator[Frame, None]:
        if not self._model:
            yield ErrorFrame("Whisper model not available")
            return
        await self.start_processing_metrics()
        task = self._take_early(early, audio, line, bot)
        if task is not None:
            text, heard, trace = await task
            trace.append("decoded before the VAD's stop")
        else:
            text, heard, trace = await self._transcribe(audio, line)
        await self.stop_processing_metrics()
        logger.debug(f"{self}: {line} rule -> {text!r} ({'; '.join(trace)})")
        if text:
            # how sure the decoder was of the words (the end of turn may weigh garbled words by it), and
            # whether the bot's audio overlapped them (only then can they be its echo: agent.pipecat_echo)
            result = {"bot_audio": bot, "decoded_early": task is not None}
            if "text_logprob" in heard:
                result["text_logprob"] = heard["text_logprob"]
            yield TranscriptionFrame(text, self._user_id, time_now_iso8601(), self._language, result=result)
