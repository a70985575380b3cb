"""Building an Orpheus engine from command-line options (``streamvox serve --engine orpheus``, the bench).

The registry's entry for ``orpheus`` (:mod:`tts_service.engines`). Importing this module does
not import torch: the CLI adds the options of every engine, and only ``build*`` and
:func:`synthesizer` pull the Orpheus dependencies in.
"""

from __future__ import annotations

import argparse
import logging
import os
import time

from ..core.engine import EngineSetupError
from .config import PRESETS, Sampling
from .tokens import VOICES

log = logging.getLogger(__name__)
DESCRIPTION = "Llama + SNAC in torch (GPU), needs streamvox[orpheus]"


class OrpheusSetupError(EngineSetupError):
    """Something the user can fix (a path, a missing package); the message says what."""


def add_args(p: argparse.ArgumentParser) -> None:
    """Orpheus' options of ``streamvox serve`` (:func:`add_model_args` with ``--voice``)."""
    add_model_args(p)


def add_model_args(p: argparse.ArgumentParser, *, voice: bool = True) -> None:
    """Options shared by ``serve --engine orpheus`` and ``bench engine``."""
    g = p.add_argument_group("Orpheus engine (--engine orpheus)")
    g.add_argument(
        "--model-path",
        default=os.environ.get("STREAMVOX_ORPHEUS_PATH"),
        metavar="DIR",
        help="local HF checkpoint folder: config.json, *.safetensors, tokenizer.json",
    )
    g.add_argument(
        "--snac-path",
        default=os.environ.get("STREAMVOX_SNAC_PATH"),
        metavar="DIR",
        help="local SNAC 24 kHz folder: config.json + pytorch_model.bin",
    )
    g.add_argument(
        "--random-weights",
        choices=sorted(PRESETS),
        default=None,
        help="untrained model of this size instead of checkpoints: for tests and timings; AUDIO IS NOISE",
    )
    if voice:
        g.add_argument("--voice", default=None, help=f"default Orpheus voice ({', '.join(VOICES)})")
    g.add_argument(
        "--dtype",
        choices=["bf16", "fp16", "fp32"],
        default=None,
        help="model dtype (default: bf16 on cuda, fp32 on cpu)",
    )
    g.add_argument(
        "--max-slots",
        type=int,
        default=None,
        help="concurrent generations (KV cache rows); default 64 on cuda, 4 on cpu",
    )
    g.add_argument("--max-len", type=int, default=2048, help="prompt + audio tokens per segment (KV cache length)")
    g.add_argument(
        "--codec-right",
        type=int,
        default=2,
        help="SNAC frames of right context per window: latency (85 ms each) vs seam error (see codec.py)",
    )
    g.add_argument("--no-cuda-graphs", action="store_true", help="decode eagerly on cuda (debugging)")


