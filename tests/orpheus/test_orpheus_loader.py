"""Checkpoints on disk: HF layout (safetensors + config.json + tokenizer.json) and SNAC's layout."""

from __future__ import annotations

import json

import numpy as np
import pytest
import snac.layers
import torch

from tts_service.core.engine import Engine
from tts_service.orpheus import loader
from tts_service.orpheus.config import SNAC_TINY, TINY, LlamaConfig
from tts_service.orpheus.loader import CheckpointError
from tts_service.orpheus.tokens import build_prompt


def write_tokenizer(directory) -> None:
    """A small byte-level BPE tokenizer.json, trained in milliseconds with the tokenizers package."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|begin_of_text|>"], show_progress=False)
    text = ["tara: Hello there, how are you today?", "The quick brown fox jumps over the lazy dog."] * 20
    tok.train_from_iterator(text, trainer)
    tok.save(str(directory / "tokenizer.json"))


@pytest.fixture(scope="module")
def checkpoint(tiny_model, tmp_path_factory):
    d = tmp_path_factory.mktemp("orpheus-tiny")
    loader.save_llama(tiny_model, d)
    write_tokenizer(d)
    return d


def logits_of(model, ids):
    model.setup_cache(2, 512)
    with torch.inference_mode():
        hidden = model.prefill(torch.tensor([ids]), torch.tensor([1]), torch.tensor([len(ids)]))
        return model.logits(hidden)


def test_hf_checkpoint_loads_with_the_same_logits(tiny_model, checkpoint):
    files = sorted(p.name for p in checkpoint.iterdir())
    assert files == ["config.json", "model.safetensors", "tokenizer.json"]
    cfg = json.loads((checkpoint / "config.json").read_text())
    assert cfg["tie_word_embeddings"] is True and cfg["rope_scaling"]["rope_type"] == "llama3"
    loaded = loader.load_llama(checkpoint, dtype="fp32")
    assert loaded.cfg == tiny_model.cfg
    tok = loader.load_tokenizer(checkpoint)
    ids = build_prompt(tok, "Hello there, how are you?", "tara")
    assert ids[:2] == [128259, 128000] and ids[-4:] == [128009, 128260, 128261, 128257]
    a, b = logits_of(tiny_model, ids), logits_of(loaded, ids)
    assert a.shape == (1, len(ids), TINY.vocab_size)
    assert torch.equal(a, b)


def test_bf16_load_is_close(checkpoint, tiny_model):
    ids = list(range(1000, 1020))
    ref = logits_of(tiny_model, ids)
    got = logits_of(loader.load_llama(checkpoint, dtype="bf16"), ids).float()
    assert (got - ref).abs().max() < 0.05 * ref.abs().max()


def test_logits_match_transformers_llama(checkpoint, tiny_model):
    """Our forward (fused q/k/v, GQA folding, llama3 RoPE) against the reference implementation."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.LlamaForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    ids = [int(x) for x in np.random.default_rng(0).integers(0, TINY.vocab_size, 300)]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits
    assert (logits_of(tiny_model, ids) - ref).abs().max() < 1e-4


def test_sharded_checkpoint_and_untied_head(tmp_path):
    from safetensors.torch import save_file

    cfg = LlamaConfig(**{**TINY.as_dict(), "tie_embeddings": False, "n_layers": 1})
    model = loader.random_llama(cfg, seed=3)
    tensors = loader._ours_to_hf(model)
    names = sorted(tensors)
    save_file({k: tensors[k] for k in names[: len(names) // 2]}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({k: tensors[k] for k in names[len(names) // 2 :]}, str(tmp_path / "model-00002-of-00002.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_hf()))
    loaded = loader.load_llama(tmp_path, dtype="fp32")
    assert loaded.output is not None
    assert torch.equal(loaded.output.weight, model.output.weight)


def test_clear_errors(tmp_path, tiny_model):
    with pytest.raises(CheckpointError, match="not a directory"):
        loader.load_llama(tmp_path / "nope")
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        loader.load_llama(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(TINY.to_hf()))
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors"):
        loader.load_llama(tmp_path)
    loader.save_llama(tiny_model, tmp_path)
    wrong = {**TINY.to_hf(), "intermediate_size": 96}
    (tmp_path / "config.json").write_text(json.dumps(wrong))
    with pytest.raises(CheckpointError, match="do not belong together"):
        loader.load_llama(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**TINY.to_hf(), "num_hidden_layers": 3}))
    with pytest.raises(CheckpointError, match="missing"):
        loader.load_llama(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**TINY.to_hf(), "vocab_size": 128256}))
    with pytest.raises(CheckpointError, match="no room for the audio tokens"):
        loader.load_llama(tmp_path)
    with pytest.raises(CheckpointError, match=r"tokenizer\.json"):
        loader.load_tokenizer(tmp_path)


def test_snac_checkpoint_round_trip(tmp_path, tiny_snac, monkeypatch):
    monkeypatch.setattr(snac.layers.NoiseBlock, "forward", lambda self, x: x)
    from snac import SNAC

    torch.manual_seed(0)
    original = SNAC(**SNAC_TINY)  # with weight-norm parametrisations, as published checkpoints are
    codes = [torch.randint(0, 4096, (1, n)) for n in (3, 6, 12)]
    with torch.no_grad():
        ref = original.decode(codes)
    loader.save_snac(original, tmp_path / "a", SNAC_TINY)
    loader.save_snac(tiny_snac, tmp_path / "b", SNAC_TINY)  # weight norm already folded
    with torch.no_grad():
        assert torch.allclose(loader.load_snac(tmp_path / "a").decode(codes), ref, atol=1e-5)
        assert torch.allclose(loader.load_snac(tmp_path / "b").decode(codes), tiny_snac.decode(codes), atol=1e-6)
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        loader.load_snac(tmp_path / "missing")
    (tmp_path / "config.json").write_text(json.dumps({**SNAC_TINY, "vq_strides": [8, 4, 2, 1]}))
    with pytest.raises(CheckpointError, match="vq_strides"):
        loader.load_snac(tmp_path)


def test_engine_from_disk_runs(checkpoint, tiny_snac, tmp_path):
    from tts_service.orpheus.serve import build_engine

    snac_dir = loader.save_snac(tiny_snac, tmp_path / "snac", SNAC_TINY)
    engine = build_engine(
        model_path=str(checkpoint), snac_path=str(snac_dir), max_slots=1, max_len=512, progress=lambda *_: None
    )
    assert engine.voices["tara"].model == str(checkpoint)
    # the server reads it only through the core's Engine protocol, as it reads Piper's
    assert isinstance(engine, Engine)
    assert {v.name for v in engine.describe_voices()} == set(engine.voices)
    assert len(engine.prompt_ids("Hello.", "leo")) > 8
