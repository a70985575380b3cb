"""Voices as the compatible APIs' clients name them: OpenAI's names, Cartesia and ElevenLabs ids.

A team that switches keeps its config: Pipecat's OpenAI service lets only OpenAI's own names
through (``alloy``, ...), and a Cartesia or ElevenLabs config holds that provider's voice ids.
So every name a client sends is looked up here: one of our voices by its own name; an entry of
the server's voice map (``--voice-map``, env ``STREAMVOX_VOICE_MAP``); OpenAI's names, which mean
the default voice unless the map says otherwise; anything else falls back to the default voice
with one warning per unknown id, or - strict mode (``--strict-voices``) - is refused with that
API's own error.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

# The names OpenAI's speech API accepts (and Pipecat's OpenAITTSService checks before sending).
OPENAI_VOICES = frozenset(
    {"alloy", "ash", "ballad", "cedar", "coral", "echo", "fable", "marin", "nova", "onyx", "sage", "shimmer", "verse"}
)
MAX_WARNED = 1024  # unknown ids remembered for "one warning each" (bounded: ids come from clients)


class VoiceMapError(ValueError):
    """A voice map that cannot be used (bad syntax, or a target voice the server does not have)."""


class UnknownVoice(LookupError):
    """Strict mode: the client named a voice the server has no mapping for."""

    def __init__(self, voice: str, known: Iterable[str]) -> None:
        self.voice = voice
        super().__init__(
            f"voice {voice!r} is not mapped to a voice of this server; known: {sorted(known)} "
            "(map it with --voice-map, or run without --strict-voices)"
        )


@dataclass
class VoiceMap:
    """Client voice id -> our voice name. ``resolve`` returns ``None`` for the default voice."""

    mapping: dict[str, str] = field(default_factory=dict)
    strict: bool = False
    _warned: set[str] = field(default_factory=set, repr=False)

    def check(self, voices: Iterable[str]) -> None:
        """Refuse (at start-up) a map that points at a voice the server does not serve."""
        have = set(voices)
        bad = {k: v for k, v in self.mapping.items() if v not in have}
        if bad:
            raise VoiceMapError(f"the voice map points at voices this server does not have: {bad}; have {sorted(have)}")

    def known(self, voices: Iterable[str]) -> set[str]:
        return set(voices) | set(self.mapping) | OPENAI_VOICES

    def resolve(self, given: str | None, voices: Iterable[str]) -> str | None:
        """Our voice for ``given`` (``None``: the default). Raises :class:`UnknownVoice` in strict mode."""
        if not given:
            return None
        voices = set(voices)
        if given in voices:
            return given
        if given in self.mapping:
            return self.mapping[given]
        if given.lower() in OPENAI_VOICES:
            return self.mapping.get(given.lower())
        if self.strict:
            raise UnknownVoice(given, self.known(voices))
        if given not in self._warned and len(self._warned) < MAX_WARNED:
            self._warned.add(given)
            log.warning("unknown voice id %r: speaking with the default voice (map it with --voice-map)", given)
        return None


def parse_voice_map(spec: str | None, *, strict: bool = False) -> VoiceMap:
    """``--voice-map``: a JSON file (``{"client-id": "our-voice", ...}``), or inline ``id=voice,id2=voice``."""
    if not spec or not spec.strip():
        return VoiceMap(strict=strict)
    spec = spec.strip()
    if spec.startswith("{") or spec.endswith(".json"):
        try:
            raw = spec if spec.startswith("{") else Path(spec).read_text(encoding="utf-8")
            data = json.loads(raw)
        except OSError as exc:
            raise VoiceMapError(f"cannot read the voice map {spec}: {exc.strerror}") from None
        except ValueError as exc:
            raise VoiceMapError(f"the voice map is not valid JSON: {exc}") from None
        if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
            raise VoiceMapError('the voice map must be a JSON object of strings: {"client-id": "our-voice"}')
        return VoiceMap(dict(data), strict=strict)
    mapping: dict[str, str] = {}
    for item in spec.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise VoiceMapError(f"bad voice map entry {item!r}: write client-id=our-voice, comma-separated")
        mapping[key.strip()] = value.strip()
    return VoiceMap(mapping, strict=strict)
