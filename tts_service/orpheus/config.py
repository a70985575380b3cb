"""Model shapes: the Orpheus 3B backbone, a tiny test config, SNAC configs, sampling defaults.

The backbone is Llama-3.2-3B fine-tuned by Canopy Labs; its vocabulary is Llama 3's 128256
text tokens plus 28682 added tokens (specials and 7 x 4096 audio codes), hence 156940. The
config class, its ``config.json`` I/O and the sampling options are the shared ones of
:mod:`llama` (the local LLM reads the same); what is Orpheus's own is here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import llama
from llama import ConfigError, LlamaConfig  # re-exported: the engine's modules and tests import them here


def _llama3_scaling() -> dict:
    return {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }


ORPHEUS_3B = LlamaConfig(
    vocab_size=156940,
    dim=3072,
    n_layers=28,
    n_heads=24,
    n_kv_heads=8,
    head_dim=128,
    intermediate=8192,
    rope_theta=500000.0,
    rope_scaling=_llama3_scaling(),
    tie_embeddings=True,
    max_position=131072,
)

# Small enough that a CPU step takes milliseconds, but every code path of the 3B model is used:
# GQA with 2 query heads per KV head, llama3 rope scaling, tied head, the full vocabulary (the
# audio ids live at 128266+, so the vocabulary cannot shrink).
TINY = replace(ORPHEUS_3B, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, intermediate=128)

PRESETS = {"3b": ORPHEUS_3B, "tiny": TINY}

# What Orpheus's config.json says beyond the shapes (Llama 3's text tokens and the checkpoint's dtype).
HF_EXTRAS = {"bos_token_id": 128000, "eos_token_id": 128009, "torch_dtype": "bfloat16"}


def validate(cfg: LlamaConfig) -> None:
    """:meth:`LlamaConfig.validate`, and room in the vocabulary for the audio ids."""
    cfg.validate()
    from .tokens import AUDIO_END

    if cfg.vocab_size < AUDIO_END:
        raise ConfigError(
            f"vocab_size {cfg.vocab_size} has no room for the audio tokens (ids up to {AUDIO_END - 1}); "
            "this is not an Orpheus checkpoint"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Sampling(llama.Sampling):
    """:class:`llama.Sampling` with the defaults Orpheus is served with.

    The temperature is Orpheus's own; the repetition penalty keeps speech from looping.
    """

    temperature: float = 0.6


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
