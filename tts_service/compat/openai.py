"""OpenAI's speech API: ``POST /v1/audio/speech`` and ``GET /v1/models``, over the protocol connection.

What OpenAI clients send (the ``openai`` SDK, Pipecat's ``OpenAITTSService``, LiveKit's
``openai.TTS``, Open WebUI): a JSON body ``{model, input, voice, response_format, speed,
instructions, stream_format}`` with ``Authorization: Bearer KEY``; they read the body as it
streams. ``pcm`` is what OpenAI sends: 24 kHz 16-bit little-endian mono without a header, and
``wav`` is that behind a streaming header; both come from the protocol connection at 24 kHz.
``mp3``/``opus``/``aac``/``flac`` are encoded from the same PCM (:mod:`.encode`). With
``stream_format: "sse"`` the audio goes as ``speech.audio.delta`` events, then
``speech.audio.done``.

One request is one context on an in-process protocol connection (:mod:`.bridge`), unpaced like
``POST /v1/tts``: a client that hangs up cancels it. Errors have OpenAI's shape,
``{"error": {"message", "type", "param", "code"}}``, with OpenAI's status codes.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from typing import Any

from aiohttp import web

from .. import protocol as P
from ..aio import get_within
from ..audio import wav_header
from ..core.engine import UnsupportedSpeed
from ..protocol import ErrorCode, ProtocolError
from ..session import Audio, Done, Failed, Started
from ..ws import OUTBOX_HIGH_WATER
from . import encode
from .bridge import Api, Bridge, foreign_speed
from .voices import UnknownVoice

log = logging.getLogger(__name__)

SPEECH_PATH = "/v1/audio/speech"
MODELS_PATH = "/v1/models"
OPENAI_RATE = 24000  # OpenAI's pcm (and every other format) is 24 kHz
MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "streamvox")
RAW_FORMATS = {"pcm": "audio/pcm", "wav": "audio/wav"}
SPEED_RANGE = (0.25, 4.0)
CHUNK_TIMEOUT_S = 60.0  # the next audio of a request taking longer than this ends it (as /v1/tts)
_STATUS = {  # our error code -> OpenAI's status for it
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.TEXT_TOO_LONG: 400,
    ErrorCode.UNKNOWN_VOICE: 400,
    ErrorCode.OVERLOADED: 503,
    ErrorCode.DRAINING: 503,
    ErrorCode.SHUTTING_DOWN: 503,
}


def error(status: int, message: str, *, param: str | None = None, code: str | None = None, **headers: str):
    """OpenAI's error body; ``type`` as OpenAI names it for the status."""
    kind = {401: "invalid_request_error", 404: "invalid_request_error"}.get(status)
    kind = kind or ("invalid_request_error" if status < 500 else "server_error")
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return web.json_response(body, status=status, headers=headers or None)


def unauthorized() -> web.Response:
    return error(
        401,
        "Incorrect API key provided: send 'Authorization: Bearer KEY' with this server's key",
        code="invalid_api_key",
    )


