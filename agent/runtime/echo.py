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
AEC3 a re-convergence). A first delay is adopted only where the microphone's loudness follows the
bot's at that lag (``FIRST_ENVELOPE_R``): with no echo at all, a caller answering just after the bot
can put up a sure correlation peak between their first words and the bot's last.

**No echo at all** (headphones, a device that cancels its own) is the common case, and AEC3 left
without an echo path still ducks a caller who talks over the bot; so after 1.5 s of the bot's audio
with no echo located the caller's audio passes untouched (AEC3 keeps running, and an echo that
appears later is located and cancelled from then on).

**What is left of the echo** must not count as a caller either. Per 10 ms frame the canceller
predicts the echo's level at the microphone from the reference (its level at the estimated delay
plus the measured echo return loss) and what should remain of it after cancellation (less the
measured enhancement). A frame whose cleaned level is not clearly above that prediction, while the
bot's audio is arriving, is **echo residue** and is passed on muted (``gate_residue``): the VAD,
the barge-in and the STT never see it. The enhancement is measured afresh whenever the bot talks
again after a silence (``REPLY_GAP``): the echo's path may have moved in between (a browser's jitter
buffer starts each talk spurt anew), AEC3 then removes only a few dB until it follows, and an
enhancement carried over from the last reply would let that residue through as a caller. The price
is paid by a caller who talks over the first half second of a reply: they must then be louder than
the bot's echo to pass. The path can also grow *longer* in a moment (a browser's jitter buffer by
hundreds of ms), and then the bot's last words come back after the reference at the located delay
has gone quiet, when the gate sees "no bot audio arriving": until the search range is past, a
frame that correlates with the bot's audio at a later lag is muted as such **late echo**
(:meth:`EchoCanceller._late_echo`; a caller's speech does not correlate with it). The path can
also move a few tens of ms *while the bot speaks*; AEC3 then removes little for a while, and a
gate still expecting its converged enhancement would pass the echo as a caller. So a frame AEC3
removed little from is asked the same question around the located delay (:meth:`_coherence`):
echo the bot's audio predicts well is muted as echo AEC3 lost, and a frame it predicts poorly (a
caller talking over the bot) is left out of what AEC3 is measured to remove — before, a caller's
own frames, which AEC3 passes, talked that measure down to nothing and the gate then muted the
rest of the caller.
:func:`echo_transcript` is the last check: a transcript that only repeats words the bot just
played is not a caller's turn.

