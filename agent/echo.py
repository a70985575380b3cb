"""Echo cancellation at the agent, with the exact reference: the bot's own audio, as it was played.

A caller on loudspeakers or a speakerphone sends the bot's voice back to the agent; a VAD that
hears it stops the bot (a self-interruption) and the STT answers the bot's own words. The
caller's device may cancel it, or may not (a speakerphone with a weak canceller, a phone line
with echo, a browser whose canceller suppresses the caller as well). The agent holds what no
device has: every sample it handed the transport, and when. :class:`EchoCanceller` uses it.

* **far end**: :meth:`EchoCanceller.far` with the bot's PCM and the time it starts playing (the
  framework adapter models the transport's playout; :meth:`truncate_far` when a barge-in drops
  what was queued, so the canceller never expects echo of audio that was not played);
* **near end**: :meth:`EchoCanceller.near` with the caller's audio as it arrives; it returns the
  cleaned audio, which the VAD, the barge-in and the STT read instead.

Both sides are placed on one sample clock (``time.monotonic()`` at 16 kHz), kept continuous
across arrival jitter. The canceller is WebRTC's AEC3 (``pywebrtc-audio``, 10 ms frames; LiveKit's
``rtc.AudioProcessingModule`` wraps the same AEC3 and measured the same here, but it is a
framework's SDK, which the layout keeps out of this framework-free module). AEC3 finds the echo's
delay itself only within a limited range (docs/BENCHMARKS.md), while a browser call's round trip
is 100-500 ms and drifts, and a phone line's may be longer; so the **bulk delay** is ours: a
GCC-PHAT cross-correlation of the microphone and the reference over the last seconds
(:class:`DelayEstimator`), and the reference is handed to AEC3 shifted so that what is left of the
delay is within AEC3's reach (the shift changes only when the delay leaves it: each change costs
AEC3 a re-convergence).

**What is left of the echo** must not count as a caller either. Per 10 ms frame the canceller
predicts the echo's level at the microphone from the reference (its level at the estimated delay
plus the measured echo return loss) and what should remain of it after cancellation (less the
measured enhancement). A frame whose cleaned level is not clearly above that prediction, while the
bot's audio is arriving, is **echo residue** and is passed on muted (``gate_residue``): the VAD,
the barge-in and the STT never see it, and a caller speaking over the bot (double talk) is well
above it and passes. :func:`echo_transcript` is the last check: a transcript that only repeats
words the bot just played is not a caller's turn.
"""

from __future__ import annotations

import re
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

__all__ = ["DelayEstimator", "EchoCanceller", "EchoStats", "echo_transcript"]

RATE = 16000  # the canceller's own rate: what the VAD and the STT read
FRAME = RATE // 100  # AEC3 works on 10 ms frames
_FLOOR_DB = -90.0


def _db(x: np.ndarray) -> float:
    p = float(np.mean(x.astype(np.float64) ** 2)) if x.size else 0.0
    return 10.0 * np.log10(p) if p > 1e-9 else _FLOOR_DB


@dataclass
class EchoStats:
    """What the canceller saw in one call: the figures the benchmark and the tests read."""

    frames: int = 0  # 10 ms near-end frames processed
    far_frames: int = 0  # of them, with the bot's audio arriving as echo
    muted_frames: int = 0  # echo residue passed on muted
    delay_ms: float | None = None  # the echo delay last estimated
    delay_updates: int = 0
    erl_db: float | None = None  # echo return loss: reference -> microphone
    erle_db: float | None = None  # echo return loss enhancement: microphone -> cleaned
    cpu_s: float = 0.0  # thread CPU time spent in near() and far()
    first_far_t: float | None = None  # sample-clock time of the first bot audio (s)
    delay_history: list[tuple[float, float, float]] = field(default_factory=list)  # (t, ms, confidence)