def build_engine(
    *,
    model_path: str | None = None,
    snac_path: str | None = None,
    random_weights: str | None = None,
    device: str = "cpu",
    dtype: str | None = None,
    max_slots: int | None = None,
    max_len: int = 2048,
    voice: str | None = None,
    cuda_graphs: bool = True,
    max_new_tokens: int | None = None,
    codec_right: int = 2,
    seed: int = 0,
    warm_up: bool = True,
    progress=print,
):
    """Load (or make) the backbone, tokenizer and codec; warm up; return an ``OrpheusEngine``."""
    try:
        import torch

        from .codec import WindowedCodec
        from .engine import EngineOptions, OrpheusEngine
        from .loader import (
            RANDOM_WEIGHTS_WARNING,
            CheckpointError,
            load_llama,
            load_snac,
            load_tokenizer,
            random_llama,
            random_snac,
            random_tokenizer,
        )
    except ImportError as exc:
        raise OrpheusSetupError(
            f"the Orpheus engine needs torch and snac ({exc}): pip install 'streamvox[orpheus]'"
        ) from None
    if device == "cuda" and not torch.cuda.is_available():
        raise OrpheusSetupError("--device cuda, but this torch has no CUDA device; use --device cpu or a CUDA build")
    if not random_weights and not (model_path and snac_path):
        raise OrpheusSetupError(
            "--engine orpheus needs --model-path DIR and --snac-path DIR (local checkpoints), "
            "or --random-weights tiny|3b for an untrained model (noise, for tests and timings)"
        )
    if voice is not None and voice not in VOICES:
        raise OrpheusSetupError(f"unknown voice {voice!r}; Orpheus voices: {', '.join(VOICES)}")
    dtype = dtype or ("bf16" if device == "cuda" else "fp32")
    max_slots = max_slots or (64 if device == "cuda" else 4)
    t0 = time.perf_counter()
    try:
        if random_weights:
            progress(RANDOM_WEIGHTS_WARNING.format(which=random_weights))
            model = random_llama(random_weights, device=device, dtype=dtype, seed=seed)
            tokenizer = random_tokenizer()
            snac = random_snac(random_weights, device=device, seed=seed)
        else:
            progress(f"loading {model_path} ({device}, {dtype}) ...")
            model = load_llama(model_path, device=device, dtype=dtype)
            tokenizer = load_tokenizer(model_path)
            snac = load_snac(snac_path, device=device)
    except CheckpointError as exc:
        raise OrpheusSetupError(str(exc)) from None
    progress(f"model ready in {time.perf_counter() - t0:.1f} s ({model.cfg.n_params() / 1e9:.2f} B parameters)")
    options = EngineOptions(max_slots=max_slots, max_len=max_len, cuda_graphs=cuda_graphs, codec_right=codec_right)
    if max_new_tokens:
        options.max_new_tokens = max_new_tokens
    codec = WindowedCodec(
        snac, device=device, left=options.codec_left, right=options.codec_right, chunks=options.codec_chunks
    )
    engine = OrpheusEngine(
        model,
        codec,
        tokenizer,
        default_voice=voice,
        options=options,
        model_path=str(model_path or ""),
        random_weights=random_weights,
    )
    if warm_up:
        t0 = time.perf_counter()
        times = engine.warm_up(progress=progress)
        slowest = max(times.values()) * 1000
        progress(
            f"warmed up {len(times)} batch sizes in {time.perf_counter() - t0:.1f} s "
            f"(decode step {min(times.values()) * 1000:.1f}-{slowest:.1f} ms)"
        )
    return engine


def engine_from_args(args: argparse.Namespace, *, max_slots: int | None, voice: str | None = None):
    """:func:`build_engine` from the options of :func:`add_model_args` (serve and bench share them)."""
    return build_engine(
        model_path=args.model_path,
        snac_path=args.snac_path,
        random_weights=args.random_weights,
        device=args.device,
        dtype=args.dtype,
        max_slots=max_slots,
        max_len=args.max_len,
        voice=voice,
        cuda_graphs=not args.no_cuda_graphs,
        codec_right=args.codec_right,
    )


def build(args: argparse.Namespace, *, metrics=None):
    """``streamvox serve --engine orpheus``: the engine wrapped for ``tts_service.server.Server``."""
    from .scheduler import OrpheusOptions

    if args.device == "cpu" and args.threads:
        import torch

        torch.set_num_threads(args.threads)
    engine = engine_from_args(args, max_slots=args.max_slots, voice=args.voice)
    options = OrpheusOptions(lead_s=args.lead_ms / 1000, max_streams=args.max_streams, sampling=Sampling())
    return synthesizer(engine, options=options, metrics=metrics)


def synthesizer(engine=None, *, options=None, metrics=None):
    """A loaded ``OrpheusEngine`` wrapped for the server; ``options`` are ``OrpheusOptions``.
    There is no default engine: a model is too big to load behind the caller's back."""
    if engine is None:
        raise OrpheusSetupError("an Orpheus server needs an engine: build one with build_engine(...)")
    from .runtime import OrpheusSynthesizer

    return OrpheusSynthesizer(engine, options=options, metrics=metrics)