class _BadRequest(Exception):
    def __init__(self, message: str, param: str | None, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param, self.code = param, code


def _field(body: dict[str, Any], name: str, kinds: type | tuple[type, ...], default: Any = None) -> Any:
    value = body.get(name, default)
    if value is not None and (not isinstance(value, kinds) or isinstance(value, bool)):
        raise _BadRequest(f"'{name}' has the wrong type", name, "invalid_type")
    return value


class SpeechRequest:
    """A validated ``/v1/audio/speech`` body (raises :class:`_BadRequest` with the offending param)."""

    def __init__(self, body: Any, *, max_chars: int) -> None:
        if not isinstance(body, dict):
            raise _BadRequest('the body must be a JSON object like {"model": "tts-1", ...}', None)
        self.model = _field(body, "model", str)
        if not self.model:
            raise _BadRequest("you must provide a model parameter", "model", "missing_required_parameter")
        self.input = _field(body, "input", str)
        if not self.input or not self.input.strip():
            raise _BadRequest("'input' must be a non-empty string", "input", "missing_required_parameter")
        if len(self.input) > max_chars:
            raise _BadRequest(f"'input' is {len(self.input)} characters; the maximum is {max_chars}", "input")
        try:
            P.check_text(self.input)
        except ProtocolError as exc:
            raise _BadRequest(exc.message, "input") from None
        voice = body.get("voice")
        if isinstance(voice, dict):  # OpenAI's custom voices: {"id": "voice_..."}
            voice = voice.get("id")
        if not isinstance(voice, str) or not voice:
            raise _BadRequest("'voice' must be a voice name (alloy, ...) or {\"id\": ...}", "voice")
        self.voice = voice
        self.response_format = _field(body, "response_format", str, "mp3")
        if self.response_format not in RAW_FORMATS and self.response_format not in encode.FORMATS:
            raise _BadRequest(
                f"response_format {self.response_format!r} is not one of {sorted([*RAW_FORMATS, *encode.FORMATS])}",
                "response_format",
            )
        self.stream_format = _field(body, "stream_format", str, "audio")
        if self.stream_format not in ("audio", "sse"):
            raise _BadRequest("stream_format must be 'audio' or 'sse'", "stream_format")
        speed = _field(body, "speed", (int, float), 1.0)
        if not SPEED_RANGE[0] <= speed <= SPEED_RANGE[1]:
            raise _BadRequest(f"speed {speed} is outside {SPEED_RANGE[0]}..{SPEED_RANGE[1]}", "speed")
        self.speed = float(speed)
        _field(body, "instructions", str)  # accepted, and not used: a Piper voice takes no instructions


class _Body:
    """What goes on the wire for one response: raw PCM, WAV, an encoded format, or SSE events of it."""

    def __init__(self, req: SpeechRequest) -> None:
        self.sse = req.stream_format == "sse"
        fmt = req.response_format
        self._enc = encode.Encoded(fmt, OPENAI_RATE) if fmt in encode.FORMATS else None
        self._head = wav_header(OPENAI_RATE) if fmt == "wav" else b""
        self.content_type = (
            "text/event-stream" if self.sse else (self._enc.content_type if self._enc else RAW_FORMATS[fmt])
        )

    def _wrap(self, data: bytes) -> bytes:
        if not self.sse or not data:
            return data
        event = {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}
        return f"data: {json.dumps(event)}\n\n".encode()

    def audio(self, pcm: bytes) -> bytes:
        data = self._enc.encode(pcm) if self._enc else pcm
        if self._head:
            data, self._head = self._head + data, b""
        return self._wrap(data)

    def last(self) -> bytes:
        data = self._wrap((self._enc.finish() if self._enc else b"") + self._head)
        if self.sse:
            done = {"type": "speech.audio.done", "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}}
            data += f"data: {json.dumps(done)}\n\n".encode()
        return data

    def close(self) -> None:
        if self._enc is not None:
            self._enc.close()


class OpenAISpeech(Api):
    """The two OpenAI routes on one server."""

    def routes(self) -> list[web.AbstractRouteDef]:
        return [web.post(SPEECH_PATH, self.speech), web.get(MODELS_PATH, self.models)]

    async def models(self, _request: web.Request) -> web.Response:
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "streamvox"} for m in MODELS]
        return web.json_response({"object": "list", "data": data})

    async def speech(self, request: web.Request) -> web.StreamResponse:
        try:
            body = json.loads(await request.text())
        except (ValueError, UnicodeDecodeError):
            return error(400, "We could not parse the JSON body of your request.", code="invalid_json")
        try:
            req = SpeechRequest(body, max_chars=self.host.config.limits.max_context_chars)
            if req.response_format in encode.FORMATS and (why := encode.available()):
                raise _BadRequest(f"response_format {req.response_format!r}: {why}", "response_format", "unsupported")
            voice = self.voices.resolve(req.voice, self.host.synth.engine.voices)
            speed = foreign_speed(self.host.synth.engine, req.speed, "speed")
        except UnsupportedSpeed as exc:
            return error(400, str(exc), param="speed", code="unsupported")
        except _BadRequest as exc:
            return error(400, str(exc), param=exc.param, code=exc.code)
        except UnknownVoice as exc:
            return error(400, str(exc), param="voice", code="invalid_value")
        if self.host.draining:
            return error(
                503,
                "the server is draining for shutdown; retry on another server",
                code="draining",
                **{"Retry-After": "1"},
            )
        return await self._stream(request, req, voice, speed)

    async def _stream(
        self, request: web.Request, req: SpeechRequest, voice: str | None, speed: float | None
    ) -> web.StreamResponse:
        events: asyncio.Queue = asyncio.Queue(maxsize=OUTBOX_HIGH_WATER)  # bounded: a slow reader holds the writer
        bridge = Bridge(self.host, events.put, transport=request.transport)
        out: _Body | None = None
        async with bridge.running():
            ctx = bridge.open(
                "speech",
                voice=voice,
                sample_rate=OPENAI_RATE,
                encoding=P.PCM_S16LE,
                pace=False,
                speed=speed,
                text=req.input,
            )
            bridge.end(ctx)
            first = await get_within(events, CHUNK_TIMEOUT_S)
            if isinstance(first, Failed):
                status = _STATUS.get(first.code, 500)
                retry = first.retry_after_ms
                headers = {"Retry-After": str(max(1, round(retry / 1000)))} if retry else {}
                return error(status, first.message, code=first.code, **headers)
            if not isinstance(first, Started):
                return error(500, f"unexpected first reply {type(first).__name__}", code="internal")
            out = _Body(req)
            resp = web.StreamResponse(headers={"Content-Type": out.content_type, "Cache-Control": "no-store"})
            resp.enable_chunked_encoding()
            try:
                await resp.prepare(request)
                while True:  # TimeoutError below: no audio for a minute; the request ends truncated
                    ev = await get_within(events, CHUNK_TIMEOUT_S)
                    if isinstance(ev, Audio) and not ev.stale:
                        await resp.write(out.audio(ev.payload))
                    elif isinstance(ev, Done):
                        await resp.write(out.last())
                        break
                    elif isinstance(ev, Failed):
                        # Headers are gone: a truncated body is the only signal left (as /v1/tts).
                        log.warning("OpenAI speech stream failed: %s %s", ev.code, ev.message)
                        if request.transport is not None:
                            request.transport.abort()
                        return resp
                await resp.write_eof()
            except (ConnectionError, TimeoutError):  # the client hung up (or we gave up): leaving cancels
                if request.transport is not None:
                    request.transport.abort()
            finally:
                out.close()
        return resp
