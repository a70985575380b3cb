"""Helpers of the Orpheus suite: engines on a shared tiny model, driven slot by slot."""

from __future__ import annotations

import numpy as np

from tts_service.orpheus.codec import WindowedCodec
from tts_service.orpheus.config import Sampling
from tts_service.orpheus.engine import EngineOptions, OrpheusEngine
from tts_service.orpheus.scheduler import PrefillJob
from tts_service.orpheus.tokens import HashTokenizer

# Greedy, but with a repetition penalty, so the per-slot presence state takes part.
GREEDY = Sampling(temperature=0.0, top_p=1.0, repetition_penalty=1.3)


def make_engine(model, snac, *, slots: int = 4, max_len: int = 256, max_new: int = 700) -> OrpheusEngine:
    """A fresh engine. Its cache replaces that of any earlier engine on the same model."""
    opts = EngineOptions(max_slots=slots, max_len=max_len, max_new_tokens=max_new, cuda_graphs=False)
    return OrpheusEngine(model, WindowedCodec(snac), HashTokenizer(), options=opts)


def prompt(seed: int, length: int) -> tuple[int, ...]:
    return tuple(int(x) for x in np.random.default_rng(seed).integers(0, 128000, length))


def start(engine: OrpheusEngine, slot: int, sid: int, ids: tuple[int, ...], chunk: int | None = None) -> None:
    """Claim ``slot`` and prefill ``ids`` (in chunks of ``chunk`` tokens when given)."""
    engine.claim(slot, sid, len(ids), GREEDY)
    end = len(ids) - 1
    step = chunk or end
    for a in range(0, end, step):
        engine.prefill([PrefillJob(slot, sid, ids, a, min(end, a + step))])


def generate_alone(model, snac, ids: tuple[int, ...], n: int) -> list[int]:
    engine = make_engine(model, snac, slots=1)
    start(engine, 0, 1, ids)
    return [engine.step([0])[0] for _ in range(n)]
