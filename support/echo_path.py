"""A loudspeaker in a small room, in numpy: what the bot's own voice sounds like back in the microphone.

Every harness that plays the bot to a caller (the phone line, the aiortc room, the offline echo
bench) runs the bot's audio through one :class:`EchoPath` and adds it to what the caller says, so
tests see what a laptop's speakers or a speakerphone do: a delay (network, jitter buffers, the
device; 100-500 ms and drifting), a room (a synthetic impulse response: a direct path, a few early
reflections, an exponentially decaying diffuse tail with a chosen RT60) and a level (dB relative to
the bot's own, -12 to 0 dB).

The impulse response is drawn from a seed, so a failing case can be replayed; drift stretches the
delay linearly over time (``drift_ms_per_s``), which is what a sound card's clock against the
network's does to an echo canceller that fixed its delay once.

It is streaming: :meth:`EchoPath.push` takes the bot's audio as it is played and
:meth:`EchoPath.pull` gives the echo for the next microphone samples, so a harness can run it in
real time beside the caller's own voice (and double talk is simply both at once).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["EchoPath", "Room", "room_impulse", "to_int16"]


@dataclass(frozen=True)
class Room:
    """A small room's impulse response, by its reverberation time and a seed."""

    rt60_s: float = 0.25
    seed: int = 1
    early: int = 4  # discrete early reflections after the direct path
    length_s: float = 0.3


def room_impulse(room: Room, sample_rate: int) -> np.ndarray:
    """A unit-peak, energy-normalised impulse response: direct path, early reflections, diffuse tail."""
    rng = np.random.default_rng(room.seed)
    n = max(1, int(room.length_s * sample_rate))
    t = np.arange(n) / sample_rate
    # the diffuse tail decays by 60 dB over rt60: amplitude exp(-6.91 t / rt60)
    tail = rng.standard_normal(n) * np.exp(-6.91 * t / room.rt60_s) * 0.3
    tail[: int(0.004 * sample_rate)] = 0.0  # the tail starts after the first reflections
    h = tail
    h[0] = 1.0
    for _ in range(room.early):
        k = int(rng.uniform(0.002, 0.02) * sample_rate)
        h[k] += rng.uniform(-0.6, 0.6)
    return h / np.sqrt(np.sum(h**2))


class EchoPath:
    """The bot's audio back at the microphone: ``delay_ms`` later, through ``room``, at ``gain_db``.

    Works in float32 at ``sample_rate``; :meth:`push` the far end (int16 or float) as it is played,
    :meth:`pull` ``n`` samples of echo for the microphone's next ``n`` samples. Samples not pushed
    by the time they are pulled count as silence (the bot was not talking), so the two sides may be
    driven by different clocks, as a harness's are.
    """

    def __init__(
        self,
        *,
        sample_rate: int,
        delay_ms: float = 200.0,
        gain_db: float = -6.0,
        room: Room | None = Room(),
        drift_ms_per_s: float = 0.0,
    ) -> None:
        if not 0 <= delay_ms <= 2000:
            raise ValueError(f"delay_ms must be within 0..2000, got {delay_ms}")
        self.sample_rate = sample_rate
        self.delay_ms = delay_ms
        self.gain = float(10 ** (gain_db / 20))
        self.drift_ms_per_s = drift_ms_per_s
        self._h = room_impulse(room, sample_rate) if room is not None else np.ones(1)
        self._far = np.zeros(0, np.float32)  # far-end samples from _far_start on
        self._far_start = 0  # absolute index of _far[0] in the far-end stream
        self._far_end = 0  # absolute index after the last pushed far sample
        self._mic = 0  # absolute index of the next microphone sample

    def push(self, pcm: np.ndarray | bytes, *, at_sample: int | None = None) -> None:
        """Far-end audio as it is played.

        ``at_sample`` places it on the microphone's timeline (the sample index at which the
        loudspeaker plays its first sample); by default right after the previous push, or now if
        the bot had fallen silent. Audio never goes back in time: an overlap is placed after.
        """
        x = _as_float(pcm)
        start = max(self._mic if at_sample is None else at_sample, self._far_end)
        gap = start - self._far_end
        self._far = np.concatenate([self._far, np.zeros(gap, np.float32), x])
        self._far_end = start + len(x)

    def clear(self) -> None:
        """The player dropped what it had queued (Twilio's ``clear``): far audio not yet played is gone."""
        if self._far_end > self._mic:
            keep = max(0, self._mic - self._far_start)
            self._far = self._far[:keep]
            self._far_end = self._far_start + keep

    def _delay_at(self, i: int) -> float:
        seconds = i / self.sample_rate
        return self.sample_rate * 0.001 * (self.delay_ms + self.drift_ms_per_s * seconds)

    def pull(self, n: int) -> np.ndarray:
        """Echo (float32, full scale 1.0) for the microphone's next ``n`` samples."""
        i0 = self._mic
        self._mic += n
        # which far samples feed these n outputs: index - delay, back by the impulse's length
        d0, d1 = self._delay_at(i0), self._delay_at(i0 + n)
        lo = int(np.floor(i0 - max(d0, d1))) - len(self._h)
        hi = int(np.ceil(i0 + n - min(d0, d1))) + 1
        far = self._window(lo, hi)
        wet = np.convolve(far, self._h)[: len(far)]
        # fractional delay per output sample (drift), by linear interpolation into the wet signal
        idx = np.arange(i0, i0 + n) - (d0 + (d1 - d0) * np.arange(n) / max(n, 1)) - lo
        out = np.interp(idx, np.arange(len(wet)), wet, left=0.0, right=0.0).astype(np.float32)
        self._forget(lo)
        return out * self.gain

    def _window(self, lo: int, hi: int) -> np.ndarray:
        out = np.zeros(max(0, hi - lo), np.float32)
        a, b = max(lo, self._far_start), min(hi, self._far_end)
        if b > a:
            out[a - lo : b - lo] = self._far[a - self._far_start : b - self._far_start]
        return out

    def _forget(self, before: int) -> None:
        drop = min(before, self._far_end) - self._far_start
        if drop > 0:
            self._far = self._far[drop:]
            self._far_start += drop

    @property
    def mic_samples(self) -> int:
        """Microphone samples pulled so far (the harness's position on the caller's timeline)."""
        return self._mic


