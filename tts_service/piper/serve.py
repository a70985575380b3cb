"""Building a Piper engine from command-line options (``streamvox serve``, the default engine).

The registry's entry for ``piper`` (:mod:`tts_service.engines`). Importing this module loads
no model library: every ``serve`` parser adds these options, and only :func:`build`,
:func:`synthesizer` and :func:`load_piper_engine` load voices (onnxruntime).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

from ..core.engine import EngineSetupError

DESCRIPTION = "ONNX voices (default)"


def add_args(p: argparse.ArgumentParser) -> None:
    """Piper's options of ``streamvox serve``."""
    g = p.add_argument_group("Piper engine (--engine piper, the default)")
    g.add_argument(
        "--voice-path",
        action="append",
        default=[],
        metavar="X.onnx",
        help="a Piper voice (with X.onnx.json beside it); repeat to load several. "
        "Default: the bundled en_US-joe-medium, or $STREAMVOX_VOICE_PATH",
    )
    g.add_argument(
        "--capacity",
        type=float,
        default=0.85,
        metavar="F",
        help="share of the synthesis worker's time admitted streams may need before new ones get "
        "'overloaded' (default 0.85; above 1 overcommits, for tests on a busy machine)",
    )
    g.add_argument(
        "--first-cut-ms",
        type=parse_first_cut_ms,
        default=None,
        metavar="MS",
        help="before a context's first audio, text that has waited this long without a clause or sentence "
        f"end is cut at a word and spoken (default {round(1000 * _default_first_cut_s())}; lower for a slow "
        "LLM, at some cost in phrasing)",
    )


def _default_first_cut_s() -> float:
    from .scheduler import PiperSchedulerOptions

    return PiperSchedulerOptions().first_cut_s


def parse_first_cut_ms(text: str) -> int:
    """``--first-cut-ms``'s value (argparse type): whole milliseconds, 1 to 5000."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of milliseconds: {text!r}") from None
    if not 0 < value <= 5000:
        raise argparse.ArgumentTypeError(f"must be between 1 and 5000 ms, not {value}")
    return value


def load_piper_engine(
    voice_paths: Sequence[str] = (), *, device: str = "cpu", threads: int | None = None, progress=print
):
    """A :class:`~tts_service.piper.engine.PiperEngine` with every requested voice loaded (the
    bundled one by default), with progress lines.

    Raises ``tts_service.piper.voices.VoiceError`` with a message that says what to fix.
    """
    from .engine import PiperEngine
    from .voices import default_voice_path

    engine = PiperEngine(device=device, threads=threads)
    for path in voice_paths or [str(default_voice_path())]:
        t0 = time.perf_counter()
        name = engine.load_voice(path, progress=progress)
        progress(f"voice {name} ready in {time.perf_counter() - t0:.1f} s")
    return engine


def build(args: argparse.Namespace, *, metrics=None):
    """``streamvox serve --engine piper``: the voices of ``--voice-path`` with their scheduler."""
    from .scheduler import PiperSchedulerOptions
    from .voices import VoiceError

    try:
        engine = load_piper_engine(args.voice_path, device=args.device, threads=args.threads)
    except VoiceError as exc:
        raise EngineSetupError(str(exc)) from None
    options = PiperSchedulerOptions(
        lead_s=args.lead_ms / 1000,
        max_streams=args.max_streams,
        capacity=args.capacity,
        **({} if args.first_cut_ms is None else {"first_cut_s": args.first_cut_ms / 1000}),
    )
    return synthesizer(engine, options=options, metrics=metrics)


def synthesizer(engine=None, *, options=None, metrics=None):
    """A loaded Piper engine (``None``: the bundled voice, quietly) wrapped for the server;
    ``options`` are :class:`~tts_service.piper.scheduler.PiperSchedulerOptions`."""
    from .runtime import PiperSynthesizer

    if engine is None:
        engine = load_piper_engine(progress=lambda *_: None)
    return PiperSynthesizer(engine, options=options, metrics=metrics)
