"""Stalls of the agent's event loop: measured, and blamed on the code that held the loop.

Why: every call's audio leaves through one event loop (aiortc paces the page's RTP packets from
it; Twilio's media messages go out from it too). A loop held for 300 ms sends 15 packets at once
after 300 ms of none: the browser's jitter buffer takes that for network jitter, plays concealment
and raises its target delay. The caller then hears the agent hundreds of ms later, and the echo
path moves under the echo canceller (docs/BENCHMARKS.md, "Echo").

A heartbeat task on the loop and a thread that watches it: when the heartbeat is older than
``threshold_s`` the thread samples the loop thread's stack once (what holds the loop, caught while
it holds it); when the heartbeat comes back the stall's length is recorded, and logged with that
stack. The figures (``stalls``, ``worst_s``) are in ``/healthz``.

A stall the thread cannot sample held the GIL as well. One such holder is the garbage collector: a
full (generation 2) collection walks every tracked object, and a process that has loaded Whisper,
Pipecat and aiortc holds hundreds of thousands of them, none of which will ever be garbage. The
watch times collections (``gc.callbacks``) and names one that overlapped a stall;
:func:`freeze_startup_heap` takes what start-up loaded out of the collector's walk.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass

from loguru import logger

__all__ = ["LoopWatch", "Stall", "freeze_startup_heap"]

LOG_EVERY_S = 5.0


def freeze_startup_heap() -> int:
    """Collect once, then move every object alive into the collector's permanent generation; returns
    how many. Call it when start-up has loaded what every call shares. Why: each full collection
    walked those objects with the GIL held; at a page call's start one held the agent's event loop
    long enough for its audio to leave in a burst (docs/BENCHMARKS.md, "Calls at once"). Frozen
    objects are never collected: a model or a module loaded for the process's life is not garbage."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


@dataclass(frozen=True, slots=True)
class Stall:
    at: float  # monotonic time the loop was last seen free
    seconds: float  # how long it was held
    where: str  # the innermost frames of the loop thread's stack, sampled during the stall


class LoopWatch:
    """Start with :meth:`start` on the loop to watch; :meth:`stop` ends both the task and the thread."""

    def __init__(self, threshold_s: float = 0.15, interval_s: float = 0.01, *, keep: int = 100, log: bool = True):
        if not 0 < interval_s < threshold_s:
            raise ValueError("LoopWatch: 0 < interval_s < threshold_s")
        self.threshold_s = threshold_s
        self.interval_s = interval_s
        self.log = log
        self.recent: deque[Stall] = deque(maxlen=keep)
        self.stalls = 0
        self.worst_s = 0.0
        self._beat = time.monotonic()
        self._where: str | None = None
        self._logged_at = -LOG_EVERY_S
        self._unlogged = 0
        self._loop_thread: int | None = None
        self._task: asyncio.Task | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gc_started: float | None = None
        self._gc_last: tuple[float, float, int] | None = None  # (ended at, seconds, generation)

    def _gc_timed(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.monotonic()
        elif self._gc_started is not None:
            now = time.monotonic()
            if now - self._gc_started >= 0.5 * self.threshold_s:  # the short ones that follow do not hide it
                self._gc_last = (now, now - self._gc_started, info.get("generation", -1))
            self._gc_started = None

    def _blame(self, since: float) -> str:
        """The sampled stack (if any) of a stall since ``since``, and a collection that ran in it."""
        where = self._where or "(not sampled)"
        last = self._gc_last
        if last is not None and last[0] >= since:
            where += f"\n(a garbage collection of generation {last[2]} ran {1000 * last[1]:.0f} ms in it)"
        return where

    def start(self) -> None:
        """On the running loop: the heartbeat task, and the watching thread."""
        if self._gc_timed not in gc.callbacks:
            gc.callbacks.append(self._gc_timed)
        self._loop_thread = threading.get_ident()
        self._beat = time.monotonic()
        self._stop.clear()
        self._task = asyncio.get_running_loop().create_task(self._heartbeat(), name="loop-watch")
        self._thread = threading.Thread(target=self._watch, name="loop-watch", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        if self._gc_timed in gc.callbacks:
            gc.callbacks.remove(self._gc_timed)
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._thread is not None:
            self._thread.join(timeout=1.0)

    def figures(self) -> dict:
        return {"stalls": self.stalls, "worst_ms": round(1000 * self.worst_s)}

    async def _heartbeat(self) -> None:
        while True:
            last = self._beat
            await asyncio.sleep(self.interval_s)
            now = time.monotonic()
            held = now - last - self.interval_s
            self._beat = now
            if held > self.threshold_s:
                self._record(Stall(last, held, self._blame(last)))
            self._where = None

    def _record(self, stall: Stall) -> None:
        self.recent.append(stall)
        self.stalls += 1
        self.worst_s = max(self.worst_s, stall.seconds)
        self._unlogged += 1
        # a loaded machine stalls often: one line (with its stack) per LOG_EVERY_S, the rest counted in it
        if self.log and stall.at + stall.seconds - self._logged_at >= LOG_EVERY_S:
            more = f" (and {self._unlogged - 1} more since the last such line)" if self._unlogged > 1 else ""
            logger.warning(
                f"event loop held {1000 * stall.seconds:.0f} ms{more}: audio leaves in a burst after it; it was in\n"
                f"{stall.where}"
            )
            self._logged_at, self._unlogged = stall.at + stall.seconds, 0

    def _watch(self) -> None:
        while not self._stop.wait(self.interval_s):
            if self._where is None and time.monotonic() - self._beat > self.threshold_s:
                frame = sys._current_frames().get(self._loop_thread)
                if frame is not None:
                    stack = traceback.extract_stack(frame)[-6:]
                    self._where = "".join(traceback.format_list(stack)).rstrip()
