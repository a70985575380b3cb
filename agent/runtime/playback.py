"""Playback sinks: where the agent's audio goes after the jitter buffer.

Why a protocol: barge-in must silence the bot *now*, and the last buffer before the caller's ear
(a WebRTC track queue, a phone socket, LiveKit's ``AudioSource``) is the one that decides how
much stale audio still plays. Every sink therefore exposes the same three things: ``write`` a
frame, ``flush`` what is queued, and say how much is queued (``queued_ms``), so the barge-in
controller can flush and measure any of them the same way. Framework sinks live in their plug-in
modules; this module has the two that need nothing: :class:`ArraySink`, a simulated real-time
device for tests, and :class:`WavFileSink`.

Audio is mono (or interleaved) little-endian int16 PCM bytes throughout.
"""

from __future__ import annotations

import os
import wave
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

__all__ = ["ArraySink", "PlaybackSink", "PlayedSpan", "WavFileSink"]


@runtime_checkable
class PlaybackSink(Protocol):
    """The last buffer before the listener.

    ``flush()`` drops everything queued but not yet played, immediately, and returns the
    **milliseconds** of audio dropped (milliseconds rather than samples so callers need not know
    the sink's rate; exact, not rounded, where the sink knows: a pause that must resume on the
    very next sample converts it back to samples, and reading ``queued_ms`` first is not enough,
    the device plays on between the two calls). ``queued_ms`` is audio accepted by ``write``
    but not yet played.
    """

    def write(self, frame: bytes) -> None: ...

    def flush(self) -> float: ...

    @property
    def queued_ms(self) -> float: ...


@dataclass(frozen=True, slots=True)
class PlayedSpan:
    """A contiguous piece of audio the simulated device played, and when (sink clock, s)."""

    start_s: float
    samples: np.ndarray  # int16, interleaved if channels > 1

    def end_s(self, sample_rate: int, channels: int = 1) -> float:
        return self.start_s + self.samples.size / channels / sample_rate