class DelayEstimator:
    """The echo's bulk delay: GCC-PHAT between microphone and reference, over the last ``window_s``.

    PHAT weighting whitens both spectra, so the peak is sharp for speech (whose low frequencies
    would otherwise smear it) and its height against the rest of the correlation says how sure
    it is. A new estimate is accepted only when it is sure and, to spare AEC3 a re-convergence
    for jitter, when it moved by more than ``hysteresis_ms`` (or is the first).
    """

    def __init__(
        self,
        *,
        max_delay_ms: float = 800.0,
        window_s: float = 2.0,
        min_confidence: float = 8.0,
        hysteresis_ms: float = 30.0,
    ) -> None:
        self.max_lag = int(RATE * max_delay_ms / 1000)
        self.window = int(RATE * window_s)
        self.min_confidence = min_confidence
        self.hysteresis = int(RATE * hysteresis_ms / 1000)
        self.delay: int | None = None  # samples
        self._candidate: int | None = None  # a sure estimate waiting for a second one to agree

    def estimate(self, near: np.ndarray, ref: np.ndarray) -> tuple[int, float]:
        """``near``: the last ``window`` mic samples; ``ref``: the ``max_lag + window`` reference
        samples that end with them.

        Returns (delay in samples, confidence: peak over the correlation's mean absolute value).
        """
        n = len(near)
        size = 1 << int(np.ceil(np.log2(len(ref) + n)))
        cross = np.conj(np.fft.rfft(near, size)) * np.fft.rfft(ref, size)
        cross /= np.maximum(np.abs(cross), 1e-12)
        corr = np.fft.irfft(cross, size)[: self.max_lag + 1]  # corr[k]: near[t] against ref[t + k]
        k = int(np.argmax(corr[1:])) + 1  # corr[0] (the window's far edge) picks up the reference's start
        confidence = float(corr[k] / (np.mean(np.abs(corr)) + 1e-12))
        return self.max_lag - k, confidence

    def update(self, near: np.ndarray, ref: np.ndarray) -> tuple[int, float] | None:
        """Estimate; return (delay, confidence) when it is adopted, else None.

        A move is adopted only when two sure estimates in a row agree on it: one window of the
        caller talking over the bot, or of the bot's own pauses, can put a false peak above the
        threshold once, and every adopted move costs AEC3 a re-convergence.
        """
        delay, confidence = self.estimate(near, ref)
        if confidence < self.min_confidence:
            return None
        if self.delay is not None and abs(delay - self.delay) <= self.hysteresis:
            self._candidate = None
            return None
        candidate, self._candidate = self._candidate, delay
        if self.delay is not None and (candidate is None or abs(candidate - delay) > self.hysteresis):
            return None
        self.delay, self._candidate = delay, None
        return delay, confidence


class _Ring:
    """The reference on the sample clock: absolute sample index -> value, the last ``size`` samples."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.buf = np.zeros(size, np.float32)
        self.end = 0  # absolute index after the last written sample (what is after it is silence)

    def write(self, start: int, x: np.ndarray) -> None:
        if start > self.end:  # silence between the last audio and this
            self._zero(self.end, start)
        if len(x) > self.size:  # only the last ``size`` samples can be kept
            start, x = start + len(x) - self.size, x[-self.size :]
        idx = np.arange(start, start + len(x)) % self.size
        self.buf[idx] = x
        self.end = max(self.end, start + len(x))

    def truncate(self, at: int) -> None:
        """Nothing from ``at`` on was played."""
        if at < self.end:
            self._zero(max(at, self.end - self.size), self.end)
            self.end = at

    def _zero(self, a: int, b: int) -> None:
        a = max(a, b - self.size)
        if b > a:
            self.buf[np.arange(a, b) % self.size] = 0.0

    def read(self, a: int, b: int) -> np.ndarray:
        out = np.zeros(max(0, b - a), np.float32)
        lo, hi = max(a, self.end - self.size), min(b, self.end)
        if hi > lo:
            out[lo - a : hi - a] = self.buf[np.arange(lo, hi) % self.size]
        return out


class _Stream:
    """One side's position on the sample clock: continuous across arrival jitter, re-synced across gaps."""

    def __init__(self, resync_s: float = 0.12) -> None:
        self.next: int | None = None
        self.resync = int(RATE * resync_s)

    def place(self, t: float, n: int, *, ahead_ok: bool) -> int:
        """Where ``n`` samples that start at time ``t`` go; ``ahead_ok``: they may queue after the last ones."""
        at = round(t * RATE)
        if self.next is not None and (abs(at - self.next) <= self.resync or (ahead_ok and at < self.next)):
            at = self.next
        self.next = at + n
        return at


class _Resampler:
    """int16 bytes at any rate -> float32 at RATE, streaming (soxr keeps the filter state)."""

    def __init__(self) -> None:
        self.rate: int | None = None
        self.stream = None

    def __call__(self, pcm: bytes, sample_rate: int) -> np.ndarray:
        x = np.frombuffer(pcm, np.int16).astype(np.float32) / 32768.0
        if sample_rate == RATE:
            return x
        if sample_rate != self.rate:
            import soxr

            self.rate, self.stream = sample_rate, soxr.ResampleStream(sample_rate, RATE, 1, dtype="float32")
        return self.stream.resample_chunk(x)


