"""A simulated real-time player with a small jitter buffer, run over recorded arrival times.

A listener hears a stream only as well as its worst gap: audio that arrives after the moment
it should have played is an *underrun* (a click, a stall). The player here is what a voice
agent's output does: wait until ``prebuffer_s`` of audio is buffered (or the stream has ended),
then play continuously; when the buffer runs dry, stall and re-buffer to ``prebuffer_s`` before
resuming. Underruns are counted only after playback has started ("after the first frame"): the
wait for first audio is TTFB, measured separately.

It is computed offline from ``(arrival time, duration)`` pairs, so the bench's own event loop
being busy cannot distort playback, and the accounting is testable with hand-built arrivals.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Arrival:
    t: float  # arrival time, seconds (any clock)
    duration: float  # seconds of audio in the frame


@dataclass(frozen=True, slots=True)
class PlayerResult:
    started_at: float | None  # when playback began (None: no audio)
    ended_at: float | None  # when the last sample played
    audio_s: float
    underruns: int
    underrun_s: float
    max_buffer_s: float  # most audio ever waiting in the buffer (a burst shows here)

    @property
    def underrun_ms(self) -> float:
        return 1000.0 * self.underrun_s


def simulate(arrivals: Sequence[Arrival], prebuffer_s: float = 0.08) -> PlayerResult:
    """Play ``arrivals`` (in arrival order) in real time; count stalls after playback starts."""
    n = len(arrivals)
    if n == 0:
        return PlayerResult(None, None, 0.0, 0, 0.0, 0.0)
    total = sum(a.duration for a in arrivals)
    underruns = 0
    underrun_s = 0.0
    max_buffer = 0.0

    def fill(i: int) -> tuple[int, float, float]:
        """Buffer from frame ``i`` until ``prebuffer_s`` (or the end): (next index, start time, buffered)."""
        buffered = 0.0
        t = arrivals[i].t
        while i < n:
            t = max(t, arrivals[i].t)
            buffered += arrivals[i].duration
            i += 1
            if buffered >= prebuffer_s - 1e-9:
                break
        return i, t, buffered

    i, now, level = fill(0)
    started = now
    max_buffer = level
    while i < n:
        a = arrivals[i]
        dry_at = now + level
        if a.t <= dry_at + 1e-9:  # arrived before the buffer ran dry: keep playing
            level -= max(0.0, a.t - now)
            now = max(now, a.t)
            level += a.duration
            max_buffer = max(max_buffer, level)
            i += 1
            continue
        underruns += 1  # ran dry: stall, re-buffer, resume
        i, resume, level = fill(i)
        underrun_s += resume - dry_at
        now = resume
        max_buffer = max(max_buffer, level)
    return PlayerResult(started, now + level, total, underruns, underrun_s, max_buffer)
