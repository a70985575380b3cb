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
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import numpy as np
from loguru import logger
from pipecat.frames.frames import DataFrame, ErrorFrame, Frame, TranscriptionFrame
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


class LocalWhisperSTTService(WhisperSTTService):
    """Pipecat's Whisper service with a shared model and turn-sized decoding: the short encoder
    window by default, or faster-whisper's own path with ``decode`` options."""

    def __init__(self, *, decode: DecodeOptions | None = None, line: str = "wideband", **kwargs) -> None:
        self._decode = decode
        self.line = line  # "phone" on a telephone call: pipelines.stt.short_window_verdict
        super().__init__(**kwargs)

    def _load(self) -> None:
        self._model = shared_whisper(str(self._settings.model))

    async def run_stt(self, audio: bytes) -> AsyncGenerator[Frame, None]:
        try:
            async for frame in self._decode_segment(audio):
                yield frame
        except Exception as exc:  # the segment is lost, not the call: the turn still learns it is over
            logger.exception(f"{self}: transcription failed")
            yield ErrorFrame(f"transcription failed: {exc!r}")
        yield SegmentTranscribedFrame(queued=self._segment_queue.qsize())

    async def _decode_segment(self, audio: bytes) -> AsyncGenerator[Frame, None]:
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
            line=self.line,
            info=heard,
        )
        await self.stop_processing_metrics()
        logger.debug(f"{self}: {samples.size / 16000:.2f} s of speech -> {text!r} ({'; '.join(trace)})")
        if text:
            # how sure the decoder was of the words: the end of turn may weigh garbled words by it
            result = {"text_logprob": heard["text_logprob"]} if "text_logprob" in heard else None
            yield TranscriptionFrame(text, self._user_id, time_now_iso8601(), language, result=result)
