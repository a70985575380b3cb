"""Piper's driver: runs a :class:`~tts_service.piper.scheduler.Batch` (front parts, then windows) in
the worker thread, and aborts a batch every stream of which was cancelled.

The stream verbs, sinks, the compute and release loops and delivery are
:class:`tts_service.core.runtime.SynthesizerBase`'s, shared with every engine.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from ..core.runtime import SynthesizerBase
from ..metrics import Metrics
from .engine import PiperEngine, Window
from .scheduler import Batch, BatchResult, PiperScheduler, PiperSchedulerOptions, Prepared

log = logging.getLogger(__name__)


def fit_options(engine, options: PiperSchedulerOptions | None) -> PiperSchedulerOptions:
    """Scheduler options for this engine: its context per window side, window sizes raised to
    what it decodes for the same price, batches of many windows only where batching pays, and one
    worker unless asked for more.

    Why one worker: a second one (each with the decoder's two threads) gives fewer underruns
    under load but a later first audio, because a start-up then shares the cores with another
    batch instead of waiting at most one window and running alone. First audio decides
    (docs/architecture.md; the runs are in docs/BENCHMARKS.md and its history)."""
    options = options or PiperSchedulerOptions()
    if options.workers == 0:
        options = dataclasses.replace(options, workers=1)
    free = engine.free_frames() if hasattr(engine, "free_frames") else 0
    windows = tuple(sorted({max(w, free) for w in options.windows}))
    context = getattr(engine, "context", options.context_frames)
    if options.max_jobs == 1 and getattr(engine, "device", "cpu") == "cuda":
        # a GPU call costs about the same for 1 or 16 windows: batch them, and let the frame
        # budget hold 16 steady windows with their context
        jobs, budget = 16, max(options.max_tick_frames, 16 * (max(windows) + 2 * context))
    else:
        jobs, budget = options.max_jobs, options.max_tick_frames
    return dataclasses.replace(options, context_frames=context, windows=windows, max_jobs=jobs, max_tick_frames=budget)


class PiperSynthesizer(SynthesizerBase):
    """The server's synthesis core: streams in, paced outputs out, through sinks."""

    def __init__(
        self, engine: PiperEngine, *, options: PiperSchedulerOptions | None = None, metrics: Metrics | None = None
    ) -> None:
        scheduler = PiperScheduler(sample_rate=engine.sample_rate, options=fit_options(engine, options))
        super().__init__(engine, scheduler, metrics)
        for name in ("cost_per_audio_s", "startup_cost_s"):  # measured at the engine's warm-up
            if getattr(engine, name, None):
                setattr(self.scheduler, name, getattr(engine, name))
        self._inflight: dict[int, tuple[Batch, object]] = {}  # running batches and their abort handles

    async def stop(self) -> None:
        for _, run_options in self._inflight.values():
            run_options.terminate = True  # do not make shutdown wait for a long segment
        await super().stop()

    async def _run(self, batch: Batch) -> BatchResult:
        run_options = self.engine.run_options()
        self._inflight[id(batch)] = (batch, run_options)
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, self._execute, batch, run_options)
        except Exception as exc:  # the executor itself failed: fail the batch's streams
            log.exception("inference worker failed")
            return BatchResult([exc] * len(batch.preps), [exc] * len(batch.windows))
        finally:
            del self._inflight[id(batch)]

    def _batch_size(self, batch: Batch) -> int:
        return len(batch.windows)

    def _abort_if_orphaned(self) -> None:
        """Abort the running batch when every stream it computes for has been cancelled.

        Without this a cancel is honoured at the next tick, but the next turn's first audio still
        waits for the orphaned tick (a long segment's front part plus a window: on a busy machine,
        a delay a caller hears; docs/BENCHMARKS.md). onnxruntime stops a run whose
        ``RunOptions.terminate`` is set.
        """
        for batch, run_options in self._inflight.values():
            if not run_options.terminate and self.scheduler.orphaned(batch):
                run_options.terminate = True
                self.metrics.batches_aborted.inc()

    def _execute(self, batch: Batch, run_options=None) -> BatchResult:
        """Worker thread: front parts first, then every window of the tick in one decode call."""
        t0 = time.perf_counter()
        prepared: list[Prepared | BaseException | None] = []
        fresh: dict[int, Prepared | BaseException | None] = {}
        for job in batch.preps:
            try:
                p = self.engine.prepare(job.segment.text, job.voice, run_options, urgent=job.urgent, speed=job.speed)
            except Exception as exc:
                if not getattr(run_options, "terminate", False):
                    log.exception("front part failed for %r", job.segment.text[:60])
                p = exc
            prepared.append(p)
            fresh[id(job.segment)] = p
        windows: list[Window] = []
        slots: list[int] = []
        audio: list = [None] * len(batch.windows)
        for i, job in enumerate(batch.windows):
            p = job.segment.prepared or fresh.get(id(job.segment))
            if isinstance(p, Prepared) and job.start < p.frames:
                windows.append(Window(p, job.start, min(p.frames, job.start + job.size)))
                slots.append(i)
        if windows:
            try:
                for i, chunk in zip(slots, self.engine.decode(windows, run_options)):
                    audio[i] = chunk
            except Exception as exc:
                if not getattr(run_options, "terminate", False):
                    log.exception("vocoder failed")
                for i in slots:
                    audio[i] = exc
        return BatchResult(prepared, audio, time.perf_counter() - t0)
