"""Rotary position embeddings (rotate-half layout, as transformers' Llama), with Llama 3's rescaling.

Both runtimes build their cos/sin tables once from :func:`angles` and rotate with
:func:`rotate_half`; they differ only in the dtype the frequencies are computed in, which is an
explicit option because it changes the tables' last bits: float32 is how transformers computes
them (the local LLM's greedy replies are compared with transformers' token for token), float64
is what the Orpheus backbone has always been built with.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .config import LlamaConfig


def inv_freq(cfg: LlamaConfig, *, precision: torch.dtype = torch.float64) -> Tensor:
    """Inverse frequencies [head_dim / 2] (float32), with Llama 3's long-context rescaling when configured."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=precision) / d))
    s = cfg.rope_scaling
    if not s:
        return inv.float()
    factor, lo, hi = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old = float(s["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old / lo, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / hi) & (wavelen <= old / lo)
    return torch.where(medium, smoothed, scaled).float()


def angles(cfg: LlamaConfig, length: int, *, precision: torch.dtype = torch.float64) -> Tensor:
    """Rotation angles [length, head_dim] (float32) of positions 0..length-1: cos/sin tables are their cos/sin."""
    freqs = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq(cfg, precision=precision))
    return torch.cat((freqs, freqs), dim=-1)


def rotate_half(x: Tensor) -> Tensor:
    """(a, b) -> (-b, a) over the last dim: with cos/sin tables, ``x * cos + rotate_half(x) * sin`` rotates x."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)
