"""The toy engine's registry entry: what ``streamvox serve --engine toy`` needs of it."""

from __future__ import annotations

import argparse
import os

DESCRIPTION = "a sine per text (tests only)"


def add_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("toy engine (--engine toy)")
    g.add_argument("--toy-pitch", type=float, default=float(os.environ.get("STREAMVOX_TOY_PITCH", 440.0)))


def build(args: argparse.Namespace, *, metrics=None):
    from .scheduler import ToyOptions

    options = ToyOptions(lead_s=args.lead_ms / 1000, max_streams=args.max_streams)
    return synthesizer(_engine(args.toy_pitch), options=options, metrics=metrics)


def synthesizer(engine=None, *, options=None, metrics=None):
    from .runtime import ToySynthesizer

    return ToySynthesizer(engine if engine is not None else _engine(440.0), options=options, metrics=metrics)


def _engine(pitch: float):
    from .engine import ToyEngine

    return ToyEngine(pitch_hz=pitch)
