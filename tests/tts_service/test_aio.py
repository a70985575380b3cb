"""The bounded waits every loop uses (:mod:`tts_service.aio`): a cancel that lands in any step reaches them.

Python 3.11's ``asyncio.wait_for`` returns the result and drops a cancel that arrives once its inner
wait is done: the server's release loop then ran on, ``stop()`` waited for it forever, and a
SIGTERM'd server with a live stream hung instead of exiting (1 run in ~15, CI's too). Each test
lets the wait's inner step finish, then cancels at every later step: a wait still running must end
cancelled. (``wait_for`` in place of the helper fails both on 3.11.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from tts_service.aio import get_within, wait_set


async def _cancel_at_each_step(start: Callable[[], tuple[Awaitable[object], Callable[[], None]]]) -> int:
    """Start a wait, let it finish its inner step, cancel ``steps`` loop turns later; count the cancels taken."""
    taken = 0
    for steps in range(4):
        wait, finish = start()
        waiting = asyncio.ensure_future(wait)
        await asyncio.sleep(0)
        finish()
        for _ in range(steps):
            await asyncio.sleep(0)
        if waiting.cancel():  # not over yet: the cancel must stop it
            with pytest.raises(asyncio.CancelledError):
                await waiting
            taken += 1
        else:
            await waiting
    return taken


async def test_a_cancel_as_the_event_is_set_still_stops_the_wait() -> None:
    def start():
        event = asyncio.Event()
        return wait_set(event, 10.0), event.set

    assert await _cancel_at_each_step(start) >= 1


async def test_a_cancel_as_the_item_arrives_still_stops_the_get() -> None:
    def start():
        queue: asyncio.Queue[int] = asyncio.Queue()
        return get_within(queue, 10.0), lambda: queue.put_nowait(1)

    assert await _cancel_at_each_step(start) >= 1


async def test_the_bounds() -> None:
    event = asyncio.Event()
    assert await wait_set(event, 0.01) is False
    event.set()
    assert await wait_set(event, None) is True
    queue: asyncio.Queue[str] = asyncio.Queue()
    with pytest.raises(TimeoutError):
        await get_within(queue, 0.01)
    queue.put_nowait("x")
    assert await get_within(queue, 0.01) == "x"
