"""Model shapes: the Orpheus 3B backbone, a tiny test config, SNAC configs, HF ``config.json`` I/O.

The backbone is Llama-3.2-3B fine-tuned by Canopy Labs; its vocabulary is Llama 3's 128256
text tokens plus 28682 added tokens (specials and 7 x 4096 audio codes), hence 156940.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field


class ConfigError(ValueError):
    """A config this engine cannot run; the message says what to change."""


def _llama3_scaling() -> dict:
    return {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    vocab_size: int = 156940
    dim: int = 3072
    n_layers: int = 28
    n_heads: int = 24
    n_kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 8192
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    rope_scaling: dict | None = field(default_factory=_llama3_scaling)
    tie_embeddings: bool = True
    max_position: int = 131072

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
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"{self.n_heads} attention heads are not a multiple of {self.n_kv_heads} KV heads")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim {self.head_dim} must be even for rotary embeddings")
        from .tokens import AUDIO_END

        if self.vocab_size < AUDIO_END:
            raise ConfigError(
                f"vocab_size {self.vocab_size} has no room for the audio tokens (ids up to {AUDIO_END - 1}); "
                "this is not an Orpheus checkpoint"
            )

    # ------------------------------------------------------------------ HF config.json
    @classmethod
    def from_hf(cls, cfg: dict) -> LlamaConfig:
        """Read a transformers ``LlamaConfig`` dict (v4 ``rope_scaling`` or v5 ``rope_parameters``)."""
        if cfg.get("model_type", "llama") != "llama":
            raise ConfigError(f"model_type {cfg.get('model_type')!r} is not a Llama model")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"hidden_act {cfg.get('hidden_act')!r} is not supported (Llama uses silu)")
        if cfg.get("attention_bias") or cfg.get("mlp_bias"):
            raise ConfigError("attention_bias / mlp_bias are not supported (Llama 3 has no biases)")
        try:
            heads = int(cfg["num_attention_heads"])
            dim = int(cfg["hidden_size"])
            rope = cfg.get("rope_parameters") or {}
            scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
            if scaling is not None:
                kind = scaling.get("rope_type", scaling.get("type"))
                if kind != "llama3":
                    raise ConfigError(f"rope scaling {kind!r} is not supported (only 'llama3')")
                scaling = {k: scaling[k] for k in _llama3_scaling() if k in scaling}
            c = cls(
                vocab_size=int(cfg["vocab_size"]),
                dim=dim,
                n_layers=int(cfg["num_hidden_layers"]),
                n_heads=heads,
                n_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or dim // heads),
                intermediate=int(cfg["intermediate_size"]),
                norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
                rope_theta=float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0))),
                rope_scaling=scaling,
                tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                max_position=int(cfg.get("max_position_embeddings", 131072)),
            )
        except KeyError as exc:
            raise ConfigError(f"config.json lacks {exc.args[0]!r}") from None
        c.validate()
        return c

    def to_hf(self) -> dict:
        out = {
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
            "bos_token_id": 128000,
            "eos_token_id": 128009,
            "torch_dtype": "bfloat16",
        }
        return out

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Sampling:
    """Sampling options of one stream. ``temperature <= 0`` means greedy (tests, reproducible output).

    Defaults are those Orpheus is served with; the repetition penalty keeps speech from looping.
    """

    temperature: float = 0.6
    top_p: float = 0.9
    repetition_penalty: float = 1.1

    @classmethod
    def greedy(cls) -> Sampling:
        return cls(temperature=0.0, top_p=1.0, repetition_penalty=1.0)


ORPHEUS_3B = LlamaConfig()

# Small enough that a CPU step takes milliseconds, but every code path of the 3B model is used:
# GQA with 2 query heads per KV head, llama3 rope scaling, tied head, the full vocabulary (the
# audio ids live at 128266+, so the vocabulary cannot shrink).
TINY = LlamaConfig(
    dim=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=16,
    intermediate=128,
)

PRESETS = {"3b": ORPHEUS_3B, "tiny": TINY}


# ---------------------------------------------------------------------- SNAC
SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 2048  # 4 level-2 codes x hop 512: one 7-token frame is 85.3 ms of audio
TOKENS_PER_FRAME = 7
REALTIME_TOKENS_PER_S = TOKENS_PER_FRAME * SAMPLE_RATE / SAMPLES_PER_FRAME  # 82.03

SNAC_24KHZ = {
    "sampling_rate": 24000,
    "encoder_dim": 48,
    "encoder_rates": [2, 4, 8, 8],
    "decoder_dim": 1024,
    "decoder_rates": [8, 8, 4, 2],
    "attn_window_size": None,
    "codebook_size": 4096,
    "codebook_dim": 8,
    "vq_strides": [4, 2, 1],
    "noise": True,
    "depthwise": True,
}

# Same hop (512), strides and codebooks - so the same codes and the same 2048 samples per frame -
# with narrow channels: decodes in milliseconds on a CPU.
SNAC_TINY = {**SNAC_24KHZ, "encoder_dim": 8, "decoder_dim": 64}

SNAC_PRESETS = {"3b": SNAC_24KHZ, "tiny": SNAC_TINY}


def check_snac_config(cfg: dict) -> None:
    """The token layout fixes the codec: 3 levels with strides 4/2/1, 4096 codes, hop 512."""
    hop = math.prod(cfg.get("decoder_rates", []))
    if list(cfg.get("vq_strides", [])) != [4, 2, 1] or cfg.get("codebook_size") != 4096 or hop != 512:
        raise ConfigError(
            "the SNAC model must have vq_strides [4, 2, 1], codebook_size 4096 and decoder rates multiplying "
            f"to 512 (the 24 kHz model Orpheus was trained with); got strides {cfg.get('vq_strides')}, "
            f"codebook {cfg.get('codebook_size')}, hop {hop}"
        )
