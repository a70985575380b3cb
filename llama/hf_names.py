"""Which Hugging Face tensors make up each matrix of the fused layout both Llama runtimes use.

Both runtimes run q/k/v as one matmul and gate/up as another: one call per layer and projection
instead of three or two, whatever the forward pass around it. A checkpoint on disk (an HF
directory, or a GGUF read under HF names) keeps them apart, so each loader concatenates the
same tensors in the same order, and Orpheus' writer splits them back. That fact lives here once;
the runtimes keep their own key names for the fused result.

Plain Python (no torch), like :mod:`llama.config`.
"""

from __future__ import annotations

from .config import LlamaConfig

EMBED = "model.embed_tokens.weight"
NORM = "model.norm.weight"  # the final norm, before the head
LM_HEAD = "lm_head.weight"  # absent when the head is tied to the embedding

MATRICES = ("wqkv", "wo", "w13", "w2")  # rows of the HF tensors concatenated, in this order
NORMS = ("attn_norm", "ffn_norm")  # vectors, taken as they are
PARTS = MATRICES + NORMS


def layer(i: int) -> dict[str, tuple[str, ...]]:
    """Layer ``i``'s parts (:data:`PARTS`, in order) -> the HF tensors each is made of, in row order."""
    p = f"model.layers.{i}."
    return {
        "wqkv": (p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight", p + "self_attn.v_proj.weight"),
        "wo": (p + "self_attn.o_proj.weight",),
        "w13": (p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
        "w2": (p + "mlp.down_proj.weight",),
        "attn_norm": (p + "input_layernorm.weight",),
        "ffn_norm": (p + "post_attention_layernorm.weight",),
    }


def rows(cfg: LlamaConfig, part: str) -> tuple[int, ...]:
    """The rows (first dimension) each of ``part``'s HF tensors holds: how to split the fused one back."""
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    sizes = {
        "wqkv": (q, kv, kv),
        "wo": (cfg.dim,),
        "w13": (cfg.intermediate, cfg.intermediate),
        "w2": (cfg.dim,),
        "attn_norm": (cfg.dim,),
        "ffn_norm": (cfg.dim,),
    }
    return sizes[part]
