"""The loop watch: a stall of the event loop is measured and blamed on the code that held it; an idle
loop has none; the figures reach /healthz."""

from __future__ import annotations

import asyncio
import time

import pytest

from pipelines.loop_watch import LoopWatch


def hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # what a model load or a long decode on the loop does


async def test_a_stall_is_measured_and_blamed_on_what_held_the_loop() -> None:
    watch = LoopWatch(threshold_s=0.1, log=False)
    watch.start()
    try:
        await asyncio.sleep(0.05)
        hold_the_loop(0.3)
        await asyncio.sleep(0.05)
    finally:
        await watch.stop()
    assert watch.stalls == 1, watch.recent
    (stall,) = watch.recent
    assert 0.25 <= stall.seconds < 1.0, stall
    assert "hold_the_loop" in stall.where, stall.where
    assert watch.figures() == {"stalls": 1, "worst_ms": round(1000 * stall.seconds)}


async def test_an_idle_loop_has_no_stall() -> None:
    watch = LoopWatch(threshold_s=0.1, log=False)
    watch.start()
    try:
        for _ in range(20):
            await asyncio.sleep(0.01)
    finally:
        await watch.stop()
    assert watch.stalls == 0, watch.recent


def test_the_threshold_must_exceed_the_heartbeat() -> None:
    with pytest.raises(ValueError, match="interval_s < threshold_s"):
        LoopWatch(threshold_s=0.01, interval_s=0.01)
