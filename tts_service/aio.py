"""Bounded waits that a cancel always reaches: the one way the server, the agent and the bench wait.

Why not ``asyncio.wait_for``: on Python 3.11 (the oldest we support) it returns the result and drops
a cancel that lands once its inner wait has finished. A loop that waits that way (a driver loop, a
playout loop, a handler streaming a reply) then runs on after it was cancelled, and whoever awaits
its end waits forever: a SIGTERM'd server with a live stream hung that way (docs/BENCHMARKS.md,
"Deploy and hardening"). ``asyncio.timeout`` lets the cancel through; these two helpers are that
pattern written once.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TypeVar

__all__ = ["get_within", "wait_set"]

T = TypeVar("T")


async def wait_set(event: asyncio.Event, timeout: float | None) -> bool:
    """Until ``event`` is set or ``timeout`` seconds pass (``None``: no bound); whether it is set."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await event.wait()
    return event.is_set()


async def get_within(queue: asyncio.Queue[T], timeout: float) -> T:
    """``queue.get()``, or :class:`TimeoutError` when nothing comes within ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        return await queue.get()
