"""Drives an engine's scheduler against the engine: worker threads compute, the event loop delivers.

This is the engine-independent driver (:class:`SynthesizerBase`); each engine's package has a
small subclass that builds its scheduler and runs one plan in the worker
(:class:`tts_service.piper.runtime.PiperSynthesizer`, :class:`tts_service.orpheus.runtime.OrpheusSynthesizer`).

Inference never runs on the event loop, so a ``cancel`` (or a new ``start``) is handled while a
batch is being computed; the cancelled stream's share of that batch is discarded by id when
the batch returns. Two tasks run here: the *compute* loop (schedule -> worker -> update, then
deliver what that batch made due at once) and the *release* loop (hand paced frames to their
transports when they fall due).

Neither polls. The scheduler owns the clock: when it has nothing to compute it says when the
clock next makes work due (``next_work_in``: a paced stream's lead running down, buffered text
falling due to be cut), and the compute loop sleeps until then or until an event (text, end,
cancel, a release) wakes it; the release loop sleeps until ``next_release_in``. The one
exception is a transport that is backed up: it has no drain signal, so it is re-checked every
``BACKED_UP_RETRY_S`` while it stays backed up. (A fixed 20 ms poll used to wake both loops
50 times a second per server whenever any stream was live.)
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from ..aio import wait_set
from ..metrics import Metrics
from ..protocol import ErrorCode
from .engine import Engine, UnsupportedSpeed, nearest_speed, speed_range
from .scheduler import Output, StreamScheduler

log = logging.getLogger(__name__)
BACKED_UP_RETRY_S = 0.02  # a backed-up transport's re-check (it has no drain signal)


class Sink(Protocol):
    """Where a stream's outputs go (a WebSocket context, an HTTP response)."""

    def deliver(self, out: Output) -> None: ...

    def backed_up(self) -> bool: ...


