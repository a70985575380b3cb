"""Cartesia's streaming WebSocket, ``/tts/websocket``, over the protocol connection.

What its clients send (read from Pipecat 1.14's ``CartesiaTTSService`` and
``livekit-plugins-cartesia`` 1.8.9): a *generation request* per piece of text,
``{"context_id", "transcript", "continue", "voice": {"mode": "id", "id"}, "output_format":
{"container": "raw", "encoding", "sample_rate"}, "add_timestamps", "model_id", "language", ...}``;
``continue: false`` (Pipecat: with an empty transcript) ends the context's input; an
interruption sends ``{"context_id", "cancel": true}`` and waits for nothing (Pipecat), or closes
the socket (LiveKit). The key comes in ``X-API-Key``.

What they read: ``chunk`` (base64 audio in ``data``), ``timestamps``
(``word_timestamps: {words, start, end}``, seconds from the context's start), ``done``, and
``error``; every message carries ``context_id`` (Pipecat indexes it unconditionally). The first
request of a context fixes its voice and format; the rest only add text, as Cartesia requires.
A cancel is the protocol's cancel: no chunk of that context is sent after it.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from .. import protocol as P
from ..protocol import ErrorCode
from ..session import Acked, Audio, Done, Event, Failed, SessionContext, Words
from .bridge import Api, Host, foreign_speed
from .sockets import RATES, SocketAdapter, b64, pcm_s16_to_f32, serve_socket
from .voices import UnknownVoice, VoiceMap

log = logging.getLogger(__name__)

WS_PATH = "/tts/websocket"
ENCODINGS = {"pcm_s16le": P.PCM_S16LE, "pcm_f32le": P.PCM_S16LE, "pcm_mulaw": P.MULAW}
_STATUS = {
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.UNKNOWN_VOICE: 400,
    ErrorCode.TEXT_TOO_LONG: 400,
    ErrorCode.TOO_MANY_CONTEXTS: 429,
    ErrorCode.OVERLOADED: 429,
    ErrorCode.DRAINING: 503,
    ErrorCode.SHUTTING_DOWN: 503,
}


# Cartesia's older voice control, ``voice.__experimental_controls.speed``: a name, or a number from
# -1 (slowest) through 0 (normal) to 1 (fastest). Cartesia publishes no rate for them; streamvox
# reads x as the multiplier 2**x, so the ends are half and twice the voice's rate.
_NAMED_SPEEDS = {"slowest": -1.0, "slow": -0.5, "normal": 0.0, "fast": 0.5, "fastest": 1.0}


def _speed(msg: dict[str, Any]) -> Any:
    """The multiplier a generation request asks for: ``generation_config.speed`` (sonic-3, a
    multiplier as sent), else the experimental control mapped as above; ``None`` for neither."""
    config = msg.get("generation_config")
    if isinstance(config, dict) and config.get("speed") is not None:
        return config["speed"]
    voice = msg.get("voice")
    controls = voice.get("__experimental_controls") if isinstance(voice, dict) else None
    value = controls.get("speed") if isinstance(controls, dict) else None
    value = _NAMED_SPEEDS.get(value, value) if isinstance(value, str) else value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and -1.0 <= value <= 1.0:
        return 2.0**value
    if value is not None:
        raise ValueError(
            f"voice.__experimental_controls.speed {value!r} is not one of {sorted(_NAMED_SPEEDS)} or a number in -1..1"
        )
    return None


def http_error(status: int, message: str) -> web.Response:
    """A refused handshake (wrong key, draining), as Cartesia's HTTP errors look."""
    return web.json_response({"error": message, "status_code": status}, status=status)


@dataclass(slots=True)
class _Options:
    """What a context's first request fixed."""

    f32: bool
    timestamps: bool


