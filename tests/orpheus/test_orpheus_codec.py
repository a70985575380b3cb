"""Windowed SNAC decoding against a whole-segment decode.

Stated tolerance (left 3 / right 2 frames of context, the defaults): with the decoder's noise
injection switched off the windowed audio is within 1e-3 of the whole decode everywhere
(measured 2.5e-4 max, -72 dBFS, on the tiny config and 2.0e-4 on the real 24 kHz shapes) and
with right context 3 it is exact to float rounding (< 1e-5). With noise on (as served), the
windowed/whole difference is the seed-to-seed difference of two whole decodes: windowing adds
nothing audible on top of the noise the model injects by design.
"""

from __future__ import annotations

import numpy as np
import pytest
import snac.layers
import torch

from tts_service.orpheus.codec import WindowedCodec
from tts_service.orpheus.config import SAMPLES_PER_FRAME

TOLERANCE = 1e-3


@pytest.fixture
def no_noise(monkeypatch):
    monkeypatch.setattr(snac.layers.NoiseBlock, "forward", lambda self, x: x)


def frames(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 4096, size=(n, 7))


def test_windowed_decode_is_within_tolerance_of_whole_decode(tiny_snac, no_noise):
    f = frames(0, 23)
    codec = WindowedCodec(tiny_snac)
    whole = codec.decode_whole(f)
    streamed = codec.stream(f)
    assert len(streamed) == len(whole) == 23 * SAMPLES_PER_FRAME
    assert np.abs(streamed - whole).max() < TOLERANCE
    exact = WindowedCodec(tiny_snac, left=3, right=3).stream(f)
    assert np.abs(exact - whole).max() < 1e-5


def test_too_little_context_shows_at_the_seams(tiny_snac, no_noise):
    """The measurement is sensitive: one frame of context is visibly worse than the default."""
    f = frames(1, 16)
    codec = WindowedCodec(tiny_snac)
    whole = codec.decode_whole(f)
    default = np.abs(codec.stream(f) - whole).max()
    short = np.abs(WindowedCodec(tiny_snac, left=1, right=1).stream(f) - whole).max()
    assert short > 10 * default


def test_with_noise_windowing_adds_nothing_beyond_seed_to_seed_variation(tiny_snac):
    f = frames(2, 16)
    codec = WindowedCodec(tiny_snac)
    torch.manual_seed(1)
    a = codec.decode_whole(f)
    torch.manual_seed(2)
    b = codec.decode_whole(f)
    torch.manual_seed(3)
    w = codec.stream(f)
    rms = lambda x: float(np.sqrt(np.mean(x**2)))  # noqa: E731
    assert rms(w - a) < 1.2 * rms(b - a)


def test_windows_of_many_streams_share_one_call_and_match_single_calls(tiny_snac, no_noise, monkeypatch):
    codec = WindowedCodec(tiny_snac)
    streams = {s: frames(10 + s, 9) for s in range(3)}
    for s, f in streams.items():
        codec.reset(s)
        for row in f.tolist():
            codec.push(s, row)
    ready = codec.ready()
    assert sorted(w.slot for w in ready) == [0, 1, 2]
    calls = []
    real = codec.decode_codes
    monkeypatch.setattr(codec, "decode_codes", lambda x: calls.append(x.shape) or real(x))
    batched = codec.decode(ready)
    assert len(calls) == 1 and calls[0][0] == 3
    for w, audio in zip(ready, batched):
        alone = WindowedCodec(tiny_snac).decode([w])[0]
        assert np.abs(audio - alone).max() < 1e-5


def test_first_audio_needs_one_frame_plus_right_context(tiny_snac):
    codec = WindowedCodec(tiny_snac, right=2)
    codec.reset(0)
    f = frames(3, 3).tolist()
    codec.push(0, f[0])
    codec.push(0, f[1])
    assert codec.ready() == []
    codec.push(0, f[2])
    (w,) = codec.ready()
    assert (w.keep_lo, w.keep_hi, w.lo, w.hi) == (0, 1, 0, 3)
