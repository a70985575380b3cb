"""Output formats: per-stream resampling and encoding of float audio.

Resampling is stateful (soxr's streaming resampler) so that frame boundaries leave no clicks:
a stream resampled frame by frame equals the whole signal resampled at once. Mu-law (G.711) is
what phone networks carry at 8 kHz; we encode it here rather than depend on ``audioop``, which
is gone from Python 3.13.
"""

from __future__ import annotations

import struct

import numpy as np

from .protocol import MULAW, PCM_S16LE, WAV


class StreamEncoder:
    """Float32 mono at the voice's rate in, bytes in the client's format out."""

    def __init__(self, *, in_rate: int, out_rate: int, encoding: str) -> None:
        if encoding not in (PCM_S16LE, MULAW, WAV):
            raise ValueError(f"unknown encoding {encoding!r}")
        self.in_rate, self.out_rate, self.encoding = in_rate, out_rate, encoding
        self._resampler = None
        if in_rate != out_rate:
            import soxr

            self._resampler = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality="HQ")

    def encode(self, samples: np.ndarray, *, last: bool = False) -> bytes:
        x = np.asarray(samples, dtype=np.float32)
        if self._resampler is not None:
            x = self._resampler.resample_chunk(x, last=last)
        if self.encoding == MULAW:
            return mulaw_encode(x)
        return float_to_pcm16(x)

    def bytes_per_sample(self) -> int:
        return 1 if self.encoding == MULAW else 2


def float_to_pcm16(x: np.ndarray) -> bytes:
    return (np.clip(x, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def pcm16_to_float(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


_MU = 255.0


def mulaw_encode(x: np.ndarray) -> bytes:
    """G.711 mu-law, as phone networks (and Twilio media streams) expect it."""
    pcm = np.clip(np.asarray(x, dtype=np.float32), -1.0, 1.0) * 32767.0
    pcm = pcm.astype(np.int32)
    sign = np.where(pcm < 0, 0x80, 0x00)
    mag = np.minimum(np.abs(pcm), 32635) + 0x84
    exponent = np.floor(np.log2(mag)).astype(np.int32) - 7
    exponent = np.clip(exponent, 0, 7)
    mantissa = (mag >> (exponent + 3)) & 0x0F
    byte = ~(sign | (exponent << 4) | mantissa) & 0xFF
    return byte.astype(np.uint8).tobytes()


def mulaw_decode(data: bytes) -> np.ndarray:
    """Inverse of :func:`mulaw_encode` (float32 in [-1, 1])."""
    b = ~np.frombuffer(data, dtype=np.uint8).astype(np.int32) & 0xFF
    sign = b & 0x80
    exponent = (b >> 4) & 0x07
    mantissa = b & 0x0F
    mag = ((mantissa << 3) + 0x84) << exponent
    pcm = np.where(sign != 0, 0x84 - mag, mag - 0x84)
    return pcm.astype(np.float32) / 32768.0


def wav_header(sample_rate: int, *, bits: int = 16, channels: int = 1, data_bytes: int | None = None) -> bytes:
    """A WAV header; with ``data_bytes=None`` the sizes say 'unknown length' (streaming)."""
    unknown = 0xFFFFFFFF
    data_len = unknown if data_bytes is None else data_bytes
    riff_len = unknown if data_bytes is None else 36 + data_bytes
    block = channels * bits // 8
    return (
        b"RIFF"
        + struct.pack("<I", riff_len)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<IHHIIHH", 16, 1, channels, sample_rate, sample_rate * block, block, bits)
        + b"data"
        + struct.pack("<I", data_len)
    )