def _as_float(pcm: np.ndarray | bytes) -> np.ndarray:
    if isinstance(pcm, bytes | bytearray | memoryview):
        return np.frombuffer(pcm, np.int16).astype(np.float32) / 32768.0
    if pcm.dtype == np.int16:
        return pcm.astype(np.float32) / 32768.0
    return pcm.astype(np.float32)


def to_int16(x: np.ndarray) -> np.ndarray:
    """Float audio (full scale 1.0) to int16, clipped as a sound card would."""
    return (np.clip(x, -1.0, 1.0) * 32767).astype(np.int16)


def through_canceller(
    canceller,
    mic: np.ndarray,
    far: np.ndarray,
    *,
    rate: int,
    chunk_s: float = 0.02,
    lead_s: float = 0.04,
    t0: float = 1.0,
    jitter_s: float = 0.01,
    seed: int = 0,
) -> np.ndarray:
    """Drive an ``agent.runtime.echo.EchoCanceller`` as a transport would, on a simulated clock; returns the clean mic.

    ``far`` is handed over ``lead_s`` ahead of its playout in ``chunk_s`` pieces (as the agent's
    output does), ``mic`` arrives in ``chunk_s`` pieces with up to ``jitter_s`` of arrival jitter.
    Both are int16 at ``rate``; the far end's first sample plays when the mic's first sample is
    captured (the echo path put the delay into ``mic``).
    """
    rng = np.random.default_rng(seed)
    n = int(rate * chunk_s)
    ahead = int(rate * lead_s)
    canceller.far(far[:ahead].tobytes(), rate, t=t0)
    out = []
    for i in range(len(mic) // n):
        now = t0 + (i + 1) * chunk_s + rng.uniform(0, jitter_s)
        k = i * n + ahead
        if k < len(far):
            canceller.far(far[k : k + n].tobytes(), rate, t=t0 + k / rate)
        out.append(np.frombuffer(canceller.near(mic[i * n : (i + 1) * n].tobytes(), rate, t=now), np.int16))
    return np.concatenate(out)


def erle_windows(
    mic: np.ndarray, out: np.ndarray, echo: np.ndarray, *, rate: int, window_s: float = 0.1, floor_db: float = -35.0
) -> list[tuple[float, float]]:
    """(start s, ERLE dB) of each window where the echo alone is above ``floor_db``: mic power over cleaned power.

    Float arrays (full scale 1.0), the same length; ``echo`` is the echo alone (ground truth), so
    the windows are the ones where there was echo to remove. A cleaned window of silence reads as
    a large ERLE (capped at 60 dB: below that, nothing audible is left).
    """
    w = int(rate * window_s)
    found = []
    for i in range(0, min(len(out), len(mic)) - w + 1, w):
        e = float(np.mean(echo[i : i + w].astype(np.float64) ** 2))
        if e <= 10 ** (floor_db / 10):
            continue
        m = float(np.mean(mic[i : i + w].astype(np.float64) ** 2))
        o = float(np.mean(out[i : i + w].astype(np.float64) ** 2))
        found.append((i / rate, min(60.0, 10 * np.log10(m / max(o, 1e-12)))))
    return found


def longest_loud_run(out: np.ndarray, *, rate: int = 16000, frame_s: float = 0.01, above_db: float = -40.0) -> int:
    """The longest run of ``frame_s`` frames louder than ``above_db`` dBFS in ``out`` (float, full scale
    1.0): echo residue a VAD downstream could take for a caller (Pipecat's wants ~200 ms of speech)."""
    n = int(rate * frame_s)
    frames = out[: len(out) // n * n].reshape(-1, n)
    loud = np.mean(frames.astype(np.float64) ** 2, axis=1) > 10 ** (above_db / 10)
    runs = np.diff(np.flatnonzero(np.diff(np.concatenate([[0], loud.astype(int), [0]]))))[::2]
    return int(runs.max()) if runs.size else 0