class SynthesizerBase:
    """What every engine's driver shares: stream verbs, the sink registry, the compute loop's
    skeleton, the release loop and delivery. An engine's subclass builds its scheduler and runs
    one plan in the worker (:meth:`_run`); the scheduler has the same transport verbs for all
    engines (see :class:`tts_service.core.scheduler.StreamScheduler`).
    """

    task_prefix = "streamvox"  # asyncio task names
    thread_prefix = "streamvox-infer"  # the worker thread's name
    _log = log

    def __init__(self, engine: Engine, scheduler: StreamScheduler, metrics: Metrics | None) -> None:
        self.engine = engine
        self.scheduler = scheduler
        self.metrics = metrics or Metrics()
        self._sinks: dict[int, Sink] = {}
        self._ids = itertools.count(1)
        # Worker threads that run batches (each its own compute loop); engines whose state lives
        # in one place (Orpheus' slots) keep one.
        self.workers = max(1, int(getattr(scheduler.opt, "workers", 1)))
        self._executor = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix=self.thread_prefix)
        self._work = asyncio.Event()  # something may have made work possible
        self._due = asyncio.Event()  # an output may have fallen due (re-arm the release timer)
        self._tasks: list[asyncio.Task] = []
        self.started_at = time.monotonic()

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._guard(self._compute_loop), name=f"{self.task_prefix}-compute-{k}")
            for k in range(self.workers)
        ]
        self._tasks.append(asyncio.create_task(self._guard(self._release_loop), name=f"{self.task_prefix}-release"))

    async def _guard(self, loop_fn) -> None:
        """Keep a driver loop alive through a bug in one iteration, and say so loudly: a dead
        compute loop would leave every stream silent with no error."""
        while True:
            try:
                await loop_fn()
            except asyncio.CancelledError:
                raise
            except Exception:
                self._log.exception("%s crashed; restarting it", loop_fn.__name__)
                await asyncio.sleep(0.05)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._executor.shutdown(wait=True, cancel_futures=True)

    # ------------------------------------------------------------ stream verbs
    def open(self, sink: Sink, *, voice: str | None, pace: bool, speed: float = 1.0) -> int:
        """Admit a stream (raises ``Overloaded``, ``KeyError`` for an unknown voice, or
        :class:`UnsupportedSpeed` for a rate the engine cannot render)."""
        name = self.engine.resolve(voice)
        if nearest_speed(self.engine, speed) != speed:  # (an engine without rates raises there)
            lo, hi = speed_range(self.engine) or (1.0, 1.0)
            raise UnsupportedSpeed(f"'speed' {speed} is outside {lo}..{hi}, the rates this server's voices render")
        now = time.monotonic()
        self.scheduler.admit(now)
        sid = next(self._ids)
        self.scheduler.add(sid, voice=name, pace=pace, now=now, speed=speed)
        self._sinks[sid] = sink
        self._sync_gauges()
        return sid

    def push_text(self, sid: int, text: str) -> None:
        self.scheduler.push_text(sid, text, time.monotonic())
        self._work.set()

    def flush(self, sid: int) -> None:
        self.scheduler.flush(sid, time.monotonic())
        self._work.set()

    def end(self, sid: int) -> None:
        self.scheduler.end(sid, time.monotonic())
        self._work.set()
        self._due.set()

    def cancel(self, sid: int) -> int:
        """Stop a stream now; its sink receives nothing more. Returns frames never sent."""
        dropped = self.scheduler.cancel(sid)
        self._close(sid, "cancelled")
        self._abort_if_orphaned()
        self._work.set()  # what it held (an engine slot) may be another stream's now
        self.metrics.frames_dropped.inc(dropped)
        return dropped

    def _abort_if_orphaned(self) -> None:
        """Stop the running plan early when the scheduler says no live stream needs it (engines
        whose runs can be aborted override this)."""

    def _close(self, sid: int, status: str) -> None:
        if self._sinks.pop(sid, None) is not None:
            self.metrics.streams.labels(status).inc()
        self.scheduler.discard(sid)
        self._sync_gauges()

    def _sync_gauges(self) -> None:
        self.metrics.active.set(self.scheduler.active)
        self.metrics.queue_depth.set(self.scheduler.queue_depth())

    # ------------------------------------------------------------ loops
    async def _compute_loop(self) -> None:
        while True:
            plan = self.scheduler.schedule(time.monotonic())
            if plan is None:
                self._work.clear()
                # Sleep until an event or until the scheduler's clock makes work due.
                await wait_set(self._work, self.scheduler.next_work_in(time.monotonic()))
                continue
            result = await self._run(plan)
            self.scheduler.update(plan, result, time.monotonic())
            self.metrics.batch_size.observe(self._batch_size(plan))
            self.metrics.batch_seconds.observe(result.seconds)
            self.metrics.busy_seconds.inc(result.seconds)
            self.metrics.rtf.set(self.scheduler.cost_per_audio_s)
            self.metrics.capacity.set(self.scheduler.capacity_streams())
            # Deliver as computed: what this batch made due goes out now, not at the next timer.
            self._release()
            self._due.set()
            if self.workers > 1:
                self._work.set()  # an idle peer may take work this batch made possible

    async def _run(self, plan):
        """Run one plan in the worker thread; a failure becomes a result that fails its streams."""
        raise NotImplementedError

    def _batch_size(self, plan) -> int:
        raise NotImplementedError

    async def _release_loop(self) -> None:
        while True:
            self._due.clear()
            await wait_set(self._due, self._release())

    def _release(self) -> float | None:
        """Hand every due output to its sink; return seconds until the next one falls due."""
        blocked = {sid for sid, sink in self._sinks.items() if sink.backed_up()}
        for out in self.scheduler.release(time.monotonic(), blocked):
            self._deliver(out)
        if self.scheduler.consumer_moved:
            self.scheduler.consumer_moved = False
            self._work.set()
        wait = self.scheduler.next_release_in(time.monotonic())
        if blocked:
            wait = BACKED_UP_RETRY_S if wait is None else min(wait, BACKED_UP_RETRY_S)
        return wait

    def _deliver(self, out: Output) -> None:
        sink = self._sinks.get(out.sid)
        if sink is None:  # cancelled or closed: the id gate
            return
        if out.ttfb_s is not None:
            self.metrics.ttfb.observe(out.ttfb_s)
        if out.kind == "audio" and out.samples is not None:
            self.metrics.audio_seconds.inc(len(out.samples) / self.engine.sample_rate)
        try:
            sink.deliver(out)
        except Exception:
            self._log.exception("sink of stream %d failed; cancelling it", out.sid)
            self.cancel(out.sid)
            return
        if out.kind in ("done", "error"):
            if out.kind == "error":
                self.metrics.errors.labels(out.code or ErrorCode.INTERNAL).inc()
            self._close(out.sid, out.kind)
