"""Pipecat's Whisper service on ``pipelines.stt``: a shared model and turn-sized decoding.

Pipecat's ``WhisperSTTService`` queues each VAD segment when the VAD stops and transcribes it in
the background; only the decode changes here (see ``pipelines.stt`` for why and how).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

import numpy as np
from loguru import logger
from pipecat.frames.frames import ErrorFrame, Frame, TranscriptionFrame
from pipecat.services.whisper.stt import WhisperSTTService
from pipecat.utils.time import time_now_iso8601

from pipelines.stt import DecodeOptions, shared_whisper, transcribe


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
