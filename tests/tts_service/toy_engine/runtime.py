"""The toy engine's driver: one plan at a time in the worker thread."""

from __future__ import annotations

import asyncio

from tts_service.core.runtime import SynthesizerBase

from .engine import ToyEngine
from .scheduler import ToyOptions, ToyPlan, ToyResult, ToyScheduler


class ToySynthesizer(SynthesizerBase):
    task_prefix = "streamvox-toy"
    thread_prefix = "streamvox-toy"

    def __init__(self, engine: ToyEngine, *, options: ToyOptions | None = None, metrics=None) -> None:
        super().__init__(engine, ToyScheduler(sample_rate=engine.sample_rate, options=options), metrics)

    async def _run(self, plan: ToyPlan) -> ToyResult:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, self.engine.run, plan)
        except Exception as exc:
            return ToyResult({sid: exc for sid, _, _ in plan.jobs})

    def _batch_size(self, plan: ToyPlan) -> int:
        return len(plan.jobs)
