"""The two ways a caller reaches the agent, as the agent's STT receives them (16 kHz float32).

* the page: the browser's microphone through WebRTC, Opus at 48 kHz and back
  (``support.stt_helpers.opus_round_trip``: PyAV's libopus, which aiortc uses);
* the phone: a Twilio media stream, 8 kHz μ-law, which Pipecat's serializer decodes with
  ``audioop.ulaw2lin`` and resamples to the pipeline's rate.

And the VAD segments a Pipecat agent cuts from them: ``SegmentedSTTService`` keeps the last
second before Silero's start, ends at its stop and pads half a second of silence, so a
mid-thought pause may split a turn into several transcripts.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable

import numpy as np

RATE = 16000
PHONE_RATE = 8000
PATHS = ("clean", "page", "phone")


def _audioop():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import audioop
    return audioop


def to_mulaw(x16: np.ndarray) -> bytes:
    """``x16`` (float32, 16 kHz) as a phone line carries it: 8 kHz G.711 μ-law bytes (what a Twilio
    media stream's payloads hold)."""
    import soxr

    x8 = soxr.resample(x16, RATE, PHONE_RATE)
    return _audioop().lin2ulaw((np.clip(x8, -1.0, 32767 / 32768) * 32768).astype("<i2").tobytes(), 2)


def phone_path(x16: np.ndarray) -> np.ndarray:
    """``x16`` (float32, 16 kHz) down to 8 kHz, through G.711 μ-law and back up to 16 kHz."""
    import soxr

    back = np.frombuffer(_audioop().ulaw2lin(to_mulaw(x16), 2), "<i2").astype(np.float32) / 32768.0
    return soxr.resample(back, PHONE_RATE, RATE).astype(np.float32)


def page_path(x16: np.ndarray) -> np.ndarray:
    """``x16`` (float32, 16 kHz) through a browser's WebRTC uplink: Opus at 48 kHz, back at 16 kHz."""
    from support.stt_helpers import opus_round_trip

    y = opus_round_trip(x16)
    return np.pad(y, (0, max(0, x16.size - y.size)))[: x16.size]  # Opus keeps whole 20 ms packets


def through(path: str) -> Callable[[np.ndarray], np.ndarray]:
    """The function of a path's name: ``"page"``, ``"phone"`` or ``"clean"`` (the audio as it is:
    what the caller's own microphone gave, before any codec)."""
    if path == "clean":
        return lambda x16: x16
    if path == "page":
        return page_path
    if path == "phone":
        return phone_path
    raise ValueError(f"no path {path!r}; paths: {', '.join(PATHS)}")


def vad_segments(
    x16: np.ndarray, *, stop_secs: float = 0.2, pre_s: float = 1.0, pad_s: float = 0.5
) -> list[np.ndarray]:
    """The segments Pipecat's segmented STT would transcribe: Silero VAD (the demo's default
    parameters but ``stop_secs``) over 20 ms chunks; each segment from ``pre_s`` before the VAD reports the
    start (not before the previous segment's end) to its stop, plus ``pad_s`` of silence.
    Runs its own event loop (Pipecat's VAD runs the model in an executor)."""
    return asyncio.run(_vad_segments(x16, stop_secs, pre_s, pad_s))


async def _vad_segments(x16: np.ndarray, stop_secs: float, pre_s: float, pad_s: float) -> list[np.ndarray]:
    from pipecat.audio.vad.silero import SileroVADAnalyzer
    from pipecat.audio.vad.vad_analyzer import VADParams, VADState

    vad = SileroVADAnalyzer(sample_rate=RATE, params=VADParams(stop_secs=stop_secs))
    vad.set_sample_rate(RATE)
    pcm = (np.clip(x16, -1.0, 32767 / 32768) * 32768).astype("<i2").tobytes()
    chunk = 320 * 2
    pad = np.zeros(int(pad_s * RATE), np.float32)
    segments, start, floor, speaking = [], 0, 0, False
    for off in range(0, len(pcm) - chunk + 1, chunk):
        state = await vad.analyze_audio(pcm[off : off + chunk])
        end = (off + chunk) // 2
        if state == VADState.SPEAKING and not speaking:
            speaking, start = True, max(floor, end - int(pre_s * RATE))
        elif state == VADState.QUIET and speaking:
            speaking, floor = False, end
            segments.append(np.concatenate([x16[start:end], pad]))
    if speaking:  # the clip ended mid-speech: what a caller hanging up leaves
        segments.append(np.concatenate([x16[start:], pad]))
    await vad.cleanup()
    return segments
