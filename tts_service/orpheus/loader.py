"""Checkpoints: a local HF Llama directory, a local SNAC directory, or random weights.

HF directory: ``config.json``, ``*.safetensors`` (one file or shards), ``tokenizer.json`` (read
with the ``tokenizers`` package; transformers is not needed). The model is built on the meta
device in the target dtype and filled tensor by tensor, so a 3B bf16 checkpoint needs ~6.6 GB,
not a float32 copy first.

SNAC directory: ``config.json`` + ``pytorch_model.bin`` (what ``SNAC.from_pretrained`` reads) or
``model.safetensors``. Weight-norm reparametrisations are folded into plain weights after
loading: they are recomputed at every call otherwise.

``--random-weights tiny|3b`` builds the same modules with random weights: the compute is the
real one (timings are honest), the audio is noise.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from torch import nn

from llama import hf_names

from .config import HF_EXTRAS, PRESETS, SNAC_PRESETS, ConfigError, LlamaConfig, check_snac_config, validate
from .model import Transformer
from .tokens import HashTokenizer, HFTokenizer

log = logging.getLogger(__name__)

RANDOM_WEIGHTS_WARNING = (
    "*** RANDOM WEIGHTS ({which}): the model is untrained - every stream's AUDIO IS NOISE. "
    "Use this only for tests and timings; pass --model-path/--snac-path for speech. ***"
)


class CheckpointError(Exception):
    """A checkpoint that cannot be loaded; the message says what is wrong and what to do."""


def _dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return {
            "bf16": torch.bfloat16,
            "bfloat16": torch.bfloat16,
            "fp16": torch.float16,
            "float16": torch.float16,
            "fp32": torch.float32,
            "float32": torch.float32,
            "float64": torch.float64,
        }[name]
    except KeyError:
        raise CheckpointError(f"unknown dtype {name!r}; use bf16, fp16 or fp32") from None


def _empty_model(cfg: LlamaConfig, device, dtype) -> Transformer:
    """Parameters allocated (uninitialised) directly on ``device`` in ``dtype``."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            model = Transformer(cfg)
    finally:
        torch.set_default_dtype(previous)
    return model.to_empty(device=device).eval().requires_grad_(False)


# ---------------------------------------------------------------------- Llama
def random_llama(preset: str | LlamaConfig, *, device="cpu", dtype="fp32", seed: int = 0) -> Transformer:
    """Random weights (std 0.02, unit norms) of a preset config, generated on the device."""
    cfg = PRESETS[preset] if isinstance(preset, str) else preset
    model = _empty_model(cfg, torch.device(device), _dtype(dtype))
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    return model


# this model's parameter (under ``layers.{i}.``) for each part of a layer (:data:`llama.hf_names.PARTS`)
_OURS = {
    "wqkv": "attention.wqkv.weight",
    "wo": "attention.wo.weight",
    "w13": "feed_forward.w13.weight",
    "w2": "feed_forward.w2.weight",
    "attn_norm": "attention_norm.weight",
    "ffn_norm": "ffn_norm.weight",
}


def _hf_to_ours(cfg: LlamaConfig, get) -> dict[str, torch.Tensor]:
    """HF tensor names -> this model's (q/k/v and gate/up fused). ``get(name)`` reads one tensor."""
    out = {"tok_embeddings.weight": get(hf_names.EMBED), "norm.weight": get(hf_names.NORM)}
    if not cfg.tie_embeddings:
        out["output.weight"] = get(hf_names.LM_HEAD)
    for i in range(cfg.n_layers):
        for part, names in hf_names.layer(i).items():
            parts = [get(n) for n in names]
            out[f"layers.{i}.{_OURS[part]}"] = torch.cat(parts) if len(parts) > 1 else parts[0]
    return out


def _ours_to_hf(model: Transformer) -> dict[str, torch.Tensor]:
    cfg, sd = model.cfg, model.state_dict()
    out = {hf_names.EMBED: sd["tok_embeddings.weight"], hf_names.NORM: sd["norm.weight"]}
    if not cfg.tie_embeddings:
        out[hf_names.LM_HEAD] = sd["output.weight"]
    for i in range(cfg.n_layers):
        for part, names in hf_names.layer(i).items():
            out.update(zip(names, sd[f"layers.{i}.{_OURS[part]}"].split(hf_names.rows(cfg, part)), strict=True))
    return {k: v.contiguous() for k, v in out.items()}


