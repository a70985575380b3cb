"""The asyncio driver for the Orpheus engine: same public surface as ``tts_service.runtime.Synthesizer``.

So ``tts_service.server.Server`` serves it unchanged: ``engine`` (voices, default_voice,
sample_rate, resolve), ``open / push_text / flush / end / cancel``, ``metrics``, ``scheduler``
(load, refusal, capacity_streams, active, cost_per_audio_s, queue_depth), ``_sync_gauges``,
``start / stop``. Sinks receive :class:`tts_service.scheduler.Output` objects.

One worker thread owns the model and runs one tick at a time; the event loop plans ticks, folds
results in and releases paced audio. A cancel is handled on the event loop while a tick runs:
the stream is finished at once (its sink removed, so nothing more reaches it), its slot is
handed back in the next plan, and whatever the running tick produced for it is dropped by id.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from ..metrics import Metrics
from ..protocol import ErrorCode
from ..runtime import Sink
from ..scheduler import Output
from .engine import OrpheusEngine
from .scheduler import OrpheusOptions, OrpheusScheduler, SlotEvent, TickPlan, TickResult

log = logging.getLogger(__name__)
_POLL_S = 0.01  # paced streams become eligible as their listener's playhead moves


class OrpheusSynthesizer:
    def __init__(
        self, engine: OrpheusEngine, *, options: OrpheusOptions | None = None, metrics: Metrics | None = None
    ) -> None:
        self.engine = engine
        self.scheduler = OrpheusScheduler(
            slots=engine.max_slots,
            tokenize=engine.prompt_ids,
            options=options,
            step_times=engine.step_times,
            max_prompt=engine.max_prompt,
        )
        self.metrics = metrics or Metrics()
        self._sinks: dict[int, Sink] = {}
        self._ids = itertools.count(1)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="streamvox-orpheus")
        self._work = asyncio.Event()
        self._due = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self.started_at = time.monotonic()

    # ------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._compute_loop(), name="streamvox-orpheus-compute"),
            asyncio.create_task(self._release_loop(), name="streamvox-orpheus-release"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._executor.shutdown(wait=True, cancel_futures=True)

    # ------------------------------------------------------------ stream verbs
    def open(self, sink: Sink, *, voice: str | None, pace: bool) -> int:
        name = self.engine.resolve(voice)
        now = time.monotonic()
        self.scheduler.admit(now)
        sid = next(self._ids)
        self.scheduler.add(sid, voice=name, pace=pace, now=now)
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
        dropped = self.scheduler.cancel(sid)
        self._close(sid, "cancelled")
        self.metrics.frames_dropped.inc(dropped)
        return dropped

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
        loop = asyncio.get_running_loop()
        while True:
            plan = self.scheduler.schedule(time.monotonic())
            if plan is None:
                self._work.clear()
                timeout = _POLL_S if self.scheduler.has_work() else None
                try:
                    await asyncio.wait_for(self._work.wait(), timeout)
                except TimeoutError:
                    pass
                continue
            try:
                result = await loop.run_in_executor(self._executor, self.engine.tick, plan)
            except Exception as exc:
                log.exception("Orpheus tick failed")
                result = self._failed(plan, exc)
            self.scheduler.update(plan, result, time.monotonic())
            self.metrics.batch_size.observe(len(plan.decode))
            self.metrics.batch_seconds.observe(result.seconds)
            self.metrics.busy_seconds.inc(result.seconds)
            self.metrics.rtf.set(self.scheduler.cost_per_audio_s)
            self.metrics.capacity.set(self.scheduler.capacity_streams())
            self._due.set()

    def _failed(self, plan: TickPlan, exc: BaseException) -> TickResult:
        """Every stream of a failed tick gets an error (the engine state of its slot is suspect)."""
        slots = {c.slot for c in plan.claims} | {p.slot for p in plan.prefills} | set(plan.decode)
        return TickResult({s: SlotEvent(sid=plan.owners[s], error=f"synthesis failed: {exc}") for s in slots})

    async def _release_loop(self) -> None:
        while True:
            now = time.monotonic()
            blocked = {sid for sid, sink in self._sinks.items() if sink.backed_up()}
            for out in self.scheduler.release(now, blocked):
                self._deliver(out)
            wait = self.scheduler.next_release_in(time.monotonic())
            self._due.clear()
            if blocked:
                wait = _POLL_S if wait is None else min(wait, _POLL_S)
            try:
                await asyncio.wait_for(self._due.wait(), wait)
            except TimeoutError:
                pass

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
            log.exception("sink of stream %d failed; cancelling it", out.sid)
            self.cancel(out.sid)
            return
        if out.kind in ("done", "error"):
            if out.kind == "error":
                self.metrics.errors.labels(out.code or ErrorCode.INTERNAL).inc()
            self._close(out.sid, out.kind)
        self._work.set()
