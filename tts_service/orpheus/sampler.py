"""Per-slot sampling on the device, with no host synchronisation (so it can live in a CUDA graph).

Why sampling is restricted to one phase's 4096 codes (plus the stop token at frame starts):
position k of a frame must be an audio token of range k, so every other id is a guaranteed
decoding error. Restricting the candidates removes that failure mode, makes top-p sort 4097
values instead of 156940 per row, and lets the head compute only the audio rows.

Repetition penalty (HF semantics: positive logits divided, negative multiplied) applies to ids
already in the slot's prompt or output; with the candidates restricted to audio ids, only the
slot's own earlier audio tokens can be among them, so presence is tracked over the audio window.
The penalty, top-p and the draw are the shared ones of :mod:`llama.sampler` (the local LLM's
too); the candidates, the stop rule and the per-row greedy pick are this engine's.
"""

from __future__ import annotations

import torch
from torch import Tensor

from llama.sampler import penalize, top_p_draw

from .config import Sampling
from .tokens import AUDIO_BASE, AUDIO_END, CODEBOOK, END_OF_SPEECH, FRAME

WINDOW = AUDIO_END - END_OF_SPEECH  # 28680 ids: the stop token, 7 reserved ids, 7 x 4096 codes
_AUDIO_OFFSET = AUDIO_BASE - END_OF_SPEECH  # 8: window index of the first audio id

__all__ = ["WINDOW", "Sampling", "candidate_index", "mark_seen", "sample"]


def candidate_index(phase: Tensor) -> Tensor:
    """phase [n] (0..6) -> window columns [n, 1 + 4096]: the stop token, then the phase's codes."""
    n = phase.shape[0]
    codes = torch.arange(CODEBOOK, device=phase.device)
    audio = _AUDIO_OFFSET + phase.unsqueeze(1) * CODEBOOK + codes.unsqueeze(0)  # [n, 4096]
    return torch.cat([torch.zeros(n, 1, dtype=audio.dtype, device=phase.device), audio], dim=1)


def sample(
    logits: Tensor,
    gen: Tensor,
    presence: Tensor,
    temperature: Tensor,
    top_p: Tensor,
    penalty: Tensor,
) -> Tensor:
    """Next token id per row.

    logits [n, WINDOW] over ids END_OF_SPEECH.., gen [n] tokens generated so far (its value
    mod 7 is the frame position), presence [n, WINDOW] bool, temperature / top_p / penalty [n].
    """
    phase = gen % FRAME
    idx = candidate_index(phase)  # [n, 4097]
    lg = penalize(logits.gather(1, idx).float(), presence.gather(1, idx), penalty.unsqueeze(1))
    # The stop token only where a frame would start: a cut frame has no audio.
    stop_ok = (phase == 0).unsqueeze(1)
    lg = torch.cat([torch.where(stop_ok, lg[:, :1], torch.full_like(lg[:, :1], float("-inf"))), lg[:, 1:]], dim=1)
    greedy = lg.argmax(dim=1)
    # Both branches for every row, picked per row: no host sync. The clamp keeps greedy rows' unused draw finite.
    t, p = temperature.clamp_min(1e-5).unsqueeze(1), top_p.unsqueeze(1)
    sampled = top_p_draw(lg, t, p, keep_boundary=True)
    c = torch.where(temperature <= 0, greedy, sampled)
    audio_id = AUDIO_BASE + phase * CODEBOOK + (c - 1)
    return torch.where(c == 0, torch.full_like(c, END_OF_SPEECH), audio_id)


def mark_seen(presence: Tensor, tokens: Tensor, commit: Tensor) -> None:
    """presence[b, tokens[b]] |= commit[b], in place. tokens [n] ids in the window."""
    col = (tokens - END_OF_SPEECH).clamp(0, WINDOW - 1).unsqueeze(1)
    presence.scatter_(1, col, presence.gather(1, col) | commit.unsqueeze(1))