**A caller speaking over the bot (double talk)** must not be lost with the echo, and AEC3 loses
them: most of what it removes it removes with a nonlinear suppressor (its own linear filter is
short, a room's tail is left to the suppressor), which ducks the caller with the echo they share
bins with, and the gate then mutes what is left of the caller's quieter frames. So beside AEC3 runs
a linear model of the echo path over the room's tail (:class:`_LinearEcho`, a frequency-domain
NLMS filter on the reference at our delay estimate), which subtracts only what it predicts and
leaves the caller whole. A frame is **double talk** when the microphone is well above the loudest
echo the reference predicts, or when the linear model's output is well above what it leaves of the
echo on echo-only frames; the decision holds through the gaps between words, and while it holds
the canceller hands on the linear model's output (or the microphone itself, where the caller is
that far above the echo and the linear model does not cancel well yet) instead of AEC3's. The
linear model learns only from frames the caller is judged silent in, and from the audio already
held when the delay is located, so it is ready soon after. The pass is **off by default**
(``double_talk``): offline it keeps the caller's words, but in the LiveKit worker's loudspeaker
test (real time, turns that pause and resume) it took echo for double talk and let it through, and
the agent stopped for it (docs/BENCHMARKS.md); what misleads it there is open.
"""

from __future__ import annotations

import re
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "SEGMENT_S",
    "SURE_DB",
    "DelayEstimator",
    "EchoCanceller",
    "EchoStats",
    "echo_transcript",
    "residue_transcript",
]

RATE = 16000  # the canceller's own rate: what the VAD and the STT read
FRAME = RATE // 100  # AEC3 works on 10 ms frames
_FLOOR_DB = -90.0
SPREAD = RATE * 120 // 1000  # samples either side of the estimated delay the echo may come from
MIN_MEASURED = 10  # echo-only frames before the measured ERL/ERLE are trusted
ERL_FRAMES = 50  # ... and before the double-talk check trusts the ERL as a bound
HISTORY = 50  # delay estimates kept in EchoStats.delay_history
ABSENT_FRAMES = 150  # 10 ms frames of the bot arriving without an echo located: there is none
CONVERGED_FRAMES, CONVERGED_DB = 100, 15.0  # 1 s of echo cancelled by this much: AEC3 has converged
LINEAR_LEAD = RATE * 40 // 1000  # the linear model starts this far before the estimated delay (its error)
LINEAR_FRAMES, LINEAR_DB = 50, 10.0  # echo-only frames the linear model must have cancelled by this much
PRETRAIN = 2 * RATE  # samples of held audio a new linear model learns from
LINEAR_PCT = 25  # what the linear model leaves: this percentile of its recent frames' cancellation
# frames a double-talk decision holds: a word's quiet tail and the gaps between words are the
# caller's too. Longer where the linear model's output is handed on (little echo is left in it)
# than where the microphone itself is
TALK_HOLD, TALK_HOLD_LINEAR = 5, 30
ADAPT_AFTER = 30  # frames after the caller was last heard before the linear model learns again
TALK_MAX = 400  # frames of double talk in a row after which the linear model is no longer relied on
BAND_HZ = (200.0, 3400.0)  # what the delay estimator compares: the band of every path, phones included
NO_ECHO_DB = 60.0  # the margin of a frame no echo can be in (no bot audio arriving, none located, double talk)
MARGIN_FRAMES = 200  # 2 s of frames' margins kept for caller_margin_db
# a VAD run this far above the residue (median over its frames) is the caller's: the speakerphone
# tests' caller runs measured 21-51 dB, residue runs of 150 ms or more mostly 11-19 (BENCHMARKS, "Echo")
SURE_DB = 21.0
RESIDUE_SHARE = 0.6  # of a transcript's words the bot's own, for residue_transcript
SEGMENT_S = 2.0  # the caller's audio a transcript is judged by (caller_margin_db): its segment and the STT's time since
TAIL = RATE // 2  # samples after the bot's audio stops arriving in which a room's echo still rings
# after the bot's audio at the located delay has ended: the microphone's last LATE_WINDOW samples
# correlating this much with the bot's audio at a later lag are its echo come late (_late_echo;
# offline, echo 0.5-0.6 and a caller answering 0.14-0.31: tests/agent/test_echo.py)
LATE_CORR, LATE_WINDOW = 0.4, RATE // 5
# while the bot's audio arrives, an audible frame AEC3 removed less than COHERE_DB from is either
# echo AEC3 lost (the path moved under it) or a caller; the microphone's last COHERE_WINDOW samples
# correlating with the bot's audio around the located delay tell them apart (_bot_corr): ECHO_CORR
# or more is echo, muted as residue; under CALLER_CORR it is not echo and stays out of ERLE
ECHO_CORR, CALLER_CORR = 0.55, 0.45
COHERE_DB, COHERE_WINDOW = 10.0, RATE // 10
# a first delay is adopted only where the microphone's loudness, 10 ms frame by frame over the
# estimator's window, follows the bot's at that lag at least this much (Pearson r of their dB): an
# echo does, even under a caller; a caller answering just after the bot does not, and GCC-PHAT can
# still find a sure peak between their first words and the bot's last (tests/agent/test_echo.py)
FIRST_ENVELOPE_R = 0.35
REPLY_GAP = RATE  # samples without the bot's audio after which it starts a new talk spurt


def _db(x: np.ndarray) -> float:
    p = float(np.mean(x.astype(np.float64) ** 2)) if x.size else 0.0
    return 10.0 * np.log10(p) if p > 1e-9 else _FLOOR_DB


def _envelope_r(near: np.ndarray, ref: np.ndarray, delay: int, max_lag: int) -> float:
    """How well the microphone's loudness follows the bot's ``delay`` samples earlier: the Pearson
    correlation of their 10 ms frames' dB over the window (``ref`` as the delay estimator reads it,
    ``max_lag`` samples longer than ``near``), over the frames where either is audible."""
    w = len(near) // FRAME * FRAME
    seg = ref[max_lag - delay : max_lag - delay + w]
    near_db = 10 * np.log10(np.mean(near[:w].reshape(-1, FRAME).astype(np.float64) ** 2, axis=1) + 1e-10)
    ref_db = 10 * np.log10(np.mean(seg.reshape(-1, FRAME).astype(np.float64) ** 2, axis=1) + 1e-10)
    keep = (ref_db > -50.0) | (near_db > np.percentile(near_db, 10) + 10.0)
    if keep.sum() < 20 or np.std(near_db[keep]) == 0 or np.std(ref_db[keep]) == 0:
        return 0.0
    return float(np.corrcoef(near_db[keep], ref_db[keep])[0, 1])


@dataclass
class EchoStats:
    """What the canceller saw in one call: the figures the benchmark and the tests read."""

    frames: int = 0  # 10 ms near-end frames processed
    far_frames: int = 0  # of them, with the bot's audio arriving as echo
    muted_frames: int = 0  # echo residue passed on muted
    talk_frames: int = 0  # double talk: the caller over the bot, passed without AEC3's suppression
    late_frames: int = 0  # of the muted: echo come later than the located delay (_late_echo)
    lost_frames: int = 0  # of the muted: echo AEC3 lost, told by its correlation with the bot's audio
    false_firsts: int = 0  # first delays found that the microphone's loudness did not follow (not adopted)
    delay_ms: float | None = None  # the echo delay last estimated
    delay_updates: int = 0
    erl_db: float | None = None  # echo return loss: reference -> microphone
    erle_db: float | None = None  # echo return loss enhancement: microphone -> cleaned
    linear_erle_db: float | None = None  # the same, of the linear echo model alone (double talk's output)
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
        first_confidence: float = 11.0,
        hysteresis_ms: float = 30.0,
    ) -> None:
        self.max_lag = int(RATE * max_delay_ms / 1000)
        self.window = int(RATE * window_s)
        self.min_confidence = min_confidence
        self.first_confidence = first_confidence
        self.hysteresis = int(RATE * hysteresis_ms / 1000)
        self.delay: int | None = None  # samples
        self._candidate: int | None = None  # a sure estimate waiting for a second one to agree
        self.refused_firsts = 0  # first delays the microphone's loudness did not follow (FIRST_ENVELOPE_R)

    def estimate(self, near: np.ndarray, ref: np.ndarray) -> tuple[int, float]:
        """``near``: the last ``window`` mic samples; ``ref``: the ``max_lag + window`` reference
        samples that end with them.

        Returns (delay in samples, confidence: peak over the correlation's mean absolute value).
        """
        # No zero padding beyond the reference's length: the lags read (0..max_lag) do not wrap
        # around in a circular correlation of that length, and the FFTs cost a third of those
        # padded to both lengths (this runs on the event loop every ``estimate_every_s`` per call)
        size = 1 << int(np.ceil(np.log2(len(ref))))
        cross = np.conj(np.fft.rfft(near, size)) * np.fft.rfft(ref, size)
        # PHAT over the band every path carries (a phone line stops at 3.4 kHz, and whitening bins
        # that hold nothing but noise drowns the peak), regularised where both are faint
        freqs = np.fft.rfftfreq(size, 1.0 / RATE)
        mag = np.abs(cross)
        cross = np.where((freqs >= BAND_HZ[0]) & (freqs <= BAND_HZ[1]), cross / (mag + 1e-3 * mag.mean() + 1e-12), 0)
        corr = np.fft.irfft(cross, size)[: self.max_lag + 1]  # corr[k]: near[t] against ref[t + k]
        k = int(np.argmax(corr[1:])) + 1  # corr[0] (the window's far edge) picks up the reference's start
        confidence = float(corr[k] / (np.mean(np.abs(corr)) + 1e-12))
        return self.max_lag - k, confidence

    def update(self, near: np.ndarray, ref: np.ndarray) -> tuple[int, float] | None:
        """Estimate; return (delay, confidence) when it is adopted, else None.

        A delay (the first one too) is adopted only when two sure estimates in a row agree on it:
        one window of the caller talking over the bot, of the bot's own pauses, or of a call's first
        second (little echo in it yet) can put a false peak above the threshold once, and every
        adopted move costs AEC3 a re-convergence. The first one also only where the microphone's
        loudness follows the bot's at that lag (``FIRST_ENVELOPE_R``, :func:`_envelope_r`).
        """
        delay, confidence = self.estimate(near, ref)
        # finding an echo where there was none costs more (the caller is then ducked by AEC3) than
        # finding it half a second later: the first location asks for a surer peak
        if confidence < (self.min_confidence if self.delay is not None else self.first_confidence):
            return None
        if self.delay is not None and abs(delay - self.delay) <= self.hysteresis:
            self._candidate = None
            return None
        candidate, self._candidate = self._candidate, delay
        if candidate is None or abs(candidate - delay) > self.hysteresis:
            return None  # the first estimate too: early in a call a window holds little echo
        self._candidate = None
        if self.delay is None and _envelope_r(near, ref, delay, self.max_lag) < FIRST_ENVELOPE_R:
            self.refused_firsts += 1  # no echo's loudness behind the peak: none located yet
            return None
        self.delay = delay
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
        i = start % self.size
        head = min(len(x), self.size - i)  # up to the buffer's end, the rest from its start
        self.buf[i : i + head] = x[:head]
        self.buf[: len(x) - head] = x[head:]
        self.end = max(self.end, start + len(x))

    def truncate(self, at: int) -> None:
        """Nothing from ``at`` on was played."""
        if at < self.end:
            self._zero(max(at, self.end - self.size), self.end)
            self.end = at

    def _zero(self, a: int, b: int) -> None:
        a = max(a, b - self.size)
        if b > a:
            i, n = a % self.size, b - a
            head = min(n, self.size - i)
            self.buf[i : i + head] = 0.0
            self.buf[: n - head] = 0.0

    def read(self, a: int, b: int) -> np.ndarray:
        """Samples ``a..b`` (absolute); silence where nothing is held. Slices, not an index array:
        the canceller reads seconds of it per 10 ms frame on the event loop."""
        out = np.zeros(max(0, b - a), np.float32)
        lo, hi = max(a, self.end - self.size), min(b, self.end)
        if hi > lo:
            i, n = lo % self.size, hi - lo
            head = min(n, self.size - i)
            out[lo - a : lo - a + head] = self.buf[i : i + head]
            out[lo - a + head : hi - a] = self.buf[: n - head]
        return out


class _Stream:
    """One side's position on the sample clock: continuous, re-placed only across a real gap.

    Audio is continuous on both sides (a transport plays, and a microphone captures, every
    sample in turn) while the times the agent sees it at are not: a busy event loop hands on a
    second of audio in bursts, 100-400 ms apart. So a piece goes right after the previous one,
    never back in time, and is placed by its own time only when that is ``resync_s`` later than
    continuity would put it (the bot fell silent, the line dropped audio). What that leaves of a
    misplacement is a delay, and the delay is the estimator's to find.
    """

    def __init__(self, resync_s: float) -> None:
        self.next: int | None = None
        self.resync = int(RATE * resync_s)

    def place(self, t: float, n: int) -> int:
        """Where ``n`` samples that start at time ``t`` go."""
        at = round(t * RATE)
        if self.next is not None and at <= self.next + self.resync:
            at = self.next
        self.next = at + n
        return at


class _Capture:
    """The near end's position on the sample clock, from the count of samples and their arrival times.

    The caller's audio is captured in real time but reaches the agent late by a varying amount:
    a busy event loop delivers it in bursts, and a call's first packets often wait longest (0.5 s
    here). The least-delayed arrival tells best when a sample was captured, so the clock's offset
    is the smallest ``arrival - captured count`` seen, allowed to creep up by ``creep_ms_per_s``
    (a sound card's clock against ours, lost packets) so it never sticks to one lucky packet.
    """

    def __init__(self, creep_ms_per_s: float = 1.0, move_ms: float = 20.0) -> None:
        self.count = 0
        self.offset: float | None = None  # seconds: capture time of sample 0 (the estimate)
        self.applied: float | None = None  # the offset the placement uses
        self.creep = creep_ms_per_s / 1000.0
        self.move = move_ms / 1000.0
        self._last_t: float | None = None

    def place(self, t_end: float, n: int) -> int:
        """Where ``n`` samples whose last one arrived at ``t_end`` go.

        The placement follows the estimate only when it moved by more than ``move_ms``: AEC3
        takes a fixed offset in its stride, while one that wanders by the arrival jitter (a few ms
        to and fro) keeps it from converging.
        """
        self.count += n
        o = t_end - self.count / RATE
        if self.offset is None:
            self.offset = self.applied = o
        else:
            self.offset = min(o, self.offset + self.creep * max(0.0, t_end - self._last_t))
            if abs(self.offset - self.applied) > self.move:
                self.applied = self.offset
        self._last_t = t_end
        return round(self.applied * RATE) + self.count - n


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


class _LinearEcho:
    """A linear model of the echo path: a partitioned-block frequency-domain NLMS filter.

    AEC3 removes most of its echo with a nonlinear suppressor (its own linear filter is short,
    and a room's tail is left to the suppressor), and a suppressor cannot tell the caller's speech
    from the echo it shares bins with: a caller talking over the bot is ducked with it. This filter
    only subtracts what it predicts from the reference, so what is not echo (the caller) passes
    whole; it is what the canceller hands on while the caller talks over the bot (double talk).

    Overlap-save, ``FRAME``-sample blocks, ``partitions`` blocks long (the room's tail and what
    is left of the delay after the reference's shift). :meth:`process` predicts and subtracts;
    :meth:`adapt` learns from that frame's error, and is called only for frames the caller was
    judged silent in, since a caller's speech in the error would pull the filter away.
    """

    def __init__(self, partitions: int, *, mu: float = 1.0) -> None:
        bins = FRAME + 1
        self.mu = mu
        self.parts = partitions
        # the reference's block spectra, twice over: x[head : head + parts] is the last ``parts``
        # of them, newest first, without moving any (w[k] goes with the block k blocks back)
        self._x = np.zeros((2 * partitions, bins), np.complex64)
        self._p = np.zeros((2 * partitions, bins), np.float32)  # their power per bin
        self._head = partitions
        self.w = np.zeros((partitions, bins), np.complex64)
        self._power = np.zeros(bins, np.float32)  # the reference's power per bin over the span
        self._turn = 0  # the partition whose gradient is constrained this frame
        self._last = np.zeros(FRAME, np.float32)
        self._err = np.zeros(FRAME, np.float32)
        self.echo_db = _FLOOR_DB

    @property
    def x(self) -> np.ndarray:
        return self._x[self._head : self._head + self.parts]

    def process(self, ref: np.ndarray, mic: np.ndarray) -> np.ndarray:
        """Return ``mic`` less the echo predicted from ``ref`` (both one block, the same instant)."""
        block = np.concatenate([self._last, ref.astype(np.float32)])
        self._last = block[FRAME:]
        spec = np.fft.rfft(block).astype(np.complex64)
        power = (spec.real**2 + spec.imag**2).astype(np.float32)
        self._head = (self._head - 1) % self.parts  # the oldest block's place takes the new one
        h = self._head
        self._power += power - self._p[h]
        np.maximum(self._power, 0.0, out=self._power)
        self._x[h] = self._x[h + self.parts] = spec
        self._p[h] = self._p[h + self.parts] = power
        echo = np.fft.irfft(np.einsum("ij,ij->j", self.w, self.x), 2 * FRAME)[FRAME:]
        self.echo_db = _db(echo)  # what it took for echo
        self._err = (mic - echo).astype(np.float32)
        return self._err

    def adapt(self) -> None:
        """One NLMS step on the last :meth:`process`'s error."""
        spec = np.fft.rfft(np.concatenate([np.zeros(FRAME, np.float32), self._err]))
        # normalised by the reference's energy per bin over the filter's span (NLMS); a floor
        # (the bot at -50 dBFS) keeps a faint reference from taking a room's tail, or the
        # caller, for something it must be scaled up to explain
        norm = self._power + 1e-2 * self._power.mean() + self.parts * 2 * FRAME * 1e-5
        self.w += np.conj(self.x) * (self.mu * spec / norm).astype(np.complex64)
        # the gradient constraint (a linear, not circular, convolution), one partition a frame in
        # turn: each is kept linear as often as needed, at a partition's cost
        k = self._turn = (self._turn + 1) % self.parts
        taps = np.fft.irfft(self.w[k], 2 * FRAME)
        taps[FRAME:] = 0.0
        self.w[k] = np.fft.rfft(taps)


def _default_aec():
    """WebRTC's AEC3 at 16 kHz mono from ``pywebrtc-audio`` (see docs/BENCHMARKS.md for why not livekit.rtc's)."""
    import pywebrtc_audio

    return pywebrtc_audio.EchoCanceller(sample_rate=RATE, num_channels=1)


class EchoCanceller:
    """One call's echo canceller (see the module docstring). Not thread-safe: one event loop drives it.

    ``gate_residue``: pass frames judged echo residue on muted. ``residue_margin_db``: how far
    above the predicted residue a frame must be to count as the caller. ``double_talk``: hand on
    the linear model's output while the caller talks over the bot (the module docstring; off by
    default); ``double_talk_margin_db`` and ``linear_margin_db``: its two checks' margins. ``clock``: the time
    source of :meth:`far` and :meth:`near` when they are given no time (tests pass their own).
    """

    def __init__(
        self,
        *,
        max_delay_ms: float = 800.0,
        aec_reach_ms: float = 400.0,
        gate_residue: bool = True,
        residue_margin_db: float = 6.0,
        double_talk: bool = False,
        double_talk_margin_db: float = 6.0,
        linear_margin_db: float = 15.0,
        linear_tail_ms: float = 320.0,
        estimate_every_s: float = 0.25,
        clock=time.monotonic,
        aec_factory=_default_aec,
    ) -> None:
        self._aec_factory = aec_factory
        self._aec = aec_factory()
        self._clock = clock
        self.delay = DelayEstimator(max_delay_ms=max_delay_ms)
        self.reach = int(RATE * aec_reach_ms / 1000)
        self.gate_residue = gate_residue
        self.residue_margin_db = residue_margin_db
        self.double_talk = double_talk
        self.double_talk_margin_db = double_talk_margin_db
        self.linear_margin_db = linear_margin_db
        self._linear_partitions = max(1, round(RATE * linear_tail_ms / 1000 / FRAME))
        self._linear: _LinearEcho | None = None
        self._linear_shift = 0
        self._linear_erle = deque(maxlen=LINEAR_FRAMES)  # mic dB - linear output dB, echo-only frames
        self._linear_ok = False  # the linear model cancels enough to hand its output on
        self._talk_hold = 0  # frames the last double-talk decision still holds
        self._linear_run = 0  # frames in a row the linear check found the caller in
        self._talk_run = 0  # frames in a row judged double talk
        self._far_since: int | None = None  # sample clock: since when the bot's audio is in the echo's search range
        self._since_talk = ADAPT_AFTER  # frames since the caller was last heard over the bot
        self._mic_levels = deque(maxlen=300)  # mic dB of the last frames: the noise floor's estimate
        self._floor_db = _FLOOR_DB
        self._estimate_every = int(RATE * estimate_every_s)
        self._since_estimate = 0
        history = self.delay.max_lag + self.delay.window + RATE
        self._ref = _Ring(history)
        self._mic = _Ring(self.delay.window + RATE)
        self._far_at = _Stream(resync_s=0.25)
        self._near_at = _Capture()
        self._far_rs = _Resampler()
        self._near_rs = _Resampler()
        self._pending = np.zeros(0, np.float32)  # near samples short of a 10 ms frame
        self._pending_at = 0  # absolute index of _pending[0]
        self._shift = 0  # samples the reference is delayed by before AEC3
        self._erl = deque(maxlen=200)  # mic dB - loudest reference dB, frames with the bot arriving
        # mic dB - cleaned dB, the last echo-only frames: short, because AEC3 cancels in phases (it
        # mutes everything at first, lets echo through while it converges, then cancels well)
        self._erle = deque(maxlen=30)
        self._erle_long = deque(maxlen=300)  # the same over ~3 s of echo: what a converged AEC3 does
        # (sample clock, dB above the residue the gate expects) of each audible frame handed on
        self._margins: deque[tuple[int, float]] = deque(maxlen=MARGIN_FRAMES)
        self._margin = NO_ECHO_DB  # the frame being judged's
        self._last_far = -TAIL  # sample clock of the last frame the bot's audio was arriving in
        self._residue_db = _FLOOR_DB  # the residue the gate expected there (predicted - erle)
        self.stats = EchoStats()

    # ---------------------------------------------------------------- far end

    def far(self, pcm: bytes, sample_rate: int, t: float | None = None) -> None:
        """The bot's audio (int16 mono at ``sample_rate``) that starts playing at ``t`` (clock time)."""
        c0 = time.thread_time()
        x = self._far_rs(pcm, sample_rate)
        if x.size:
            at = self._far_at.place(self._clock() if t is None else t, len(x))
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
        at = self._near_at.place(end_t, len(x))
        self._pending_at = at - len(self._pending)  # the clock may have moved: the unfinished frame with it
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
        r16 = (np.clip(ref, -1, 1) * 32767).astype(np.int16)
        m16 = (np.clip(mic, -1, 1) * 32767).astype(np.int16)
        out = np.asarray(self._aec.process(m16, r16), np.int16).reshape(-1).astype(np.float32) / 32768.0
        self.stats.frames += 1
        self._margin = NO_ECHO_DB
        judged = self._judge(at, mic, out)
        if self.delay.delay is None and self.stats.far_frames >= ABSENT_FRAMES:
            # No echo found in seconds of the bot talking: headphones, or a device that cancels
            # its own. AEC3 (never converged) would still duck a caller who talks over the bot,
            # so the caller's audio passes as it came; AEC3 keeps running should echo appear.
            judged, self._margin = mic, NO_ECHO_DB
        if _db(judged) > self._floor_db + 10.0:  # audible: what a VAD downstream may take for speech
            self._margins.append((at, self._margin))
        return judged

    def caller_margin_db(self, seconds: float) -> float | None:
        """How surely the audio handed on over the last ``seconds`` is the caller, not the bot's echo:
        the median, over its audible frames, of how far each was above the echo residue the gate
        expects (``NO_ECHO_DB`` where no echo can be: no bot audio arriving, none located, double
        talk). None when nothing audible was handed on.

        What it is for: a VAD run over the bot's echo may be the caller or what is left of the echo,
        and their lengths overlap (a speakerphone call's residue runs 60-390 ms, a caller's "Wait,"
        130-220 ms), but their levels do not as much: the caller's frames stand well above the
        residue the gate lets through (docs/BENCHMARKS.md, "Echo").
        """
        margins = list(self._margins)  # one copy: near() may append on another thread (agent.pipecat_echo)
        if not margins:
            return None
        last = margins[-1][0]
        recent = [m for at, m in margins if at > last - seconds * RATE]
        return float(np.median(recent)) if recent else None

    def surely_caller(self, seconds: float) -> bool:
        """Whether the last ``seconds`` of the audio handed on stood clear of what the bot's echo can
        leave (``SURE_DB`` above the residue the gate expects, or no echo possible): a VAD run in it
        is the caller, not echo residue. Each framework's adapter asks it before a VAD run may stop
        the bot."""
        margin = self.caller_margin_db(seconds)
        return margin is None or margin >= SURE_DB

    def _estimate(self, now: int) -> None:
        """Re-estimate the bulk delay from the last window, when the bot was audible in it."""
        d = self.delay
        ref = self._ref.read(now - d.window - d.max_lag, now)
        if _db(ref[-d.window :]) < -50.0:
            return
        if d.delay is not None and self._since_talk < d.window // FRAME:
            # the caller talked over the bot within the window: their speech can put a false peak
            # up, twice in a row, and moving the delay then would cost the caller the linear model
            return
        near = self._mic.read(now - d.window, now)
        adopted = d.update(near, ref)
        self.stats.false_firsts = d.refused_firsts
        if adopted is not None:
            delay, confidence = adopted
            self._retarget(delay)
            self._erl.clear()  # levels measured against the old delay's reference are not this one's
            self._erle.clear()
            self._erle_long.clear()
            self.stats.delay_ms = 1000.0 * delay / RATE
            self.stats.delay_updates += 1
            self.stats.delay_history.append((now / RATE, self.stats.delay_ms, round(confidence, 1)))
            del self.stats.delay_history[:-HISTORY]  # a long call keeps the last ones

    def _retarget(self, delay: int) -> None:
        """Shift the reference only when AEC3 cannot reach the delay from where it is.

        Each shift makes AEC3 converge again, cancelling weakly meanwhile (how long it takes:
        docs/BENCHMARKS.md, "Echo: the agent's own voice (issue 18)"), so a delay that
        AEC3 already covers (``reach``, with a little room on the near side) keeps the shift it has;
        one out of reach gets a shift that puts it mid-reach, where drift has room both ways.
        """
        residual = delay - self._shift
        if not RATE // 50 <= residual <= self.reach:
            shift = max(0, delay - self.reach // 2)
            if shift != self._shift:
                self._shift = shift
                # AEC3 re-finds a moved delay slowly (seconds of weak cancellation here); a new one
                # converges as at the call's start (pywebrtc-audio's reset() left it diverged here)
                self._aec = self._aec_factory()

    def _late_echo(self, at: int) -> float:
        """How much of the last ``LATE_WINDOW`` of microphone is the bot's audio from a lag later than
        the located delay (beyond its spread, to the search range's end): the largest normalised
        correlation with the reference over those lags (echo through a room: high; a caller: low)."""
        return self._bot_corr(at, (self.delay.delay or 0) + SPREAD + 1, self.delay.max_lag, LATE_WINDOW)

    def _bot_corr(self, at: int, lo: int, hi: int, window: int) -> float:
        """The largest normalised correlation of the microphone's last ``window`` samples (to the end
        of the frame at ``at``) with the bot's audio at a lag from ``lo`` to ``hi`` samples: near 1 for
        echo through a room, low for a caller's speech, which the bot's does not predict."""
        lo, hi = max(0, lo), min(self.delay.max_lag, hi)
        if hi < lo:
            return 0.0
        end = at + FRAME
        near = self._mic.read(end - window, end).astype(np.float64)
        ref = self._ref.read(end - window - hi, end - lo).astype(np.float64)
        span = hi - lo
        size = 1 << int(np.ceil(np.log2(len(ref))))
        corr = np.fft.irfft(np.conj(np.fft.rfft(near, size)) * np.fft.rfft(ref, size), size)[: span + 1]
        # corr[k]: near against ref[k : k + window], the lag hi - k; its energy by cumulative sums
        c = np.concatenate([[0.0], np.cumsum(ref * ref)])
        energy = c[window : window + span + 1] - c[: span + 1]
        norm = np.sqrt(energy * float(near @ near)) + 1e-12
        return float(np.max(np.abs(corr) / norm))

    def _coherence(self, at: int, mic_db: float, out_db: float) -> float | None:
        """How much an audible frame that AEC3 removed little from is the bot's echo (``_bot_corr``
        around the located delay, over the whole search range before); None for any other frame."""
        if mic_db <= self._floor_db + 10.0 or mic_db - out_db >= COHERE_DB:
            return None
        delay = self.delay.delay
        if delay is None and self.stats.far_frames >= ABSENT_FRAMES:
            return None  # no echo found: the caller's audio passes as it came (_frame), nothing to tell apart
        lo, hi = (0, self.delay.max_lag) if delay is None else (delay - SPREAD, delay + SPREAD)
        return self._bot_corr(at, lo, hi, COHERE_WINDOW)

    def _loudest_db(self, at: int) -> float:
        """The loudest 10 ms of the bot that may be arriving as echo at ``at``.

        Around the estimated delay (± ``SPREAD``: an estimate is seldom that far off, and a room's
        tail adds to it), or over the whole search range while the echo is not located. A maximum,
        not the level at one lag, so a wrong estimate makes the gate stricter, never blind.
        """
        delay = self.delay.delay
        lo, hi = (self.delay.max_lag, 0) if delay is None else (delay + SPREAD, max(0, delay - SPREAD))
        span = (lo - hi) // FRAME * FRAME + FRAME
        blocks = self._ref.read(at - hi + FRAME - span, at - hi + FRAME).reshape(-1, FRAME)
        p = float(np.max(np.einsum("ij,ij->i", blocks, blocks))) / FRAME  # each block's mean square
        return 10.0 * np.log10(p) if p > 1e-9 else _FLOOR_DB

    def _erle_now(self) -> float:
        """What AEC3 removes now. Until it has converged (a fresh canceller lets echo through for a
        while before it cancels well) pessimistically, a low percentile of the last frames; once it
        has, the median of the last seconds, so a caller talking over the bot (whose frames look
        like echo that was not removed) does not talk the gate into muting them too."""
        if len(self._erle_long) >= CONVERGED_FRAMES and float(np.median(self._erle_long)) >= CONVERGED_DB:
            return float(np.median(self._erle_long))
        return float(np.percentile(self._erle, 10)) if len(self._erle) >= MIN_MEASURED else 0.0

    def _judge(self, at: int, mic: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Track ERL/ERLE on echo-only frames; pass the caller over the bot, mute echo residue (module docstring).

        Until enough echo-only frames are measured (the call's first bot audio, a moved delay) the
        echo is assumed as loud as the bot and not cancelled at all: a caller must then be louder
        than the bot itself to pass, for the first tenth of a second of echo that takes.
        """
        mic_db, out_db = _db(mic), _db(out)
        self._mic_levels.append(mic_db)
        if self.stats.frames % 10 == 0:  # the line's noise: a low percentile of the last seconds
            self._floor_db = float(np.percentile(self._mic_levels, 10))
        ref_db = self._loudest_db(at)
        if ref_db <= -60.0:
            self._linear_step(at, mic)  # its reference history stays continuous
            self._talk_hold = 0
            self._far_since = None
            if at - self._last_far < TAIL:  # the room's echo still rings: no surer than its last residue
                self._margin = out_db - self._residue_db
            if (
                self.gate_residue
                and self.delay.delay is not None
                and at - self._last_far < self.delay.max_lag  # the bot's last audio may still come back
                and mic_db > self._floor_db + 10.0
                and self._late_echo(at) >= LATE_CORR
            ):
                # its echo, come later than located: the path moved late meanwhile (a browser's
                # jitter buffer grows by hundreds of ms at a time), and the bot's last words came
                # back after the reference at the old delay went quiet (the page's traces: "Paris."
                # answered, the delay re-located 0.3 s too late; docs/BENCHMARKS.md, "Echo")
                self.stats.muted_frames += 1
                self.stats.late_frames += 1
                return np.zeros_like(out)
            return out  # no bot audio arriving: nothing to judge
        if at - self._last_far > REPLY_GAP:
            # the bot talks again after a silence, and the echo's path may have moved meanwhile (a
            # browser's jitter buffer starts each talk spurt afresh): what AEC3 removes is measured
            # again, pessimistically at first, as after a moved delay (the residue it leaves while
            # it follows the move cut a reply ~1 s in: docs/BENCHMARKS.md, "Echo")
            self._erle.clear()
            self._erle_long.clear()
        self.stats.far_frames += 1
        self._last_far = at
        if self._far_since is None:
            self._far_since = at
        # how loud the echo gets against the bot: a high percentile of the frames below (a caller
        # speaking is neither cancelled nor far below the bot, and stays out)
        erl = float(np.percentile(self._erl, 90)) if len(self._erl) >= MIN_MEASURED else 0.0
        erle = self._erle_now()  # frames AEC3 silenced outright say nothing of it: left out below
        predicted = ref_db + erl  # the loudest the echo may be at the mic
        echo_only = mic_db <= predicted + 3.0  # no louder than the echo
        linear = self._linear_step(at, mic)
        linear_erle = self._linear_erle_now() if linear is not None else None
        # before the echo is located, the frames that measured the ERL may be ones its delay had
        # not yet brought the echo back in (a call's first bot audio): the echo is then taken to
        # be as loud as the bot, as the gate takes it before it has measured anything
        # (and right after it is located, until the ERL is measured again on enough frames, no
        # frame is judged so: a few frames' percentile is too low a bound)
        loudest = predicted if self.delay.delay is not None else ref_db + max(erl, 0.0)
        if len(self._erl) < ERL_FRAMES:
            loudest = 0.0  # full scale: nothing is that far above it
        aec_passes = out_db >= predicted - erle + self.residue_margin_db  # AEC3 left more than residue
        # the caller is over the bot when the mic stands clear of the loudest echo, whether or not
        # the double-talk check hands that frame on: the delay estimate and the linear model must
        # not learn from it (a caller over a quiet echo put up false delays: BENCHMARKS, "Echo")
        over = mic_db > max(loudest, self._floor_db) + self.double_talk_margin_db
        talking = self.double_talk and self._caller_over_bot(over, mic_db, linear, linear_erle, aec_passes)
        corr = self._coherence(at, mic_db, out_db) if not over else None
        self._since_talk = 0 if talking or over else self._since_talk + 1
        self._talk_run = self._talk_run + 1 if talking else 0
        if self._talk_run > TALK_MAX and self._linear_ok:
            # "the caller" for this long, over the bot, is more likely the echo path changed under
            # the linear model (it then leaves echo that looks like a caller): it learns again
            self._linear_ok, self._talk_run = False, 0
            self._linear_erle.clear()
        # it learns from frames the caller is silent in: not between the words of an utterance
        # either, whose quiet frames look like echo to the levels and would pull it away, nor
        # from a single frame the linear check found the caller in
        if linear is not None and echo_only and self._since_talk >= ADAPT_AFTER and not self._linear_run:
            self._linear.adapt()
            if mic_db > self._floor_db + 15.0:  # echo to cancel in it, not the line's noise
                self._linear_erle.append(mic_db - _db(linear))
        # frames that bound the echo: AEC3 took most of it (mostly echo), or the mic is far quieter
        # than the bot (whatever echo there is lies below it: headphones, a good device canceller).
        # Only where the echo could be in them: once located, or after the bot's audio has been
        # arriving for the whole search range (on the sample clock: audio that arrives in bursts
        # brings more frames than time). Before, a quiet mic may just be an echo still on its way (a
        # phone's 0.7 s at a call's start): measured as "no echo", the gate then passed the echo
        settled = self.delay.delay is not None or at - self._far_since >= self.delay.max_lag
        if settled and (mic_db - out_db >= 6.0 or mic_db - ref_db <= -20.0):
            self._erl.append(max(mic_db, _FLOOR_DB + 5.0) - ref_db)
        if echo_only and out_db > _FLOOR_DB + 5.0 and (corr is None or corr >= CALLER_CORR):
            self._erle.append(mic_db - out_db)
            self._erle_long.append(mic_db - out_db)
        self.stats.erl_db = erl if len(self._erl) >= MIN_MEASURED else None
        self.stats.erle_db = erle if len(self._erle) >= MIN_MEASURED else None
        self.stats.linear_erle_db = linear_erle
        if talking:
            self.stats.talk_frames += 1
            # the caller's speech, without AEC3's suppressor: the linear model's output once it
            # cancels well, else the microphone itself (the echo is well below the caller then)
            return mic if linear_erle is None else linear
        if self.gate_residue and out_db < predicted - erle + self.residue_margin_db:
            self.stats.muted_frames += 1
            return np.zeros_like(out)
        if self.gate_residue and corr is not None and corr >= ECHO_CORR and self.delay.delay is not None:
            self.stats.muted_frames += 1
            self.stats.lost_frames += 1
            return np.zeros_like(out)
        self._residue_db = predicted - erle
        self._margin = out_db - self._residue_db
        return out

    def _caller_over_bot(
        self,
        over: bool,
        mic_db: float,
        linear: np.ndarray | None,
        linear_erle: float | None,
        aec_passes: bool,
    ) -> bool:
        """The double-talk check: is the caller speaking in this frame, over the bot's echo?

        Yes when ``over`` (the microphone well above the loudest echo the reference predicts:
        whatever echo is in it lies that far below the caller), or when the linear model's output is well
        above what it leaves of the echo on echo-only frames (the caller's speech is what it cannot
        predict). Neither prediction goes below the line's noise floor: noise is not a caller. A
        decision holds a while (``TALK_HOLD``): a word's quiet tail is the caller's too.

        The linear check is against the echo the model predicts in this frame (what it subtracted),
        which follows the echo closer than the loudest the reference allows, and its margin is
        wider: what the model leaves varies more from frame to frame than the echo does. It must
        hold two frames in a row to start a decision (a frame the model got wrong is seldom
        followed by another), and an output clearly louder than the microphone is the model adding
        what it wrongly predicted, not a caller (the caller's speech and the echo add up to the
        microphone, give or take their phases). AEC3 must agree in that frame (``aec_passes``: it
        left more than the residue the gate expects): the linear model is rigid, and a reference
        placed a few ms otherwise (a new turn, a resumed pause) leaves echo it takes for a caller,
        while AEC3 follows such a move itself. The hold bridges the caller's frames AEC3 ducks.
        """
        floor = self._floor_db
        talking = over  # the microphone clear of the loudest echo by the margin (computed by _judge)
        if not talking and linear is not None and linear_erle is not None:
            out_db = _db(linear)
            residue = max(self._linear.echo_db - linear_erle, floor)
            above = residue + self.linear_margin_db < out_db <= mic_db + 3.0
            self._linear_run = self._linear_run + 1 if above else 0
            talking = above and aec_passes and (self._linear_run >= 2 or self._talk_hold > 0)
        if talking:
            self._talk_hold = TALK_HOLD if linear_erle is None else TALK_HOLD_LINEAR
            return True
        if self._talk_hold:
            self._talk_hold -= 1
            return True
        return False

    def _linear_step(self, at: int, mic: np.ndarray) -> np.ndarray | None:
        """The linear model's output for this frame, once the echo is located (else None)."""
        delay = self.delay.delay
        if not self.double_talk or delay is None:
            return None
        shift = max(0, delay - LINEAR_LEAD)
        if self._linear is None or shift != self._linear_shift:
            self._linear, self._linear_shift = _LinearEcho(self._linear_partitions), shift
            self._linear_erle.clear()
            self._linear_ok = False
            self._pretrain(at, shift)
        ref = self._ref.read(at - shift, at - shift + FRAME)
        return self._linear.process(ref, mic)

    def _pretrain(self, at: int, shift: int) -> None:
        """Train a new linear model on the seconds of microphone and reference already held.

        A delay is located only after seconds of the bot's audio, and a caller may talk over the
        bot soon after: a model that starts learning then is not ready for them. The audio that
        located the delay is still in the rings, so the model learns from it at once (the caller
        is seldom talking over the bot in it: the delay's estimate would not have been sure).
        """
        lin, start = self._linear, max(at - PRETRAIN, self._mic.end - self._mic.size)
        frames = range(at - (at - start) // FRAME * FRAME, at, FRAME)
        for last in (False, True):  # twice over: it has only as much of the bot as it took to locate it
            for a in frames:
                ref, mic = self._ref.read(a - shift, a - shift + FRAME), self._mic.read(a, a + FRAME)
                out = lin.process(ref, mic)
                if _db(ref) > -60.0:
                    lin.adapt()
                mic_db = _db(mic)
                if last and mic_db > self._floor_db + 15.0:
                    self._linear_erle.append(mic_db - _db(out))

    def _linear_erle_now(self) -> float | None:
        """What the linear model removes from the echo, once it removes enough to rely on (else None)."""
        if len(self._linear_erle) < LINEAR_FRAMES:
            return None
        # relied on from a median of LINEAR_DB on, and no longer from a few dB below it (not on and
        # off from frame to frame; a few frames of a caller taken for echo do not talk the median
        # down); what it leaves is judged by its weaker frames, a low percentile
        erle = float(np.median(self._linear_erle))
        self._linear_ok = erle >= (LINEAR_DB - 3.0 if self._linear_ok else LINEAR_DB)
        return float(np.percentile(self._linear_erle, LINEAR_PCT)) if self._linear_ok else None


# ---------------------------------------------------------------- transcripts

_WORD = re.compile(r"[a-z0-9']+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def echo_transcript(transcript: str, played: str, *, min_words: int = 2, share: float = 0.8, prefix: int = 3) -> bool:
    """Whether ``transcript`` only repeats words the bot just played (``played``, the last seconds of its text).

    True when it has at least ``min_words`` words and at least ``share`` of them appear, in order,
    in ``played``: what a microphone hears of a loudspeaker comes back as the bot's own words with
    a few misheard. A word of ``prefix`` letters or more matches a played word it begins: a segment cut
    mid-word comes back so ("The capital of..." echoed as "the cap.", answered as a caller's turn in
    a speakerphone test). One or two words of the caller's own ("yes", "Paris") are not judged echo.
    """
    said, heard = _words(transcript), _words(played)
    if len(said) < min_words or not heard:
        return False
    j = matched = 0
    for w in said:  # greedy in-order match: each heard word is used once
        k = j
        while k < len(heard) and heard[k] != w and not (len(w) >= prefix and heard[k].startswith(w)):
            k += 1
        if k < len(heard):
            matched += 1
            j = k + 1
    return matched >= share * len(said)


def residue_transcript(transcript: str, played: str, margin_db: float | None) -> bool:
    """Whether ``transcript`` is what Whisper made of the echo's residue: words heard while the audio
    handed on never stood clear of it (``margin_db``, :meth:`EchoCanceller.caller_margin_db` over the
    segment, under ``SURE_DB``) and three in five of them (``RESIDUE_SHARE``), in order, the bot's own.

    :func:`echo_transcript` asks for 80 %: a clear echo comes back as the bot's words. Residue comes
    back garbled: "I'm sorry for your loss." heard as "for your love.", "I'm sorry" as "I'm so
    prepared." (a page at 0 dB; each answered as the caller's turn, the bot stopping for its own
    voice; docs/BENCHMARKS.md, "Echo"). That is not enough to judge a caller by on the words alone (a
    caller takes up the bot's words: "I would rather take the train." after "the train or the bus?"
    shares half of them), so only where the audio also says residue: a caller's words over the bot
    measured 21-51 dB above it. Half would drop that caller wherever AEC3 ducks them; 60 % does not.
    Whisper's stock phrases for sounds it cannot read (``WHISPER_STOCK``: "Thank you.") count as
    residue there too, whatever the bot said.
    """
    if margin_db is None or margin_db >= SURE_DB:
        return False
    if " ".join(_words(transcript)) in WHISPER_STOCK:
        return True
    return echo_transcript(transcript, played, share=RESIDUE_SHARE, prefix=2)


# What Whisper says when it hears no words it knows (it learnt from subtitles): "Thank you." on the
# echo's residue stopped the bot at the page (0 dB) and in the LiveKit worker (docs/BENCHMARKS.md,
# "Echo"). Judged so only by residue_transcript: under the bot, from audio that never stood clear of it.
WHISPER_STOCK = frozenset({"thank you", "thank you very much", "thanks for watching", "thank you for watching", "bye"})
