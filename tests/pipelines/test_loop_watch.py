"""The loop watch: a stall of the event loop is measured and blamed on the code that held it; an idle
loop has none; the figures reach /healthz."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest

from pipelines.loop_watch import LoopWatch, freeze_startup_heap


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


def _many_cycles(n: int) -> list:
    """``n`` objects in reference cycles: what a full collection has to walk."""
    keep = []
    for _ in range(n):
        a: list = []
        a.append(a)
        keep.append(a)
    return keep


async def test_a_full_collection_that_holds_the_loop_is_named() -> None:
    """A collection holds the GIL: the thread cannot sample the stall, the gc callback names it."""
    heap = _many_cycles(1_500_000)
    watch = LoopWatch(threshold_s=0.05, interval_s=0.005, log=False)
    watch.start()
    try:
        await asyncio.sleep(0.02)
        started = time.monotonic()
        gc.collect()
        took = time.monotonic() - started
        await asyncio.sleep(0.02)
    finally:
        await watch.stop()
        del heap
    if took < 0.08:
        pytest.skip(f"the collection took {1000 * took:.0f} ms here: too short to stall the loop")
    assert any("garbage collection of generation 2" in s.where for s in watch.recent), watch.recent


def test_frozen_start_up_objects_leave_the_collectors_walk() -> None:
    """What start-up loaded is frozen: a full collection then walks only what came after."""
    heap = _many_cycles(300_000)
    try:
        started = time.perf_counter()
        gc.collect()
        walked = time.perf_counter() - started
        frozen = freeze_startup_heap()
        started = time.perf_counter()
        gc.collect()
        after = time.perf_counter() - started
    finally:
        gc.unfreeze()
        del heap
    assert frozen >= 300_000
    assert after < 0.5 * walked, (after, walked)  # generous: the frozen heap is no longer walked