class CartesiaSocket(SocketAdapter):
    """One Cartesia-speaking client connection."""

    def __init__(self, host: Host, ws: web.WebSocketResponse, request: web.Request, voices: VoiceMap) -> None:
        super().__init__(host, ws, request)
        self.voices = voices
        self.options: dict[SessionContext, _Options] = {}

    async def bad_message(self, message: str, context_id: str | None = None, status: int = 400) -> None:
        await self.send(
            {"type": "error", "context_id": context_id or "", "status_code": status, "done": True, "error": message}
        )

    async def on_message(self, msg: dict[str, Any]) -> None:
        context_id = msg.get("context_id")
        if context_id is not None and not isinstance(context_id, str):
            await self.bad_message("'context_id' must be a string")
            return
        if msg.get("cancel") is True:
            ctx = self.contexts.get(context_id or "")
            if ctx is not None:
                self.bridge.cancel(ctx)  # gated now; the connection purges and acks
            return
        transcript = msg.get("transcript", "")
        if not isinstance(transcript, str):
            await self.bad_message("'transcript' must be a string", context_id)
            return
        context_id = context_id or uuid.uuid4().hex
        ctx = self.contexts.get(context_id)
        if ctx is None:
            ctx = await self._open(context_id, msg, transcript)
        elif ctx.ended:
            if transcript.strip():
                await self.bad_message(
                    f"context {context_id!r} has ended (continue: false); use a new context_id", context_id
                )
            return
        elif transcript:
            self.bridge.text(ctx, transcript)
        if ctx is not None and not msg.get("continue", False):
            self.bridge.end(ctx)

    async def _open(self, context_id: str, msg: dict[str, Any], transcript: str) -> SessionContext | None:
        fmt = msg.get("output_format") or {}
        if not isinstance(fmt, dict):
            await self.bad_message("'output_format' must be an object", context_id)
            return None
        container, encoding = fmt.get("container", "raw"), fmt.get("encoding", "pcm_s16le")
        rate = fmt.get("sample_rate", 24000)
        if container != "raw" or encoding not in ENCODINGS:
            await self.bad_message(
                f"output_format {container}/{encoding} is not served; use container 'raw' with one of "
                f"{sorted(ENCODINGS)}",
                context_id,
            )
            return None
        if not isinstance(rate, int) or rate not in RATES:
            await self.bad_message(f"sample_rate {rate!r} is not served; use one of {sorted(RATES)}", context_id)
            return None
        voice = msg.get("voice") or {}
        given = voice.get("id") if isinstance(voice, dict) else None
        try:
            name = self.voices.resolve(given if isinstance(given, str) else None, self.host.synth.engine.voices)
        except UnknownVoice as exc:
            await self.bad_message(str(exc), context_id)
            return None
        try:
            speed = foreign_speed(self.host.synth.engine, _speed(msg), "generation_config.speed")
        except ValueError as exc:
            await self.bad_message(str(exc), context_id)
            return None
        ctx = self.open(
            context_id,
            voice=name,
            sample_rate=rate,
            encoding=ENCODINGS[encoding],
            speed=speed,
            text=transcript or None,
        )
        if ctx is None:
            await self.bad_message(f"context {context_id!r} is still being cancelled; use a new context_id", context_id)
            return None
        self.options[ctx] = _Options(f32=encoding == "pcm_f32le", timestamps=msg.get("add_timestamps") is True)
        return ctx

    async def on_event(self, event: Event) -> None:
        if isinstance(event, Audio):
            if event.stale or event.ctx is None:
                return
            data = pcm_s16_to_f32(event.payload) if self.options[event.ctx].f32 else event.payload
            await self.send(
                {
                    "type": "chunk",
                    "context_id": event.ctx.context_id,
                    "status_code": 206,
                    "done": False,
                    "data": b64(data),
                }
            )
        elif isinstance(event, Words):
            if not event.ctx.gated and self.options[event.ctx].timestamps:
                words = event.words
                await self.send(
                    {
                        "type": "timestamps",
                        "context_id": event.ctx.context_id,
                        "status_code": 206,
                        "done": False,
                        "word_timestamps": {
                            "words": [w.word for w in words],
                            "start": [w.start for w in words],
                            "end": [w.end for w in words],
                        },
                    }
                )
        elif isinstance(event, Done):
            self._forget(event.ctx)
            await self.send({"type": "done", "context_id": event.ctx.context_id, "status_code": 200, "done": True})
        elif isinstance(event, Acked):
            if event.ctx is not None:
                self._forget(event.ctx)  # Cartesia acknowledges no cancel: nothing to send
        elif isinstance(event, Failed):
            if event.ctx is not None and event.ended:
                self._forget(event.ctx)
            context_id = event.ctx.context_id if event.ctx is not None else None
            await self.bad_message(f"{event.code}: {event.message}", context_id, _STATUS.get(event.code, 500))

    def _forget(self, ctx: SessionContext) -> None:
        self.finished(ctx)
        self.options.pop(ctx, None)


class Cartesia(Api):
    def routes(self) -> list[web.AbstractRouteDef]:
        return [web.get(WS_PATH, self.handler)]

    async def handler(self, request: web.Request) -> web.StreamResponse:
        return await serve_socket(
            self.host,
            request,
            lambda ws: CartesiaSocket(self.host, ws, request, self.voices),
            refuse_draining=lambda: http_error(503, "the server is draining for shutdown; connect to another server"),
        )
