"""Grouped-query attention folded into the query length equals attention over repeated KV heads."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from llama.attention import grouped_attention  # noqa: E402


@pytest.mark.parametrize(("T", "S", "start"), [(1, 9, 8), (5, 5, 0), (4, 12, 8)])
def test_folded_groups_equal_repeated_kv_heads(T, S, start):
    B, H, KV, hd = 2, 6, 2, 8
    g = torch.Generator().manual_seed(T * 100 + S)
    q = torch.randn(B, T, H, hd, generator=g, dtype=torch.float64)
    k = torch.randn(B, KV, S, hd, generator=g, dtype=torch.float64)
    v = torch.randn(B, KV, S, hd, generator=g, dtype=torch.float64)
    sees = torch.arange(S)[None, :] <= torch.arange(start, start + T)[:, None]  # [T, S]: query t at start+t
    ref = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1), attn_mask=sees
    )
    ref = ref.transpose(1, 2).reshape(B, T, H * hd)
    got = grouped_attention(q, k, v, sees.repeat(H // KV, 1))  # query rows ordered (g, t)
    torch.testing.assert_close(got, ref)
