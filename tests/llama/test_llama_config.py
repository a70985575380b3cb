"""The shared Llama config (both runtimes read ``config.json`` and GGUF metadata through it)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from llama import ConfigError, LlamaConfig, Sampling

ROOT = Path(__file__).resolve().parents[2]
SMALL = LlamaConfig(vocab_size=1000, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, intermediate=128)
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def test_hf_round_trip_keeps_every_field():
    for cfg in (SMALL, replace(SMALL, rope_scaling=LLAMA3, tie_embeddings=False, rope_theta=5e5, max_position=131072)):
        assert LlamaConfig.from_hf(json.loads(json.dumps(cfg.to_hf()))) == cfg


def test_transformers_v5_rope_parameters():
    hf = SMALL.to_hf()
    del hf["rope_theta"], hf["rope_scaling"]
    assert LlamaConfig.from_hf({**hf, "rope_parameters": {"rope_type": "default", "rope_theta": 1e5}}).rope_theta == 1e5
    scaled = LlamaConfig.from_hf({**hf, "rope_parameters": {**LLAMA3, "rope_theta": 5e5}})
    assert scaled.rope_scaling == LLAMA3 and scaled.rope_theta == 5e5


def test_defaults_are_transformers_defaults():
    hf = {k: v for k, v in SMALL.to_hf().items() if k not in ("tie_word_embeddings", "max_position_embeddings")}
    cfg = LlamaConfig.from_hf(hf)
    assert cfg.tie_embeddings is False and cfg.max_position == 2048


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "mistral"}, "not a Llama model"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"attention_bias": True}, "bias"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "'linear' is not supported"),
        ({"num_key_value_heads": 3}, "not a multiple"),
        ({"hidden_size": None}, None),
    ],
)
def test_what_no_runtime_here_can_run_is_refused(change, message):
    hf = {**SMALL.to_hf(), **change}
    if message is None:  # a missing field names itself
        del hf["hidden_size"]
        message = "lacks 'hidden_size'"
    with pytest.raises(ConfigError, match=message):
        LlamaConfig.from_hf(hf)


def test_gguf_metadata():
    fields = {
        "general.architecture": "llama",
        "llama.embedding_length": 576,
        "llama.attention.head_count": 9,
        "llama.attention.head_count_kv": 3,
        "llama.block_count": 30,
        "llama.feed_forward_length": 1536,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.rope.freq_base": 100000.0,
        "llama.context_length": 8192,
        "tokenizer.ggml.tokens": ["a"] * 49152,
    }
    cfg = LlamaConfig.from_gguf_fields(fields)
    assert (cfg.vocab_size, cfg.head_dim, cfg.groups, cfg.max_position) == (49152, 64, 3, 8192)
    with pytest.raises(ConfigError, match="not llama"):
        LlamaConfig.from_gguf_fields({**fields, "general.architecture": "qwen2"})


def test_a_cache_file_from_before_a_field_existed_still_loads():
    old = {k: v for k, v in SMALL.as_dict().items() if k not in ("rope_scaling", "tie_embeddings")}
    assert LlamaConfig.from_json(json.dumps(old)) == SMALL
    assert LlamaConfig.from_json(SMALL.to_json()) == SMALL


def test_sampling_options_are_keyword_only_and_each_runtime_keeps_its_defaults():
    from tts_service.orpheus.config import Sampling as SpeechSampling

    with pytest.raises(TypeError):
        Sampling(0.5)  # type: ignore[misc]
    assert Sampling().temperature == 0.0  # the local LLM: greedy unless asked
    assert SpeechSampling().temperature == 0.6 and isinstance(SpeechSampling(), Sampling)
    assert SpeechSampling.greedy() == SpeechSampling(temperature=0.0, top_p=1.0, repetition_penalty=1.0)


def test_the_package_imports_no_torch_and_nothing_of_the_repository():
    code = "import sys; sys.modules['torch'] = None; import llama, tts_service.orpheus.config; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
    ours = ("tts_service", "agent", "pipelines", "bench", "sim", "support", "tests")
    for path in sorted((ROOT / "llama").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            assert not [n for n in names if n.split(".")[0] in ours], f"{path.name} imports {names}"


def test_each_runtime_refuses_what_only_it_cannot_run():
    pytest.importorskip("torch")
    from pipelines.llm_model import SMOLLM2_135M, ModelFormatError, check_runnable
    from tts_service.orpheus.config import TINY, validate

    assert check_runnable(SMOLLM2_135M) is SMOLLM2_135M
    with pytest.raises(ModelFormatError, match="rope scaling"):
        check_runnable(replace(SMALL, rope_scaling=LLAMA3))
    with pytest.raises(ModelFormatError, match="tied"):
        check_runnable(replace(SMALL, tie_embeddings=False))
    validate(TINY)
    with pytest.raises(ConfigError, match="no room for the audio tokens"):
        validate(SMALL)
