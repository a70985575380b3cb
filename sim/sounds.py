"""Non-speech caller sounds for false-interruption tests and the barge-in simulation.

Why synthetic: a cough or a burst of noise must reach the real Silero VAD (a fixture that
bypasses it says nothing), and recorded coughs are not something we can ship. Both sounds are
deterministic (seeded) float32 mono in [-1, 1], built with numpy only (no scipy here):

* :func:`noise_burst`: band-limited Gaussian noise (FFT brick-wall band) with 5 ms ramps, e.g. a
  click of line noise or a door; Silero scores it near 0, so it must not even pause the bot;
* :func:`cough`: what a cough is acoustically - an explosive broadband burst (glottis opening)
  followed by a short voiced, vowel-like tail (glottal pulses through three formants) that
  decays within ~100 ms. The voiced tail is what trips a VAD's first speech window; its decay
  keeps the run below ``min_speech_ms``, so the VAD drops it (a false interruption).
"""

from __future__ import annotations

import numpy as np

__all__ = ["cough", "noise_burst"]


def _band(x: np.ndarray, sample_rate: int, lo_hz: float, hi_hz: float) -> np.ndarray:
    spec = np.fft.rfft(x)
    freqs = np.fft.rfftfreq(x.size, 1.0 / sample_rate)
    spec[(freqs < lo_hz) | (freqs > hi_hz)] = 0.0
    return np.fft.irfft(spec, x.size)


def noise_burst(
    ms: float = 150.0,
    *,
    sample_rate: int = 16000,
    band_hz: tuple[float, float] = (300.0, 3400.0),
    rms: float = 0.1,
    seed: int = 0,
) -> np.ndarray:
    """``ms`` of band-limited noise at ``rms`` (0.1 = -20 dBFS), with 5 ms fades."""
    n = round(ms * sample_rate / 1000)
    x = _band(np.random.default_rng(seed).normal(0.0, 1.0, n), sample_rate, *band_hz)
    x *= rms / max(1e-12, float(np.sqrt(np.mean(x**2))))
    r = min(n // 2, round(0.005 * sample_rate))
    if r:
        ramp = np.linspace(0.0, 1.0, r)
        x[:r] *= ramp
        x[-r:] *= ramp[::-1]
    return x.astype(np.float32)


def cough(
    ms: float = 300.0,
    *,
    sample_rate: int = 16000,
    peak: float = 0.5,
    f0_hz: float = 140.0,
    formants_hz: tuple[float, ...] = (600.0, 1300.0, 2500.0),
    decay_ms: float = 100.0,
    burst_gain: float = 0.1,
    seed: int = 0,
) -> np.ndarray:
    """A cough of ``ms``: broadband burst (decay ~20 ms) + voiced tail decaying over ``decay_ms``."""
    n = round(ms * sample_rate / 1000)
    t = np.arange(n) / sample_rate
    attack = 1.0 - np.exp(-t / 0.004)
    burst = _band(np.random.default_rng(seed).normal(0.0, 1.0, n), sample_rate, 200.0, 6000.0)
    burst *= attack * np.exp(-t / 0.02) / max(1e-12, float(np.abs(burst).max()))
    pulses = np.zeros(n)
    pulses[:: max(1, round(sample_rate / f0_hz))] = 1.0
    spec = np.fft.rfft(pulses)
    freqs = np.fft.rfftfreq(n, 1.0 / sample_rate)
    shape = sum(np.exp(-(((freqs - f) / (0.12 * f + 60.0)) ** 2)) for f in formants_hz)
    voiced = np.fft.irfft(spec * shape, n)
    voiced *= attack * np.exp(-t / (decay_ms / 1000.0)) / max(1e-12, float(np.abs(voiced).max()))
    y = burst_gain * burst + voiced
    r = min(n // 2, round(0.005 * sample_rate))
    if r:
        y[-r:] *= np.linspace(1.0, 0.0, r)
    return (peak * y / max(1e-12, float(np.abs(y).max()))).astype(np.float32)
