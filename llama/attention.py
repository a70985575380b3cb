"""Grouped-query attention with the query groups folded into the query length.

Query head ``h = j * G + g`` uses KV head ``j`` (transformers' ``repeat_kv`` order). Folding the
G query heads of a KV head into its query rows - ``q [B, T, H, hd]`` becomes ``[B, KV, G*T, hd]``
- lets one SDPA call read each KV head once, with any backend and no ``repeat_interleave`` copy
of the cache. Both forward passes attend this way; where the keys come from (a slot's cache
rows, the chunk itself) and how the mask is built stay theirs.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def grouped_attention(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None) -> Tensor:
    """q [B, T, H, hd], keys / values [B, KV, S, hd] -> [B, T, H * hd].

    ``mask`` (bool, True = attend) broadcasts against [B, KV, G*T, S], its query rows ordered
    ``(g, t)``; None attends to every key. All inputs 4-D: with 3-D ones SDPA takes its slow
    "math" path on the CPU.
    """
    B, T, H, hd = q.shape
    KV = keys.shape[1]
    qg = q.transpose(1, 2).reshape(B, KV, (H // KV) * T, hd)
    out = F.scaled_dot_product_attention(qg, keys, values, attn_mask=mask)  # [B, KV, G*T, hd]
    return out.view(B, H, T, hd).transpose(1, 2).reshape(B, T, H * hd)
