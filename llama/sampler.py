"""Repetition penalty, top-p and the draw: the one sampler of both runtimes.

Two callers with different constraints share these functions. The local LLM samples one row per
step on the CPU and may branch on the host (:func:`choose`: greedy skips the softmax). Orpheus
samples a batch of slots on the GPU inside a CUDA graph, so it may not branch or synchronise: it
restricts the candidates itself, then calls :func:`penalize` and :func:`top_p_draw` over
``[n, candidates]`` and picks greedy rows with ``torch.where``.

The draw is an exponential race, ``argmax(p / E)`` with ``E ~ Exp(1)``: an exact sample of
``p`` without a host sync, and what ``torch.multinomial(p, 1)`` itself computes, draw for draw,
from the same generator (so a seeded reply is the same as with ``multinomial``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .config import Sampling


def penalize(logits: Tensor, seen: Tensor, penalty: float | Tensor) -> Tensor:
    """HF's repetition penalty on ids already seen: positive logits divided, others multiplied.

    ``seen`` is a bool mask shaped like ``logits``; ``penalty`` a number or a tensor that
    broadcasts against them (one per row).
    """
    return torch.where(seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits)


def top_p_draw(
    logits: Tensor,
    temperature: float | Tensor,
    top_p: float | Tensor,
    *,
    generator: torch.Generator | None = None,
    keep_boundary: bool = False,
) -> Tensor:
    """Indices drawn from softmax(logits / temperature) cut to its top-p set, over the last dim.

    The set is the most likely candidates whose mass before each is below ``top_p``: the
    smallest set that reaches it, as transformers cuts. ``keep_boundary`` also keeps a candidate
    whose mass before it equals ``top_p`` exactly (Orpheus's sampler has always cut so; the two
    differ only on that tie). The top candidate always stays. ``temperature`` must be > 0 here
    (greedy is the caller's argmax); number or per-row tensor, like ``top_p``.
    """
    probs = torch.softmax(logits / temperature, dim=-1)
    sp, order = probs.sort(dim=-1, descending=True)
    before = sp.cumsum(dim=-1) - sp
    drop = before > top_p if keep_boundary else before >= top_p
    sp = sp.masked_fill(drop, 0.0)
    race = sp / torch.empty_like(sp).exponential_(1.0, generator=generator)
    return order.gather(-1, race.argmax(dim=-1, keepdim=True)).squeeze(-1)


def choose(logits: Tensor, seen: Tensor, s: Sampling, generator: torch.Generator | None = None) -> int:
    """One next token from ``logits [vocab]`` (float32) for a request sampled with ``s``.

    ``seen`` [vocab] bool marks the prompt's and the output's ids (for the penalty).
    """
    if s.repetition_penalty != 1.0:
        logits = penalize(logits, seen, s.repetition_penalty)
    if s.temperature <= 0:
        return int(torch.argmax(logits))
    return int(top_p_draw(logits, s.temperature, s.top_p, generator=generator))
