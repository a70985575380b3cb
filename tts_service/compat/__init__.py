"""Drop-in endpoints for the APIs clients already call: OpenAI speech, Cartesia and ElevenLabs.

Each is a thin adapter over the server's one protocol connection (:mod:`.bridge`), so pacing,
admission, the drain and the cancel guarantee are those of ``/v1/stream``. :func:`register`
adds their routes to the server's app; the server's key check asks :func:`api_key_of` for the
key where each API's clients send it, and :func:`unauthorized` for that API's refusal.
"""

from __future__ import annotations

from aiohttp import web

from . import cartesia, elevenlabs, openai
from .bridge import Host
from .voices import VoiceMap

__all__ = ["GUARDED_PREFIXES", "VoiceMap", "api_key_of", "register", "unauthorized"]

GUARDED_PREFIXES = ("/v1/", "/tts/")  # paths that need the server's key (when it has one)


def register(host: Host, app: web.Application, voices: VoiceMap) -> None:
    """Add the compatible routes to ``app``; ``voices`` maps the clients' voice names to ours."""
    voices.check(host.synth.engine.voices)
    app.add_routes(openai.OpenAISpeech(host, voices).routes())
    app.add_routes(cartesia.Cartesia(host, voices).routes())
    app.add_routes(elevenlabs.ElevenLabs(host, voices).routes())


def api_key_of(request: web.Request) -> str | None:
    """The key as the compatible APIs' clients send it, besides ``Authorization: Bearer``:
    Cartesia's ``X-API-Key`` header (or ``api_key`` query), ElevenLabs' ``xi-api-key``."""
    for header in ("X-API-Key", "xi-api-key"):
        if header in request.headers:
            return request.headers[header]
    return request.query.get("api_key")


def unauthorized(request: web.Request) -> web.Response | None:
    """The refusal in the shape of the API the path belongs to; ``None`` for our own paths."""
    if request.path in (openai.SPEECH_PATH, openai.MODELS_PATH):
        return openai.unauthorized()
    if request.path == cartesia.WS_PATH:
        return cartesia.http_error(401, "missing or wrong API key: send it in the X-API-Key header")
    if request.path.startswith("/v1/text-to-speech/"):
        return elevenlabs.http_error(401, "invalid_api_key", "missing or wrong API key: send it in xi-api-key")
    return None
