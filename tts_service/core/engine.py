"""What the runtime and the server need of an engine: the :class:`Engine` protocol.

The engine-independent parts (:class:`~tts_service.core.runtime.SynthesizerBase`, the server,
the WebSocket connection) read only these members. Everything else an engine does (Piper's
``prepare`` / ``decode``, Orpheus' ``tick``) is called by that engine's own ``Synthesizer``
subclass, so it is free to have any shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class VoiceInfo:
    """One voice as ``GET /v1/voices`` shows it."""

    name: str
    sample_rate: int
    model: str  # where its weights came from: a file or folder, or "random"


class EngineSetupError(Exception):
    """An engine that cannot be built for a reason the user can fix (a path, a missing package,
    an unknown voice); the message says what to do, and the CLI prints it as one line."""


class UnsupportedSpeed(ValueError):
    """A stream asked for a speaking rate its engine cannot render (the message says why)."""


def speed_range(engine: object) -> tuple[float, float] | None:
    """The rates ``engine`` renders, or ``None`` when it speaks at its voices' own rate only."""
    return getattr(engine, "speed_range", None)


def nearest_speed(engine: object, speed: float) -> float:
    """``speed`` clamped into what ``engine`` renders, for the compatible APIs: their clients may
    send any rate their API allows, and a nearby rate beats a refusal. Raises
    :class:`UnsupportedSpeed` for a rate other than 1.0 on an engine without a ``speed_range``."""
    if speed == 1.0:
        return speed
    rates = speed_range(engine)
    if rates is None:
        raise UnsupportedSpeed(f"the {type(engine).__name__} speaks at its voices' own rate only; leave 'speed' out")
    return min(max(speed, rates[0]), rates[1])


@runtime_checkable
class Engine(Protocol):
    """The verbs the runtime and the server call on every engine.

    ``voices`` maps each voice's name to the engine's own voice object (the server only reads the
    names); ``resolve`` turns a requested voice (``None``: the default) into a name in ``voices``
    or raises ``KeyError``; ``describe_voices`` is what ``/v1/voices`` lists. An engine may
    subclass this explicitly to inherit ``resolve`` (both of ours do).

    An engine that can change a stream's speaking rate says so with a ``speed_range`` attribute
    ``(lowest, highest)``; the runtime refuses a rate other than 1.0 on an engine without one
    (:class:`UnsupportedSpeed`), so a requested rate is never silently ignored.
    """

    voices: Mapping[str, Any]
    default_voice: str | None

    @property
    def sample_rate(self) -> int:
        """Native samples per second of the audio the engine makes (every voice the same)."""
        raise NotImplementedError

    def resolve(self, voice: str | None) -> str:
        name = voice or self.default_voice
        if name not in self.voices:
            raise KeyError(name)
        return name

    def describe_voices(self) -> list[VoiceInfo]:
        raise NotImplementedError
