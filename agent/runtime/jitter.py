"""Adaptive jitter buffer between the TTS client and a playback sink.

Why: TTS frames cross a network (and a busy server) with uneven delays, while a playback device
consumes audio at a fixed rate. A buffer that is too thin plays gaps (underruns); one that is too
deep delays the first word and everything after it. The right depth depends on the link, so it
is learned:

* **starts thin** (``initial_ms``, e.g. 40 ms) so the first frame of a reply plays fast;
* **grows by** ``grow_step_ms`` on every underrun - or by the length of the stall, when audio
  came back later than that - up to ``max_ms``, and re-primes (waits until
  the new target is buffered) before playing again, so one bad moment is not followed by a
  stutter of tiny gaps;
* **shrinks slowly**, by ``shrink_step_ms`` (or a third of the margin a whole period left
  unused, when that is more) after ``shrink_after_s`` of played audio with a
  sustained surplus, down to ``min_ms``. Surplus is judged on the *cushion*: the depth the buffer
  would have now had it been primed at the current target (``depth - primed + target``). The raw
  depth would mislead: it keeps whatever level playback started at, so on a clean link it stays
  above any smaller target forever. ``min_ms`` doubles as the floor for the cushion: a cushion
  below it while the real depth is still above it is a *near miss* (a stream primed at the
  target would have come within ``min_ms`` of running dry, this one started deeper) and grows the
  target like an underrun, without an audible gap; a surplus means
  the cushion stayed at or above ``min_ms + shrink_step_ms`` for the whole period, so one step
  less would still have kept the floor.
* **hysteresis in time**: each grow doubles the surplus period needed for the next shrink (up to
  16 x ``shrink_after_s``), each shrink divides it by ``2 ** (shrink_step / grow_step)``, so the
  shrinks that undo one grow also undo its doubling. Without this, a link with stalls every few
  seconds sees the target creep down in the quiet spells and underrun at the next stall (a
  saw-tooth of periodic gaps); with it the target settles just above the worst recent stall.
  The surplus count is kept across replies and flushes (both say nothing about the link).
* **flush()** empties it at once (barge-in), **end_of_stream()** lets the tail play out without
  it being mistaken for an underrun.

Depth above the target is never thrown away: it is either the producer's deliberate lead (the
TTS server paces a bounded lead ahead of real time, which flush makes cancel-safe) or delay left
by an earlier stall, which could only be reclaimed by dropping or time-stretching speech. A
smaller target takes effect at the next priming: the next reply, or after an underrun.

Everything is measured in milliseconds of audio, not frames, because frame sizes differ between
servers and transports. The buffer is pure logic: no asyncio, no threads, an injectable clock
(or explicit ``now=`` arguments), so tests replay a simulated link deterministically. Not
thread-safe; drive it from one task.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = ["AdaptiveJitterBuffer", "JitterState", "JitterStats"]

# The surplus period needed for a shrink doubles on each grow, up to this factor of
# shrink_after_s, and decays on each shrink (see _track_surplus).
_MAX_HOLD_FACTOR = 16.0


class JitterState(enum.Enum):
    IDLE = "idle"  # no stream: nothing buffered, silence out, not an underrun
    PRIMING = "priming"  # stream started, waiting for the target depth before the first sample
    PLAYING = "playing"
    REBUFFERING = "rebuffering"  # ran dry mid-stream; silence out counts as underrun


@dataclass(frozen=True, slots=True)
class JitterStats:
    """A snapshot of the buffer's figures (all durations in ms of audio or of clock time)."""

    state: JitterState
    depth_ms: float
    target_ms: float
    underruns: int  # times it ran dry mid-stream
    near_misses: int  # times a stream primed at the target would have come within min_ms of it
    underrun_ms: float  # silence inserted because of them (including re-priming)
    added_latency_ms: float  # push -> pull time of the last sample pulled
    mean_added_latency_ms: float  # averaged over every sample pulled
    max_added_latency_ms: float
    flushed_ms: float  # audio dropped by flush(), in total


