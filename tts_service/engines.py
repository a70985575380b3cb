"""Engines by name: what ``streamvox serve --engine NAME`` and the in-process server can run.

The server, the CLI and the local launcher know no engine; they ask this registry. An entry is a
*module path*, imported only when its options are added to a parser or it is built, so a Piper
server never imports torch, and a third engine is added without editing this package.

An engine's entry module (``tts_service/piper/serve.py`` and ``tts_service/orpheus/serve.py``
are the built-in ones) defines:

* ``DESCRIPTION`` - one line for ``--help``;
* ``add_args(parser)`` - its command-line options, their defaults read from the environment.
  Every ``serve`` parser calls it, so the module must import cheaply (no model libraries) and
  its option names must not collide with another engine's;
* ``build(args, *, metrics=None)`` - the :class:`~tts_service.core.runtime.SynthesizerBase` the
  server runs, from the parsed options (the shared ones too: ``device``, ``threads``,
  ``lead_ms``, ``max_streams``). A problem the user can fix raises
  :class:`~tts_service.core.engine.EngineSetupError`;
* ``synthesizer(engine=None, *, options=None, metrics=None)`` - an engine the caller already
  loaded (``None``: the entry's default one) wrapped for the server, with that engine's own
  scheduler options (in-process servers, tests).

A package outside this one registers its engine with :func:`register`, or with an entry point
in the ``streamvox.engines`` group whose value is the module path (``toy = mypkg.toy_serve``):
entry points let ``streamvox serve --engine toy`` find it in a fresh process.
"""

from __future__ import annotations

import argparse
import importlib
import logging
from importlib.metadata import entry_points
from types import ModuleType

from .core.engine import EngineSetupError
from .core.runtime import SynthesizerBase

log = logging.getLogger(__name__)
ENTRY_POINT_GROUP = "streamvox.engines"
DEFAULT_ENGINE = "piper"
# name -> module path; strings, not imports: this module is the one place that names engine
# packages, and tests/test_layout.py forbids the transports and launchers to import them.
_BUILT_IN = {
    "piper": "tts_service.piper.serve",
    "orpheus": "tts_service.orpheus.serve",
}
_registry: dict[str, str] = dict(_BUILT_IN)
_entry_points_read = False


class UnknownEngine(EngineSetupError):
    """``--engine NAME`` that nothing registered; the message lists the known names."""


def register(name: str, module: str, *, replace: bool = False) -> None:
    """Make ``module`` (a dotted path, imported when first needed) the engine called ``name``."""
    _read_entry_points()
    if not replace and _registry.get(name, module) != module:
        raise ValueError(f"engine {name!r} is already {_registry[name]}; pass replace=True to change it")
    _registry[name] = module


def unregister(name: str) -> None:
    """Forget ``name`` (tests that registered a toy engine clean up with this)."""
    _registry.pop(name, None)


def names() -> list[str]:
    """Every registered engine name, the built-in ones first."""
    _read_entry_points()
    return [*_BUILT_IN, *sorted(set(_registry) - set(_BUILT_IN))]


def entry(name: str) -> ModuleType:
    """The entry module of engine ``name``; :class:`UnknownEngine` when there is none and
    :class:`EngineSetupError` when it cannot be imported (its extras are missing)."""
    _read_entry_points()
    path = _registry.get(name)
    if path is None:
        raise UnknownEngine(f"unknown engine {name!r}; known engines: {', '.join(names())}")
    try:
        return importlib.import_module(path)
    except ImportError as exc:
        raise EngineSetupError(f"engine {name!r} ({path}) cannot be imported: {exc}") from None


def add_args(parser: argparse.ArgumentParser) -> None:
    """Every registered engine's options on ``parser`` (one argument group each). An engine whose
    module cannot be imported adds none, and one whose option clashes with another's stops at
    that option: the others still work, and ``build`` says what is wrong."""
    for name in names():
        try:
            module = entry(name)
        except EngineSetupError as exc:
            log.debug("engine %s offers no options: %s", name, exc)
            continue
        try:
            module.add_args(parser)
        except argparse.ArgumentError as exc:  # a third engine's option clashes: the rest still works
            log.warning("engine %s: its options are not all added (%s); rename the clashing one", name, exc)


def describe() -> str:
    """``piper: ...; orpheus: ...`` for ``--engine``'s help (engines that import, with their line)."""
    parts = []
    for name in names():
        try:
            parts.append(f"{name}: {entry(name).DESCRIPTION}")
        except (EngineSetupError, AttributeError):
            parts.append(name)
    return "; ".join(parts)


def build(name: str, args: argparse.Namespace, *, metrics=None) -> SynthesizerBase:
    """Engine ``name`` built from parsed options, ready for ``tts_service.server.Server``."""
    return entry(name).build(args, metrics=metrics)


def synthesizer(name: str, engine=None, *, options=None, metrics=None) -> SynthesizerBase:
    """A loaded ``engine`` of kind ``name`` (``None``: its default) wrapped for the server."""
    return entry(name).synthesizer(engine, options=options, metrics=metrics)


def _read_entry_points() -> None:
    """Add the ``streamvox.engines`` entry points once (by module path: nothing is imported)."""
    global _entry_points_read
    if _entry_points_read:
        return
    _entry_points_read = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _registry and _registry[ep.name] != ep.value:
            log.warning("engine entry point %s=%s ignored: %s is %s", ep.name, ep.value, ep.name, _registry[ep.name])
            continue
        _registry[ep.name] = ep.value


__all__ = [
    "DEFAULT_ENGINE",
    "ENTRY_POINT_GROUP",
    "EngineSetupError",
    "UnknownEngine",
    "add_args",
    "build",
    "describe",
    "entry",
    "names",
    "register",
    "synthesizer",
    "unregister",
]