def save_llama(model: Transformer, directory: str | Path) -> Path:
    """Write ``config.json`` + ``model.safetensors`` in HF layout (tests; converting a model)."""
    from safetensors.torch import save_file

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({**model.cfg.to_hf(), **HF_EXTRAS}, indent=2))
    save_file(_ours_to_hf(model), str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


def load_llama(directory: str | Path, *, device="cpu", dtype="bf16") -> Transformer:
    """Load a local HF Llama checkpoint (Orpheus 3B fine-tune or any compatible model)."""
    from safetensors import safe_open

    d = Path(directory)
    if not d.is_dir():
        raise CheckpointError(f"--model-path {d} is not a directory (expected an HF model folder)")
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{d} has no config.json: point --model-path at the folder holding the HF checkpoint")
    try:
        cfg = LlamaConfig.from_hf(json.loads(cfg_path.read_text()))
        validate(cfg)
    except (ConfigError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{cfg_path}: {exc}") from None
    files = sorted(d.glob("*.safetensors"))
    if not files:
        hint = " (convert .bin weights to safetensors first)" if list(d.glob("*.bin")) else ""
        raise CheckpointError(f"{d} has no *.safetensors weights{hint}")
    handles = [safe_open(str(f), framework="pt", device="cpu") for f in files]
    where = {name: h for h in handles for name in h.keys()}
    if not cfg.tie_embeddings and hf_names.LM_HEAD not in where:
        log.warning("config says untied embeddings but there is no lm_head.weight: tying the head to the embedding")
        cfg = LlamaConfig(**{**cfg.as_dict(), "tie_embeddings": True})
    missing: list[str] = []

    def get(name: str) -> torch.Tensor:
        h = where.get(name)
        if h is None:
            missing.append(name)
            return torch.empty(0)
        return h.get_tensor(name)

    target = torch.device(device)
    model = _empty_model(cfg, target, _dtype(dtype))
    params = dict(model.named_parameters())
    tensors = _hf_to_ours(cfg, get)
    if missing:
        raise CheckpointError(f"{d}: {len(missing)} tensors missing, e.g. {missing[:3]} - is this a Llama checkpoint?")
    with torch.no_grad():
        for name, t in tensors.items():
            p = params[name]
            if tuple(t.shape) != tuple(p.shape):
                raise CheckpointError(
                    f"{d}: {name} has shape {tuple(t.shape)}, config.json implies {tuple(p.shape)} - "
                    "config and weights do not belong together"
                )
            p.copy_(t.to(p.dtype))
    return model


def load_tokenizer(directory: str | Path) -> HFTokenizer:
    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        raise CheckpointError(f"{path} not found: the model folder must hold the HF fast tokenizer (tokenizer.json)")
    return HFTokenizer(path)


def random_tokenizer() -> HashTokenizer:
    return HashTokenizer()


# ---------------------------------------------------------------------- SNAC
def _fold_weight_norm(module: nn.Module) -> nn.Module:
    from torch.nn.utils import parametrize

    for m in module.modules():
        if parametrize.is_parametrized(m, "weight"):
            parametrize.remove_parametrizations(m, "weight", leave_parametrized=True)
    return module


def _snac_class():
    try:
        from snac import SNAC
    except ImportError:
        raise CheckpointError("the SNAC codec is missing: pip install 'streamvox[orpheus]'") from None
    return SNAC


def random_snac(preset: str | dict = "3b", *, device="cpu", seed: int = 0):
    """A SNAC decoder with random weights (the real 24 kHz shapes for '3b', narrow ones for 'tiny')."""
    cfg = SNAC_PRESETS[preset] if isinstance(preset, str) else preset
    check_snac_config(cfg)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        snac = _snac_class()(**cfg)
    return _fold_weight_norm(snac).to(device).eval().requires_grad_(False)


def save_snac(snac, directory: str | Path, config: dict) -> Path:
    """``config.json`` + ``pytorch_model.bin`` as published (tests)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    torch.save(snac.state_dict(), d / "pytorch_model.bin")
    return d


def load_snac(directory: str | Path, *, device="cpu"):
    d = Path(directory)
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{d} has no config.json: point --snac-path at a local copy of the SNAC 24 kHz model")
    try:
        cfg = json.loads(cfg_path.read_text())
        check_snac_config(cfg)
    except (ConfigError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{cfg_path}: {exc}") from None
    snac = _snac_class()(**cfg)
    if (d / "model.safetensors").is_file():
        from safetensors.torch import load_file

        state = load_file(str(d / "model.safetensors"))
    elif (d / "pytorch_model.bin").is_file():
        state = torch.load(d / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise CheckpointError(f"{d} has neither pytorch_model.bin nor model.safetensors")
    if not any(k.endswith(("weight_g", "original0")) for k in state):
        _fold_weight_norm(snac)  # saved after folding (as save_snac does with a served model)
    try:
        snac.load_state_dict(state)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0]
        raise CheckpointError(f"{d}: weights do not match config.json ({first})") from None
    return _fold_weight_norm(snac).to(device).eval().requires_grad_(False)