class AdaptiveJitterBuffer:
    """Mono int16 PCM jitter buffer with a target depth that adapts to the link."""

    def __init__(
        self,
        *,
        sample_rate: int,
        initial_ms: float = 40.0,
        min_ms: float = 20.0,
        max_ms: float = 400.0,
        grow_step_ms: float = 40.0,
        shrink_step_ms: float = 10.0,
        shrink_after_s: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if sample_rate <= 0:
            raise ValueError(f"sample_rate must be > 0, got {sample_rate}")
        if not 0 <= min_ms <= initial_ms <= max_ms:
            raise ValueError(f"need 0 <= min_ms <= initial_ms <= max_ms, got {min_ms}, {initial_ms}, {max_ms}")
        if grow_step_ms <= 0 or shrink_step_ms <= 0 or shrink_after_s <= 0:
            raise ValueError("grow_step_ms, shrink_step_ms and shrink_after_s must be > 0")
        self.sample_rate = sample_rate
        self.initial_ms = initial_ms
        self.min_ms = min_ms
        self.max_ms = max_ms
        self.grow_step_ms = grow_step_ms
        self.shrink_step_ms = shrink_step_ms
        self.shrink_after_s = shrink_after_s
        self._clock = clock
        # the shrinks that undo one grow (grow/shrink of them) undo its doubling of the hold
        self._hold_decay = 2.0 ** (-shrink_step_ms / grow_step_ms)
        self.reset()

    # ------------------------------------------------------------------ lifecycle

    def reset(self) -> None:
        """Back to the freshly constructed state: empty, initial target, zeroed figures."""
        self._chunks: deque[np.ndarray] = deque()
        self._pushed_at: deque[float] = deque()  # push time of each chunk, same order
        self._head = 0  # samples of _chunks[0] already pulled
        self._depth = 0  # samples buffered
        self._target = self._samples(self.initial_ms)
        self._state = JitterState.IDLE
        self._ended = False
        self._primed = 0  # depth when playback last (re)started
        self._surplus_s = 0.0  # audio played with a surplus cushion, uninterrupted
        self._underruns = 0
        self._near_misses = 0
        self._dry_at: float | None = None  # when the buffer ran dry, until the next push
        self._min_cushion: int | None = None  # lowest cushion of the current surplus period
        self._hold_s = self.shrink_after_s  # current surplus period needed to shrink
        self._underrun_samples = 0
        self._last_latency_s = 0.0
        self._latency_sum_s = 0.0  # sum over pulled samples of their latency
        self._latency_count = 0
        self._max_latency_s = 0.0
        self._flushed_samples = 0

    def push(self, pcm: bytes | bytearray | memoryview | np.ndarray, now: float | None = None) -> None:
        """Append audio: int16 little-endian bytes, an int16 array, or floats in [-1, 1].

        Pushing after :meth:`end_of_stream` continues the stream (the end mark is cleared).
        """
        samples = _to_int16(pcm)
        if samples.size == 0:
            return
        now = self._clock() if now is None else now
        if self._dry_at is not None:
            # The first audio after an underrun: the stall lasted this long. One fixed step may
            # be far less than that (a burst of late frames); grow by the stall itself, so the
            # same stall is covered next time instead of costing several more underruns.
            stall_ms = 1000.0 * (now - self._dry_at) - self.grow_step_ms
            if stall_ms > 0:
                self._target = min(self._samples(self.max_ms), self._target + self._samples(stall_ms))
            self._dry_at = None
        self._chunks.append(samples)
        self._pushed_at.append(now)
        self._depth += samples.size
        self._ended = False
        if self._state is JitterState.IDLE:
            self._state = JitterState.PRIMING

    def end_of_stream(self) -> None:
        """No more audio for this stream: play the tail out, even below target, no underrun."""
        if self._state is not JitterState.IDLE:
            self._ended = True

    def flush(self) -> float:
        """Drop everything buffered, now. Returns the milliseconds of audio dropped.

        The target is kept (it describes the link, not the utterance); the next push primes a
        new stream.
        """
        dropped = self._depth
        self._chunks.clear()
        self._pushed_at.clear()
        self._head = 0
        self._depth = 0
        self._state = JitterState.IDLE
        self._ended = False
        self._flushed_samples += dropped
        # the surplus count survives: a barge-in says nothing about the link
        return self._ms(dropped)

    # ------------------------------------------------------------------ playout

    def pull(self, n_samples: int, now: float | None = None) -> tuple[np.ndarray, bool]:
        """Take exactly ``n_samples`` int16 samples for the sink.

        Returns ``(samples, underrun)``. Missing audio is zero-filled. ``underrun`` is True when
        the block contains silence inserted because the stream ran dry mid-way (or is
        re-priming after that); silence while idle, during the first priming, or after
        :meth:`end_of_stream` is not an underrun.
        """
        if n_samples < 0:
            raise ValueError(f"n_samples must be >= 0, got {n_samples}")
        now = self._clock() if now is None else now
        out = np.zeros(n_samples, dtype=np.int16)

        if self._state in (JitterState.PRIMING, JitterState.REBUFFERING):
            # a block bigger than the target would otherwise start with a gap at once
            if self._depth >= max(self._target, n_samples) or (self._ended and self._depth > 0):
                self._state = JitterState.PLAYING
                self._primed = self._depth
            elif self._ended:  # ended with nothing left
                self._end_stream()
                return out, False
            else:
                if self._state is JitterState.REBUFFERING:
                    self._underrun_samples += n_samples
                    return out, True
                return out, False
        if self._state is JitterState.IDLE:
            return out, False

        take = min(n_samples, self._depth)
        self._copy_out(out, take, now)
        if take < n_samples:
            if self._ended:
                self._end_stream()
                return out, False
            self._underruns += 1
            self._underrun_samples += n_samples - take
            self._grow()
            self._dry_at = now - (n_samples - take) / self.sample_rate  # when the buffer ran dry
            self._state = JitterState.REBUFFERING
            return out, True
        if self._ended:
            # the tail draining is not a property of the link: no surplus or near-miss tracking
            if self._depth == 0:
                self._end_stream()
        else:
            self._track_surplus(n_samples)
        return out, False

    def _copy_out(self, out: np.ndarray, take: int, now: float) -> None:
        pos = 0
        while pos < take:
            chunk = self._chunks[0]
            n = min(take - pos, chunk.size - self._head)
            out[pos : pos + n] = chunk[self._head : self._head + n]
            latency = max(0.0, now - self._pushed_at[0])
            if pos == 0:
                self._last_latency_s = latency
            self._latency_sum_s += latency * n
            self._latency_count += n
            self._max_latency_s = max(self._max_latency_s, latency)
            pos += n
            self._head += n
            if self._head == chunk.size:
                self._chunks.popleft()
                self._pushed_at.popleft()
                self._head = 0
        self._depth -= take

    def _track_surplus(self, played: int) -> None:
        # cushion: the depth we would have now, had playback started at the current target
        cushion = self._depth - self._primed + self._target
        floor = self._samples(self.min_ms)
        if cushion < floor <= self._depth:
            # a near miss: primed at the current target, this stream would have come within
            # min_ms of running dry, though the real buffer did not (it started deeper). Grow
            # as for an underrun, or the next stream will underrun. When the real buffer is
            # this low too, a real underrun (or not) decides: growing here would count twice.
            self._near_misses += 1
            self._grow()
            return
        if cushion < floor + self._samples(self.shrink_step_ms):
            # one step smaller would have gone below the floor: no surplus
            self._surplus_s = 0.0
            self._min_cushion = None
            return
        self._surplus_s += played / self.sample_rate
        self._min_cushion = cushion if self._min_cushion is None else min(self._min_cushion, cushion)
        if self._surplus_s >= self._hold_s:
            # Give back a third of the margin the whole period never touched (at least one step):
            # a clean link after a bad spell sheds a 300 ms target in a few periods, a link that
            # still dips close to the floor only by single steps.
            spare = max(self._samples(self.shrink_step_ms), (self._min_cushion - floor) // 3)
            self._target = max(self._samples(self.min_ms), self._target - spare)
            self._hold_s = max(self.shrink_after_s, self._hold_s * self._hold_decay)
            self._surplus_s = 0.0
            self._min_cushion = None

    def _grow(self) -> None:
        self._target = min(self._samples(self.max_ms), self._target + self._samples(self.grow_step_ms))
        # a shrink that ends in a grow was premature: wait longer before the next one
        self._hold_s = min(self.shrink_after_s * _MAX_HOLD_FACTOR, self._hold_s * 2)
        self._surplus_s = 0.0
        self._min_cushion = None

    def _end_stream(self) -> None:
        self._state = JitterState.IDLE
        self._ended = False

    # ------------------------------------------------------------------ figures

    @property
    def state(self) -> JitterState:
        return self._state

    @property
    def depth_ms(self) -> float:
        return self._ms(self._depth)

    @property
    def target_ms(self) -> float:
        return self._ms(self._target)

    @property
    def underruns(self) -> int:
        return self._underruns

    @property
    def near_misses(self) -> int:
        return self._near_misses

    @property
    def underrun_ms(self) -> float:
        return self._ms(self._underrun_samples)

    @property
    def added_latency_ms(self) -> float:
        """Push -> pull time of the first sample of the last pull that had audio."""
        return 1000.0 * self._last_latency_s

    @property
    def mean_added_latency_ms(self) -> float:
        return 1000.0 * self._latency_sum_s / self._latency_count if self._latency_count else 0.0

    def stats(self) -> JitterStats:
        return JitterStats(
            state=self._state,
            depth_ms=self.depth_ms,
            target_ms=self.target_ms,
            underruns=self._underruns,
            near_misses=self._near_misses,
            underrun_ms=self.underrun_ms,
            added_latency_ms=self.added_latency_ms,
            mean_added_latency_ms=self.mean_added_latency_ms,
            max_added_latency_ms=1000.0 * self._max_latency_s,
            flushed_ms=self._ms(self._flushed_samples),
        )

    def _samples(self, ms: float) -> int:
        return round(ms * self.sample_rate / 1000.0)

    def _ms(self, samples: int) -> float:
        return 1000.0 * samples / self.sample_rate


def _to_int16(pcm: bytes | bytearray | memoryview | np.ndarray) -> np.ndarray:
    if isinstance(pcm, (bytes, bytearray, memoryview)):
        if len(pcm) % 2:
            raise ValueError("int16 PCM bytes must have an even length")
        return np.frombuffer(pcm, dtype="<i2").astype(np.int16)
    arr = np.asarray(pcm)
    if arr.ndim != 1:
        raise ValueError(f"expected mono 1-D audio, got shape {arr.shape}")
    if arr.dtype == np.int16:
        return arr.copy()
    if arr.dtype.kind == "f":
        return (np.clip(arr, -1.0, 1.0) * 32767.0).astype(np.int16)
    raise TypeError(f"expected int16 or float audio, got dtype {arr.dtype}")
