"""The toy engine: pure compute, a sine per segment (it imports its scheduler's types, as every
engine here does)."""

from __future__ import annotations

import time

import numpy as np

from tts_service.core.engine import Engine, VoiceInfo

from .scheduler import ToyPlan, ToyResult

SAMPLE_RATE = 16000
SECONDS_PER_CHAR = 0.01


def tone_seconds(text: str) -> float:
    """How long the toy engine's audio for one segment ``text`` is."""
    return len(text.strip()) * SECONDS_PER_CHAR


class ToyEngine(Engine):
    def __init__(self, *, pitch_hz: float = 440.0) -> None:
        self.voices = {"tone": pitch_hz, "low": pitch_hz / 2}
        self.default_voice = "tone"

    @property
    def sample_rate(self) -> int:
        return SAMPLE_RATE

    def describe_voices(self) -> list[VoiceInfo]:
        return [VoiceInfo(name, SAMPLE_RATE, "sine") for name in self.voices]

    def render(self, text: str, voice: str) -> np.ndarray:
        n = round(tone_seconds(text) * SAMPLE_RATE)
        t = np.arange(n, dtype=np.float64) / SAMPLE_RATE
        return (0.3 * np.sin(2 * np.pi * self.voices[voice] * t)).astype(np.float32)

    def run(self, plan: ToyPlan) -> ToyResult:
        t0 = time.perf_counter()
        return ToyResult({sid: self.render(text, voice) for sid, text, voice in plan.jobs}, time.perf_counter() - t0)
