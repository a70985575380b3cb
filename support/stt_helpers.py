"""Audio as the demo's STT receives it: a VAD segment's padding and a WebRTC Opus round trip.

Shared by the STT tests and ``scripts/stt_latency.py`` (the speech / noise verdict bench).
"""

from __future__ import annotations

import numpy as np


def vad_like(audio: np.ndarray, seed: int) -> np.ndarray:
    """What a VAD segment looks like to the STT: pre-roll, the sound, 0.5 s of trailing silence,
    over a -54 dBFS noise floor (a quiet room through a microphone)."""
    x = np.concatenate([np.zeros(4800, np.float32), audio, np.zeros(8000, np.float32)])
    return x + (0.002 * np.random.default_rng(seed).standard_normal(x.size)).astype(np.float32)


def opus_round_trip(x16: np.ndarray, bitrate: int = 32000) -> np.ndarray:
    """``x16`` (16 kHz) through Opus at 48 kHz and back, in 20 ms packets, as a browser's mic
    reaches the agent over WebRTC (PyAV's libopus, which aiortc uses)."""
    import fractions

    import av
    import soxr

    pcm = (np.clip(soxr.resample(x16, 16000, 48000), -1.0, 1.0) * 32767).astype(np.int16)
    enc = av.CodecContext.create("libopus", "w")
    enc.sample_rate, enc.layout, enc.format, enc.bit_rate = 48000, "mono", "s16", bitrate
    enc.time_base = fractions.Fraction(1, 48000)
    dec = av.CodecContext.create("opus", "r")
    dec.sample_rate, dec.layout = 48000, "mono"
    out = []
    for i in range(0, len(pcm) - 959, 960):
        frame = av.AudioFrame.from_ndarray(pcm[None, i : i + 960], format="s16", layout="mono")
        frame.sample_rate, frame.pts = 48000, i
        for packet in enc.encode(frame):
            out += [d.to_ndarray().reshape(-1) for d in dec.decode(packet)]
    y = np.concatenate(out).astype(np.float32)
    return soxr.resample(y / 32768 if np.abs(y).max() > 2 else y, 48000, 16000).astype(np.float32)