def _default_aec():
    """WebRTC's AEC3 at 16 kHz mono from ``pywebrtc-audio`` (see docs/BENCHMARKS.md for why not livekit.rtc's)."""
    import pywebrtc_audio

    return pywebrtc_audio.EchoCanceller(sample_rate=RATE, num_channels=1)


class EchoCanceller:
    """One call's echo canceller (see the module docstring). Not thread-safe: one event loop drives it.

    ``gate_residue``: pass frames judged echo residue on muted. ``residue_margin_db``: how far
    above the predicted residue a frame must be to count as the caller. ``clock``: the time
    source of :meth:`far` and :meth:`near` when they are given no time (tests pass their own).
    """

    def __init__(
        self,
        *,
        max_delay_ms: float = 800.0,
        aec_reach_ms: float = 400.0,
        gate_residue: bool = True,
        residue_margin_db: float = 10.0,
        estimate_every_s: float = 0.5,
        clock=time.monotonic,
        aec_factory=_default_aec,
    ) -> None:
        self._aec = aec_factory()
        self._clock = clock
        self.delay = DelayEstimator(max_delay_ms=max_delay_ms)
        self.reach = int(RATE * aec_reach_ms / 1000)
        self.gate_residue = gate_residue
        self.residue_margin_db = residue_margin_db
        self._estimate_every = int(RATE * estimate_every_s)
        self._since_estimate = 0
        history = self.delay.max_lag + self.delay.window + RATE
        self._ref = _Ring(history)
        self._mic = _Ring(self.delay.window + RATE)
        self._far_at = _Stream()
        self._near_at = _Stream()
        self._far_rs = _Resampler()
        self._near_rs = _Resampler()
        self._pending = np.zeros(0, np.float32)  # near samples short of a 10 ms frame
        self._pending_at = 0  # absolute index of _pending[0]
        self._shift = 0  # samples the reference is delayed by before AEC3
        self._erl = deque(maxlen=200)  # mic dB - reference dB, echo-only frames
        self._erle = deque(maxlen=200)  # mic dB - cleaned dB, echo-only frames
        self.stats = EchoStats()

    # ---------------------------------------------------------------- far end

    def far(self, pcm: bytes, sample_rate: int, t: float | None = None) -> None:
        """The bot's audio (int16 mono at ``sample_rate``) that starts playing at ``t`` (clock time)."""
        c0 = time.thread_time()
        x = self._far_rs(pcm, sample_rate)
        if x.size:
            at = self._far_at.place(self._clock() if t is None else t, len(x), ahead_ok=True)
            self._ref.write(at, x)
            if self.stats.first_far_t is None:
                self.stats.first_far_t = at / RATE
        self.stats.cpu_s += time.thread_time() - c0

    def truncate_far(self, t: float | None = None) -> None:
        """The transport dropped the bot's queued audio at ``t``: none of it after ``t`` will play."""
        at = round((self._clock() if t is None else t) * RATE)
        self._ref.truncate(at)
        if self._far_at.next is not None:
            self._far_at.next = min(self._far_at.next, at)

    # ---------------------------------------------------------------- near end

    def near(self, pcm: bytes, sample_rate: int, t: float | None = None) -> bytes:
        """The caller's audio that arrived at ``t`` (its last sample); returns it cleaned, as int16 at 16 kHz."""
        c0 = time.thread_time()
        x = self._near_rs(pcm, sample_rate)
        end_t = self._clock() if t is None else t
        at = self._near_at.place(end_t - len(x) / RATE, len(x), ahead_ok=False)
        if self._pending.size and at != self._pending_at + self._pending.size:
            self._pending = np.zeros(0, np.float32)  # a gap: drop the unfinished frame
        if not self._pending.size:
            self._pending_at = at
        self._pending = np.concatenate([self._pending, x])
        whole = len(self._pending) // FRAME * FRAME
        out = np.empty(whole, np.float32)
        for i in range(0, whole, FRAME):
            out[i : i + FRAME] = self._frame(self._pending_at + i, self._pending[i : i + FRAME])
        self._pending, self._pending_at = self._pending[whole:], self._pending_at + whole
        self.stats.cpu_s += time.thread_time() - c0
        return (np.clip(out, -1.0, 1.0) * 32767).astype(np.int16).tobytes()

    def _frame(self, at: int, mic: np.ndarray) -> np.ndarray:
        self._mic.write(at, mic)
        self._since_estimate += FRAME
        if self._since_estimate >= self._estimate_every:
            self._since_estimate = 0
            self._estimate(at + FRAME)
        ref = self._ref.read(at - self._shift, at - self._shift + FRAME)
        delay = self.delay.delay
        echo_ref = ref if delay is None else self._ref.read(at - delay, at - delay + FRAME)
        r16 = (np.clip(ref, -1, 1) * 32767).astype(np.int16)
        m16 = (np.clip(mic, -1, 1) * 32767).astype(np.int16)
        out = np.asarray(self._aec.process(m16, r16), np.int16).reshape(-1).astype(np.float32) / 32768.0
        self.stats.frames += 1
        return self._judge(mic, out, echo_ref)

    def _estimate(self, now: int) -> None:
        """Re-estimate the bulk delay from the last window, when the bot was audible in it."""
        d = self.delay
        ref = self._ref.read(now - d.window - d.max_lag, now)
        if _db(ref[-d.window :]) < -50.0:
            return
        near = self._mic.read(now - d.window, now)
        adopted = d.update(near, ref)
        if adopted is not None:
            delay, confidence = adopted
            self._retarget(delay)
            self._erl.clear()  # levels measured against the old delay's reference are not this one's
            self._erle.clear()
            self.stats.delay_ms = 1000.0 * delay / RATE
            self.stats.delay_updates += 1
            self.stats.delay_history.append((now / RATE, self.stats.delay_ms, round(confidence, 1)))

    def _retarget(self, delay: int) -> None:
        """Shift the reference only when AEC3 cannot reach the delay from where it is.

        Each shift makes AEC3 converge again (~0.5 s of weak cancellation here), so a delay that
        AEC3 already covers (``reach``, with a little room on the near side) keeps the shift it has;
        one out of reach gets a shift that puts it mid-reach, where drift has room both ways.
        """
        residual = delay - self._shift
        if not RATE // 50 <= residual <= self.reach:
            shift = max(0, delay - self.reach // 2)
            if shift != self._shift:
                self._shift = shift
                # AEC3 re-finds a moved delay slowly (seconds of weak cancellation here); started
                # afresh it converges as at the call's start
                self._aec.reset()

    def _judge(self, mic: np.ndarray, out: np.ndarray, echo_ref: np.ndarray) -> np.ndarray:
        """Track ERL/ERLE on echo-only frames; mute a frame that is echo residue (see the module docstring)."""
        ref_db = _db(echo_ref)
        if ref_db <= -60.0 or self.delay.delay is None:
            return out  # no bot audio arriving (or not yet located): nothing to judge
        self.stats.far_frames += 1
        mic_db, out_db = _db(mic), _db(out)
        erl = float(np.median(self._erl)) if self._erl else None
        erle = float(np.median(self._erle)) if self._erle else 20.0
        predicted = ref_db + erl if erl is not None else mic_db  # the echo's level at the mic
        if erl is None or mic_db <= predicted + 3.0:  # no more than the echo: an echo-only frame
            self._erl.append(mic_db - ref_db)
            self._erle.append(mic_db - out_db)
        self.stats.erl_db = erl
        self.stats.erle_db = erle if self._erle else None
        residue = predicted - erle
        if self.gate_residue and out_db < residue + self.residue_margin_db:
            self.stats.muted_frames += 1
            return np.zeros_like(out)
        return out


# ---------------------------------------------------------------- transcripts

_WORD = re.compile(r"[a-z0-9']+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def echo_transcript(transcript: str, played: str, *, min_words: int = 2, share: float = 0.8) -> bool:
    """Whether ``transcript`` only repeats words the bot just played (``played``, the last seconds of its text).

    True when it has at least ``min_words`` words and at least ``share`` of them appear, in order,
    in ``played``: what a microphone hears of a loudspeaker comes back as the bot's own words with
    a few misheard. One or two words of the caller's own ("yes", "Paris") are not judged echo.
    """
    said, heard = _words(transcript), _words(played)
    if len(said) < min_words or not heard:
        return False
    j = matched = 0
    for w in said:  # greedy in-order match: each heard word is used once
        k = j
        while k < len(heard) and heard[k] != w:
            k += 1
        if k < len(heard):
            matched += 1
            j = k + 1
    return matched >= share * len(said)