class ArraySink:
    """A simulated sound device that consumes queued audio in real time.

    Time comes from ``clock`` (seconds). Without one, the sink keeps its own manual clock,
    starting at 0 and moved only by :meth:`advance`, which makes tests exact. Before every
    operation the device first "plays" whatever the elapsed time allows, so ``flush()`` drops
    exactly the audio that had not been heard yet, and :attr:`played` records what was heard and
    when. When the queue runs dry the device idles; the next write starts playing at once.
    """

    def __init__(
        self,
        sample_rate: int,
        *,
        channels: int = 1,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if sample_rate <= 0 or channels <= 0:
            raise ValueError("sample_rate and channels must be > 0")
        self.sample_rate = sample_rate
        self.channels = channels
        self._manual = clock is None
        self._manual_now = 0.0
        self._clock = clock if clock is not None else (lambda: self._manual_now)
        self._queue: deque[np.ndarray] = deque()
        self._queued = 0  # samples (all channels)
        # a run: uninterrupted playout since the device last started; counted in whole frames
        # from its start time so that float clocks never drift the sample grid
        self._run_start: float | None = None
        self._run_frames = 0
        self.played: list[PlayedSpan] = []
        self.flushes: list[tuple[float, int]] = []  # (time, dropped ms)
        self.written_samples = 0

    # -- PlaybackSink -------------------------------------------------------------------

    def write(self, frame: bytes) -> None:
        self._play_until(self._clock())
        if len(frame) % (2 * self.channels):
            raise ValueError(f"frame of {len(frame)} bytes is not whole int16 x {self.channels}")
        samples = np.frombuffer(frame, dtype="<i2").astype(np.int16)
        if samples.size == 0:
            return
        if self._queued == 0:  # idle device starts playing now
            self._run_start = self._clock()
            self._run_frames = 0
        self._queue.append(samples)
        self._queued += samples.size
        self.written_samples += samples.size

    def flush(self) -> float:
        """Drop all unplayed audio now; returns the dropped milliseconds (exact)."""
        now = self._clock()
        self._play_until(now)
        dropped_ms = self._ms(self._queued)
        self._queue.clear()
        self._queued = 0
        self._run_start = None
        self.flushes.append((now, dropped_ms))
        return dropped_ms

    @property
    def queued_ms(self) -> float:
        self._play_until(self._clock())
        return self._ms(self._queued)

    # -- simulation ---------------------------------------------------------------------

    def advance(self, ms: float) -> None:
        """Move the manual clock forward by ``ms`` and play what that time allows."""
        if not self._manual:
            raise RuntimeError("advance() drives the manual clock; this sink was given a clock")
        if ms < 0:
            raise ValueError("time does not run backwards")
        self._manual_now += ms / 1000.0
        self._play_until(self._manual_now)

    @property
    def now(self) -> float:
        return self._clock()

    def played_audio(self) -> np.ndarray:
        """Everything played so far, concatenated (gaps while idle are not included)."""
        if not self.played:
            return np.zeros(0, dtype=np.int16)
        return np.concatenate([span.samples for span in self.played])

    def played_after(self, t: float) -> int:
        """Samples (per channel) played at or after sink time ``t``; 0 means silent since."""
        frames = 0
        for span in self.played:
            n = span.samples.size // self.channels
            start = max(0, int(np.ceil((t - span.start_s) * self.sample_rate - 1e-9)))
            frames += max(0, n - start)
        return frames

    def _play_until(self, now: float) -> None:
        if self._run_start is None:
            return
        elapsed = int((now - self._run_start) * self.sample_rate + 1e-9)
        due = (elapsed - self._run_frames) * self.channels
        if due <= 0:
            return
        start = self._run_start + self._run_frames / self.sample_rate
        take = min(due, self._queued)
        pieces = []
        left = take
        while left:
            head = self._queue[0]
            if head.size <= left:
                pieces.append(self._queue.popleft())
                left -= head.size
            else:
                pieces.append(head[:left])
                self._queue[0] = head[left:]
                left = 0
        self._queued -= take
        self._run_frames += take // self.channels
        if self._queued == 0:
            self._run_start = None  # ran dry: the device idles until the next write
        self.played.append(PlayedSpan(start, np.concatenate(pieces)))

    def _ms(self, samples: int) -> float:
        return 1000.0 * samples / self.channels / self.sample_rate


class WavFileSink:
    """Writes every frame straight to a 16-bit WAV file.

    A file consumes audio instantly, so nothing is ever queued: ``flush()`` returns 0 and
    ``queued_ms`` is 0. Use as a context manager or call :meth:`close` to finalise the header.
    """

    def __init__(self, path: str | os.PathLike[str], sample_rate: int, *, channels: int = 1) -> None:
        self.path = os.fspath(path)
        self.sample_rate = sample_rate
        self.channels = channels
        self._wav: wave.Wave_write | None = wave.open(self.path, "wb")
        self._wav.setnchannels(channels)
        self._wav.setsampwidth(2)
        self._wav.setframerate(sample_rate)
        self.written_samples = 0

    def write(self, frame: bytes) -> None:
        if self._wav is None:
            raise RuntimeError(f"{self.path} is closed; create a new WavFileSink")
        if len(frame) % (2 * self.channels):
            raise ValueError(f"frame of {len(frame)} bytes is not whole int16 x {self.channels}")
        self._wav.writeframes(frame)
        self.written_samples += len(frame) // 2

    def flush(self) -> float:
        return 0.0

    @property
    def queued_ms(self) -> float:
        return 0.0

    @property
    def duration_ms(self) -> float:
        return 1000.0 * self.written_samples / self.channels / self.sample_rate

    def close(self) -> None:
        if self._wav is not None:
            self._wav.close()
            self._wav = None

    def __enter__(self) -> WavFileSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
