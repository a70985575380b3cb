"""Underrun accounting of the simulated real-time player, with hand-built arrival times."""

from __future__ import annotations

import pytest

from bench.player import Arrival, simulate

F = 0.05  # 50 ms frames


def paced(n: int, *, start: float = 0.0, every: float = F) -> list[Arrival]:
    return [Arrival(start + i * every, F) for i in range(n)]


def test_no_audio() -> None:
    r = simulate([], 0.08)
    assert r.started_at is None and r.underruns == 0 and r.audio_s == 0.0


def test_real_time_delivery_never_underruns() -> None:
    r = simulate(paced(40), prebuffer_s=0.08)
    assert r.underruns == 0 and r.underrun_s == 0.0
    assert r.started_at == pytest.approx(0.05)  # two frames (100 ms >= 80 ms) buffered
    assert r.audio_s == pytest.approx(2.0)
    assert r.ended_at == pytest.approx(0.05 + 2.0)


def test_a_burst_never_underruns_but_fills_the_buffer() -> None:
    r = simulate([Arrival(1.0, F) for _ in range(100)], prebuffer_s=0.08)
    assert r.underruns == 0
    assert r.started_at == 1.0
    assert r.max_buffer_s == pytest.approx(5.0)  # the whole utterance sat in the client


def test_one_late_frame_is_one_underrun_of_exact_length() -> None:
    arrivals = paced(4)  # 0, .05, .10, .15 -> playing from .05, dry at .25
    arrivals += [Arrival(0.40, F), Arrival(0.40, F)]  # late by 150 ms; re-buffer 100 ms at once
    arrivals += paced(4, start=0.45)
    r = simulate(arrivals, prebuffer_s=0.08)
    assert r.underruns == 1
    assert r.underrun_ms == pytest.approx(150.0)


def test_rebuffering_waits_for_the_prebuffer() -> None:
    # Playing from 0.05 (100 ms buffered): dry at 0.15. Then single frames every 100 ms: each
    # re-buffer needs two frames (80 ms), so a stall lasts until the second one arrives.
    arrivals = [Arrival(0.0, F), Arrival(0.05, F), Arrival(0.30, F), Arrival(0.40, F)]
    r = simulate(arrivals, prebuffer_s=0.08)
    assert r.underruns == 1
    assert r.underrun_s == pytest.approx(0.40 - 0.15)
    assert r.ended_at == pytest.approx(0.40 + 0.10)


def test_frame_arriving_exactly_when_the_buffer_runs_dry_is_not_an_underrun() -> None:
    arrivals = [Arrival(0.0, 0.1), Arrival(0.1, 0.1), Arrival(0.2, 0.1)]  # prebuffer 100 ms: start at 0
    r = simulate(arrivals, prebuffer_s=0.1)
    assert r.started_at == 0.0 and r.underruns == 0


def test_waiting_for_first_audio_is_not_an_underrun() -> None:
    r = simulate(paced(10, start=3.0), prebuffer_s=0.08)
    assert r.underruns == 0 and r.started_at == pytest.approx(3.05)


def test_a_short_stream_plays_even_below_the_prebuffer() -> None:
    r = simulate([Arrival(0.2, 0.03)], prebuffer_s=0.08)
    assert r.started_at == 0.2 and r.underruns == 0 and r.ended_at == pytest.approx(0.23)


def test_many_small_stalls_add_up() -> None:
    # 60 ms frames every 100 ms with no prebuffer: dry 40 ms before each next frame.
    arrivals = [Arrival(0.1 * i, 0.06) for i in range(11)]
    r = simulate(arrivals, prebuffer_s=0.0)
    assert r.underruns == 10
    assert r.underrun_ms == pytest.approx(400.0)
