"""Llama decoder over a slot-based static KV cache (gpt-fast style).

Why slots: each live stream owns one row of a cache allocated once at [slots, kv_heads,
max_len, head_dim]. Every row keeps its own position, so one batched decode step serves streams
of any lengths: row ``b`` writes its new key/value at ``pos[b]`` and attends to ``arange(L) <=
pos[b]``. Nothing is reallocated or copied when streams join or leave, which is what lets the
decode step be captured once per batch size as a CUDA graph.

Why the decode step runs over rows ``[0, n)`` rather than a gathered list of slots: a gather
would copy every participating row of the cache per layer per step (gigabytes at 256 streams);
a leading slice is a view. The engine hands out the lowest free slot, so ``n`` stays close to
the number of live streams; idle rows inside ``[0, n)`` compute garbage that nobody reads.

Attention folds GQA into the query length - q [B, H, T, D] becomes [B, KV, G*T, D] - so each KV
head is read once for its G query heads, with any SDPA backend and no ``repeat_interleave``
(:mod:`llama.attention`, which the local LLM's CPU model uses too).

Layouts follow HF transformers (rotate-half RoPE on the checkpoint's own q/k layout, tables from
:mod:`llama.rope`); q/k/v and gate/up are fused into one matmul each, the loader concatenates the
checkpoint's matrices.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from llama.attention import grouped_attention
from llama.rope import angles, rotate_half

from .config import LlamaConfig, validate
from .tokens import AUDIO_END, END_OF_SPEECH


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # In float32 like HF, whatever the model dtype: bf16 variance loses too much.
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class KVCache(nn.Module):
    """One layer's keys and values for every slot: [slots, kv_heads, max_len, head_dim]."""

    def __init__(self, slots: int, kv_heads: int, max_len: int, head_dim: int, dtype, device) -> None:
        super().__init__()
        shape = (slots, kv_heads, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def write(self, rows: Tensor, pos: Tensor, k: Tensor, v: Tensor) -> None:
        """rows [B, 1] and pos [B, T] slot/position indices; k, v [B, T, KV, D]."""
        # Advanced indices around a slice put the indexed dims first: target view is [B, T, KV, D].
        self.k[rows, :, pos] = k
        self.v[rows, :, pos] = v

    def reset(self, slot: int) -> None:
        self.k[slot].zero_()
        self.v[slot].zero_()


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.n_heads, self.n_kv, self.hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wqkv = nn.Linear(cfg.dim, (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)
        self.cache: KVCache | None = None

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, rows: Tensor, pos: Tensor, read, mask: Tensor) -> Tensor:
        """x [B, T, dim]; cos/sin [B, T, 1, hd]; rows [B, 1]; pos [B, T]; mask [B, 1, G*T, S].

        ``read`` says which keys to attend to: ``None`` for the chunk's own (a fresh prefill,
        no cache read), or ``(row_slice, S)`` for cache rows ``row_slice`` up to length S.
        """
        B, T, _ = x.shape
        qkv = self.wqkv(x)
        q, k, v = qkv.split([self.n_heads * self.hd, self.n_kv * self.hd, self.n_kv * self.hd], dim=-1)
        q = q.view(B, T, self.n_heads, self.hd)
        k = k.view(B, T, self.n_kv, self.hd)
        v = v.view(B, T, self.n_kv, self.hd)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        assert self.cache is not None, "call setup_cache() first"
        self.cache.write(rows, pos, k, v)
        if read is None:
            keys, values = k.transpose(1, 2), v.transpose(1, 2)  # [B, KV, T, hd]
        else:
            row_slice, S = read
            keys = self.cache.k[row_slice, :, :S]  # [B, KV, S, hd], a view
            values = self.cache.v[row_slice, :, :S]
        return self.wo(grouped_attention(q, keys, values, mask))


class MLP(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.w13 = nn.Linear(cfg.dim, 2 * cfg.intermediate, bias=False)  # gate and up, fused
        self.w2 = nn.Linear(cfg.intermediate, cfg.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = MLP(cfg)

    def forward(self, x, cos, sin, rows, pos, read, mask):
        x = x + self.attention(self.attention_norm(x), cos, sin, rows, pos, read, mask)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    """Embedding, blocks, final norm, (tied) head. Three entry points share one forward:

    * :meth:`decode` - one token for each of rows ``[0, n)``, at their own positions;
    * :meth:`prefill` - fresh prompts (or prompt chunks starting at 0) for several slots at once;
    * :meth:`extend` - a later chunk of one slot's prompt, attending to what the slot holds.
    """

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        validate(cfg)
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = None if cfg.tie_embeddings else nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.max_slots = 0
        self.max_len = 0
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin", torch.empty(0), persistent=False)

    @property
    def head_weight(self) -> Tensor:
        return self.tok_embeddings.weight if self.output is None else self.output.weight

    @property
    def audio_head(self) -> Tensor:
        """Rows of the head for ids END_OF_SPEECH..AUDIO_END-1 [28680, dim]: a view, no copy.

        Sampling is restricted to these ids (see sampler), so the decode step computes 18% of
        the vocabulary's logits.
        """
        return self.head_weight[END_OF_SPEECH:AUDIO_END]

    def setup_cache(self, max_slots: int, max_len: int) -> None:
        """Allocate the KV cache and RoPE tables once, on the model's device and dtype."""
        p = self.tok_embeddings.weight
        self.max_slots, self.max_len = max_slots, max_len
        for layer in self.layers:
            layer.attention.cache = KVCache(
                max_slots, self.cfg.n_kv_heads, max_len, self.cfg.head_dim, p.dtype, p.device
            )
        emb = angles(self.cfg, max_len).to(p.device)  # [L, hd]
        self.cos = emb.cos().to(p.dtype)
        self.sin = emb.sin().to(p.dtype)

    def reset_slot(self, slot: int) -> None:
        for layer in self.layers:
            layer.attention.cache.reset(slot)

    def _run(self, tokens: Tensor, rows: Tensor, pos: Tensor, read, mask: Tensor) -> Tensor:
        x = self.tok_embeddings(tokens)  # [B, T, dim]
        cos = self.cos[pos].unsqueeze(2)  # [B, T, 1, hd]
        sin = self.sin[pos].unsqueeze(2)
        for layer in self.layers:
            x = layer(x, cos, sin, rows, pos, read, mask)
        return self.norm(x)

    def decode(self, tokens: Tensor, pos: Tensor, L: int) -> Tensor:
        """tokens, pos [n] for rows 0..n-1 -> hidden [n, dim]. Keys beyond ``L`` are not read."""
        n = tokens.shape[0]
        rows = torch.arange(n, device=tokens.device).unsqueeze(1)
        keys = torch.arange(L, device=tokens.device)
        mask = (keys.unsqueeze(0) <= pos.unsqueeze(1))[:, None, None, :]  # [n, 1, 1, L], broadcast over G
        return self._run(tokens.unsqueeze(1), rows, pos.unsqueeze(1), (slice(0, n), L), mask)[:, 0]

    def prefill(self, tokens: Tensor, slots: Tensor, lengths: Tensor) -> Tensor:
        """Fresh prompts: tokens [B, T] (right-padded), slots [B], lengths [B] -> hidden [B, T, dim].

        Positions start at 0, so attention needs only the chunk itself - no cache read, which is
        why several joining streams in different slots can share one call.
        """
        B, T = tokens.shape
        dev = tokens.device
        t = torch.arange(T, device=dev)
        causal = t.unsqueeze(1) >= t.unsqueeze(0)  # [T, T]
        valid = t.unsqueeze(0) < lengths.unsqueeze(1)  # [B, T] keys inside each prompt
        mask = (causal.unsqueeze(0) & valid.unsqueeze(1)).repeat(1, self.cfg.groups, 1).unsqueeze(1)
        pos = t.unsqueeze(0).expand(B, T)
        return self._run(tokens, slots.unsqueeze(1), pos, None, mask)

    def extend(self, tokens: Tensor, slot: int, start: int) -> Tensor:
        """A later prompt chunk of one slot: tokens [1, T] at positions start.. -> hidden [1, T, dim]."""
        T = tokens.shape[1]
        dev = tokens.device
        pos = torch.arange(start, start + T, device=dev).unsqueeze(0)  # [1, T]
        keys = torch.arange(start + T, device=dev)
        mask = (keys.unsqueeze(0) <= pos[0].unsqueeze(1)).repeat(self.cfg.groups, 1)[None, None]
        rows = torch.tensor([[slot]], device=dev)
        return self._run(tokens, rows, pos, (slice(slot, slot + 1), start + T), mask)

    def logits(self, hidden: Tensor) -> Tensor:
        """Full-vocabulary logits (tests, checkpoint checks); serving uses :attr:`audio_head`."""
        return F.linear(hidden, self.head_weight)
