"""The LiveKit worker's STT (``pipelines.livekit_agent.WhisperSTT``) decodes as the Pipecat agent does.

Real: Whisper tiny.en, espeak-ng callers. The worker used faster-whisper's plain 30 s window, with no
no-speech verdict; the Pipecat path's short window gives the same words in about a third of the time
(docs/BENCHMARKS.md, "Echo": the LiveKit worker's decode).
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import soxr

from pipelines.livekit_agent import NO_SPEECH_THRESHOLD
from pipelines.stt import default_model_path, shared_whisper


def _say(text: str) -> np.ndarray:
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (make test installs it)")
    wav = subprocess.run(["espeak-ng", "-v", "en-us+f3", "-s", "160", "--stdout", text], capture_output=True).stdout
    return soxr.resample(np.frombuffer(wav[44:], np.int16).astype(np.float32) / 32768.0, 22050, 16000)


def test_the_worker_shares_the_processs_model_and_hears_a_caller(whisper_stt) -> None:
    assert whisper_stt._model is shared_whisper(default_model_path())  # one model per process, not one per STT
    text = whisper_stt.transcribe(_say("Could you send me the invoice for last month?").astype(np.float32))
    assert "invoice" in text.lower() and "month" in text.lower(), text


def test_the_worker_asks_whispers_no_speech_verdict(whisper_stt, monkeypatch) -> None:
    """What Whisper rates as probably not speech is dropped there as on the Pipecat path (the verdict's
    own tests: tests/pipelines/test_stt.py); the worker must ask for it."""
    import pipelines.stt

    asked: dict = {}
    real = pipelines.stt.transcribe

    def spy(model, audio, **kwargs):
        asked.update(kwargs)
        return real(model, audio, **kwargs)

    monkeypatch.setattr(pipelines.stt, "transcribe", spy)
    whisper_stt.transcribe(np.zeros(16000, np.float32))
    assert asked["no_speech_threshold"] == NO_SPEECH_THRESHOLD == 0.4
