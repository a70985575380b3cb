"""The Llama description both runtimes read: shapes from HF ``config.json`` or GGUF metadata, and
per-request sampling options.

Why one class for two models: SmolLM2 (the local LLM) and Orpheus's Llama 3.2 backbone differ
only in numbers (and in Llama 3's RoPE rescaling, a field here), so reading, writing and
checking a config is one piece of code. What a runtime cannot run (the CPU model has no RoPE
rescaling and needs a tied head; Orpheus needs room for its audio ids) it checks itself, after
parsing. No torch here: a launcher lists presets and parses options without the optional extras.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass


class ConfigError(ValueError):
    """A config this code cannot run; the message says what to change."""


LLAMA3_SCALING_KEYS = ("rope_type", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    """A Llama decoder's shapes. Defaults are transformers' ``LlamaConfig`` defaults where a
    ``config.json`` may leave a field out; the sizes have none (presets name them)."""

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # Llama 3's long-context rescaling (``LLAMA3_SCALING_KEYS``) or None
    tie_embeddings: bool = True
    max_position: int = 2048

    @property
    def groups(self) -> int:
        """Query heads per KV head (GQA)."""
        return self.n_heads // self.n_kv_heads

    def n_params(self) -> int:
        attn = self.dim * self.head_dim * (self.n_heads * 2 + self.n_kv_heads * 2)
        mlp = 3 * self.dim * self.intermediate
        head = 0 if self.tie_embeddings else self.vocab_size * self.dim
        return self.vocab_size * self.dim + head + self.n_layers * (attn + mlp + 2 * self.dim) + self.dim

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * dtype_bytes

    def validate(self) -> None:
        """What every Llama forward here assumes: whole GQA groups, an even rotary dimension."""
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"{self.n_heads} attention heads are not a multiple of {self.n_kv_heads} KV heads")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim {self.head_dim} must be even for rotary embeddings")

    # ------------------------------------------------------------------ HF config.json
    @classmethod
    def from_hf(cls, cfg: dict) -> LlamaConfig:
        """Read a transformers ``LlamaConfig`` dict (v4 ``rope_scaling`` or v5 ``rope_parameters``)."""
        if cfg.get("model_type", "llama") != "llama":
            raise ConfigError(f"model_type {cfg.get('model_type')!r} is not a Llama model")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"hidden_act {cfg.get('hidden_act')!r} is not supported (Llama uses silu)")
        if cfg.get("attention_bias") or cfg.get("mlp_bias"):
            raise ConfigError("attention_bias / mlp_bias are not supported (Llama has no biases)")
        rope = cfg.get("rope_parameters") or {}
        scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        if scaling is not None:
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind != "llama3":
                raise ConfigError(f"rope scaling {kind!r} is not supported (only 'llama3')")
            scaling = {k: scaling[k] for k in LLAMA3_SCALING_KEYS if k in scaling}
        try:
            heads = int(cfg["num_attention_heads"])
            dim = int(cfg["hidden_size"])
            c = cls(
                vocab_size=int(cfg["vocab_size"]),
                dim=dim,
                n_layers=int(cfg["num_hidden_layers"]),
                n_heads=heads,
                n_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or dim // heads),
                intermediate=int(cfg["intermediate_size"]),
                norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
                rope_theta=float(rope.get("rope_theta") or cfg.get("rope_theta") or 10000.0),
                rope_scaling=scaling,
                tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                max_position=int(cfg.get("max_position_embeddings", 2048)),
            )
        except KeyError as exc:
            raise ConfigError(f"config.json lacks {exc.args[0]!r}") from None
        c.validate()
        return c

    def to_hf(self) -> dict:
        """A transformers ``LlamaConfig`` dict (``config.json``; tests build reference models from it)."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "vocab_size": self.vocab_size,
            "hidden_size": self.dim,
            "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate,
            "hidden_act": "silu",
            "rms_norm_eps": self.norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": dict(self.rope_scaling) if self.rope_scaling else None,
            "tie_word_embeddings": self.tie_embeddings,
            "max_position_embeddings": self.max_position,
            "attention_bias": False,
            "mlp_bias": False,
        }

    # ------------------------------------------------------------------ GGUF metadata
    @classmethod
    def from_gguf_fields(cls, fields: dict) -> LlamaConfig:
        """From a GGUF file's metadata (``llama.*`` keys), as llama.cpp writes it."""
        arch = fields.get("general.architecture")
        if arch != "llama":
            raise ConfigError(f"GGUF architecture {arch!r} is not llama")
        p = "llama."
        try:
            dim, heads = int(fields[p + "embedding_length"]), int(fields[p + "attention.head_count"])
            c = cls(
                vocab_size=int(fields.get(p + "vocab_size") or len(fields["tokenizer.ggml.tokens"])),
                dim=dim,
                n_layers=int(fields[p + "block_count"]),
                n_heads=heads,
                n_kv_heads=int(fields.get(p + "attention.head_count_kv", heads)),
                head_dim=int(fields.get(p + "rope.dimension_count", dim // heads)),
                intermediate=int(fields[p + "feed_forward_length"]),
                norm_eps=float(fields[p + "attention.layer_norm_rms_epsilon"]),
                rope_theta=float(fields.get(p + "rope.freq_base", 10000.0)),
                max_position=int(fields.get(p + "context_length", 2048)),
            )
        except KeyError as exc:
            raise ConfigError(f"GGUF metadata lacks {exc.args[0]!r}") from None
        c.validate()
        return c

    # ------------------------------------------------------------------ our own cache files
    def as_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> LlamaConfig:
        """What :meth:`to_json` wrote (a file written before a field existed takes its default)."""
        return cls(**json.loads(text))


@dataclass(frozen=True, slots=True, kw_only=True)
class Sampling:
    """One request's (or stream's) sampling options; ``temperature <= 0`` is greedy.

    The defaults are the local LLM's (greedy: replies reproducible); Orpheus's served ones are
    :class:`tts_service.orpheus.config.Sampling`. ``max_tokens`` and ``seed`` are read by the
    one-request loop (:func:`llama.sampler.choose`'s callers); the batched speech sampler has its
    own length limit and draws from the device's generator (a captured CUDA graph takes no
    per-row generator). Keyword-only: the two runtimes once ordered these fields differently.
    """

    temperature: float = 0.0
    top_p: float = 0.9
    repetition_penalty: float = 1.1  # HF's: over every id of the prompt and the output so far
    max_tokens: int = 128
    seed: int | None = None

    @classmethod
    def greedy(cls, **options) -> Sampling:
        """Argmax decoding, no penalty (reproducible output: tests, checks)."""
        return cls(**{"temperature": 0.0, "top_p": 1.0, "repetition_penalty": 1.0, **options})
