"""The asyncio driver for the Orpheus engine: a :class:`tts_service.core.runtime.SynthesizerBase`.

So ``tts_service.server.Server`` serves it unchanged, as it serves Piper's: the engine fits
:class:`tts_service.core.engine.Engine`, the scheduler is a
:class:`tts_service.core.scheduler.StreamScheduler`, and sinks receive
:class:`tts_service.core.scheduler.Output` objects. The stream verbs, sinks, loops and delivery
are the base class's; this module runs one tick in the worker.

One worker thread owns the model and runs one tick at a time; the event loop plans ticks, folds
results in and releases paced audio. A cancel is handled on the event loop while a tick runs:
the stream is finished at once (its sink removed, so nothing more reaches it), its slot is
handed back in the next plan, and whatever the running tick produced for it is dropped by id.
"""

from __future__ import annotations

import asyncio
import logging

from ..core.runtime import SynthesizerBase
from ..metrics import Metrics
from .engine import OrpheusEngine
from .scheduler import OrpheusOptions, OrpheusScheduler, SlotEvent, TickPlan, TickResult

log = logging.getLogger(__name__)


class OrpheusSynthesizer(SynthesizerBase):
    task_prefix = "streamvox-orpheus"
    thread_prefix = "streamvox-orpheus"
    _log = log

    def __init__(
        self, engine: OrpheusEngine, *, options: OrpheusOptions | None = None, metrics: Metrics | None = None
    ) -> None:
        scheduler = OrpheusScheduler(
            slots=engine.max_slots,
            tokenize=engine.prompt_ids,
            options=options,
            step_times=engine.step_times,
            max_prompt=engine.max_prompt,
        )
        super().__init__(engine, scheduler, metrics)

    async def _run(self, plan: TickPlan) -> TickResult:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, self.engine.tick, plan)
        except Exception as exc:
            log.exception("Orpheus tick failed")
            return self._failed(plan, exc)

    def _batch_size(self, plan: TickPlan) -> int:
        return len(plan.decode)

    def _failed(self, plan: TickPlan, exc: BaseException) -> TickResult:
        """Every stream of a failed tick gets an error (the engine state of its slot is suspect)."""
        slots = {c.slot for c in plan.claims} | {p.slot for p in plan.prefills} | set(plan.decode)
        return TickResult({s: SlotEvent(sid=plan.owners[s], error=f"synthesis failed: {exc}") for s in slots})
