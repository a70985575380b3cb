"""ElevenLabs' multi-context WebSocket, ``/v1/text-to-speech/{voice_id}/multi-stream-input``.

What its clients send (read from Pipecat 1.14's ``ElevenLabsTTSService`` and
``livekit-plugins-elevenlabs`` 1.8.9): the voice in the path, ``output_format`` (``pcm_16000``,
``ulaw_8000``, ``mp3_22050_32``, ...) and ``model_id`` in the query, the key in ``xi-api-key``;
then per context ``{"text": " ", "context_id", "voice_settings"}`` to open it, ``{"text",
"context_id"}`` pieces, ``{"text": ""}`` keep-alives, ``{"context_id", "flush": true}`` at the
end of the input (LiveKit: with ``"text": ""``; in auto mode also a flush with each sentence),
``{"context_id", "close_context": true}`` and finally ``{"close_socket": true}``.

``close_context`` means two things to these clients: right after the input's closing flush it
means "that was all" (both wait for the rest of the audio and ``isFinal``); anywhere else - in
the middle of a reply, or a second time - it is an interruption. So it *ends* a context whose
last message was a flush, and *cancels* it otherwise: then nothing of that context is sent
after it, and ``isFinal`` confirms. (In LiveKit's auto mode every sentence comes with a flush,
so an interruption there ends the context instead: LiveKit drops that audio itself, and the
server spends the compute of the rest of the reply.)

What they read: ``{"audio": base64, "alignment": {"chars", "charStartTimesMs",
"charDurationsMs"}, "contextId"}`` and ``{"isFinal": true, "contextId"}``. Pipecat restarts the
alignment clock with every message and advances it by the message's span (last start plus
duration), so each message's times here count from the end of the previous message's last
character: Pipecat then reconstructs our word times exactly (in whole milliseconds).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from .. import protocol as P
from ..session import Acked, Audio, Done, Event, Failed, SessionContext, Word, Words
from . import encode
from .bridge import Api, Host, foreign_speed
from .sockets import RATES, SocketAdapter, b64, serve_socket
from .voices import UnknownVoice

log = logging.getLogger(__name__)

PATH = "/v1/text-to-speech/{voice_id}/multi-stream-input"
DEFAULT_CONTEXT = "default"  # ElevenLabs' context for messages without a context_id
_FORMAT = re.compile(r"^(pcm|ulaw|mp3)_(\d+)(?:_(\d+))?$")


def http_error(status: int, code: str, message: str) -> web.Response:
    """ElevenLabs' HTTP error body: ``{"detail": {"status", "message"}}``."""
    return web.json_response({"detail": {"status": code, "message": message}}, status=status)


@dataclass(frozen=True, slots=True)
class OutputFormat:
    """``output_format`` from the query: what the connection sends, and how it is wrapped."""

    kind: str  # pcm | ulaw | mp3
    sample_rate: int
    bit_rate: int | None = None  # mp3's kbps

    @classmethod
    def parse(cls, value: str) -> OutputFormat:
        match = _FORMAT.match(value)
        if match is None:
            raise ValueError(f"output_format {value!r} is not served; use pcm_<rate>, ulaw_8000 or mp3_<rate>_<kbps>")
        kind, rate, kbps = match[1], int(match[2]), match[3]
        if rate not in RATES or (kind == "ulaw" and rate != 8000):
            raise ValueError(f"output_format {value!r}: the sample rate is not served; rates {sorted(RATES)}")
        if kind == "mp3" and (why := encode.available()):
            raise ValueError(f"output_format {value!r}: {why}")
        return cls(kind, rate, int(kbps) * 1000 if kbps else None)

    @property
    def encoding(self) -> str:
        return P.MULAW if self.kind == "ulaw" else P.PCM_S16LE


@dataclass(slots=True)
class _State:
    """One context as the ElevenLabs side sees it."""

    encoder: encode.Encoded | None
    flushed: bool = False  # the last message was a flush: close_context ends, not cancels
    closing: bool = False  # close_context arrived once (and ended it)
    words: list[Word] = field(default_factory=list)  # timed words waiting for their audio message
    clock: float = 0.0  # seconds: where the previous message's alignment ended


def alignment(words: list[Word], clock: float) -> tuple[dict[str, list], float]:
    """Character alignment of ``words`` with times counted from ``clock``; returns the new clock.

    Each word's duration is spread over its characters, and a space follows it, so a client
    that splits on spaces completes every word within this message."""
    chars: list[str] = []
    starts: list[int] = []
    durations: list[int] = []
    for w in words:
        text = w.word.strip() or "?"
        start, end = max(0.0, w.start - clock) * 1000, max(0.0, w.end - clock) * 1000
        step = max(0.0, end - start) / len(text)
        for i, ch in enumerate(text):
            chars.append(ch)
            starts.append(round(start + i * step))
            durations.append(max(0, round(start + (i + 1) * step) - round(start + i * step)))
        chars.append(" ")
        starts.append(round(end))
        durations.append(0)
    if starts:
        clock += (starts[-1] + durations[-1]) / 1000
    return {"chars": chars, "charStartTimesMs": starts, "charDurationsMs": durations}, clock


class ElevenLabsSocket(SocketAdapter):
    """One ElevenLabs-speaking client connection (one voice, many contexts)."""

    def __init__(
        self, host: Host, ws: web.WebSocketResponse, request: web.Request, voice: str | None, fmt: OutputFormat
    ) -> None:
        super().__init__(host, ws, request)
        self.voice = voice
        self.fmt = fmt
        self.state: dict[SessionContext, _State] = {}

    async def bad_message(self, message: str, context_id: str | None = None) -> None:
        reply: dict[str, Any] = {"error": "invalid_request", "message": message}
        if context_id:
            reply["contextId"] = context_id
        await self.send(reply)

    async def on_message(self, msg: dict[str, Any]) -> None:
        if msg.get("close_socket") is True:
            await self.ws.close()  # the reader ends; leaving the bridge cancels what is live
            return
        context_id = msg.get("context_id", msg.get("contextId")) or DEFAULT_CONTEXT
        text = msg.get("text")
        if not isinstance(context_id, str) or (text is not None and not isinstance(text, str)):
            await self.bad_message("'context_id' and 'text' must be strings", None)
            return
        ctx = self.contexts.get(context_id)
        if msg.get("close_context") is True:
            if ctx is not None:
                self._close_context(ctx)
            return
        if ctx is None:
            if not text:
                return  # a keep-alive (or a flush) for no live context
            settings = msg.get("voice_settings")
            try:
                speed = foreign_speed(
                    self.host.synth.engine,
                    settings.get("speed") if isinstance(settings, dict) else None,
                    "voice_settings.speed",
                )
            except ValueError as exc:
                await self.bad_message(str(exc), context_id)
                return
            ctx = self.open(
                context_id,
                voice=self.voice,
                sample_rate=self.fmt.sample_rate,
                encoding=self.fmt.encoding,
                speed=speed,
                text=text,
            )
            if ctx is None:
                await self.bad_message(f"context {context_id!r} is still closing; use a new context_id", context_id)
                return
            encoder = encode.Encoded("mp3", self.fmt.sample_rate, self.fmt.bit_rate) if self.fmt.kind == "mp3" else None
            self.state[ctx] = _State(encoder)
        elif text:
            self.bridge.text(ctx, text)
        flush = msg.get("flush") is True
        if flush:
            self.bridge.flush(ctx)
        if flush or text:
            self.state[ctx].flushed = flush

    def _close_context(self, ctx: SessionContext) -> None:
        state = self.state[ctx]
        if state.flushed and not state.closing:
            state.closing = True
            self.bridge.end(ctx)  # "that was all": the rest of the audio, then isFinal
        else:
            self.bridge.cancel(ctx)  # an interruption: nothing more of it; the ack brings isFinal

    async def on_event(self, event: Event) -> None:
        if isinstance(event, Words):
            if not event.ctx.gated:
                self.state[event.ctx].words.extend(event.words)
        elif isinstance(event, Audio):
            if not event.stale and event.ctx is not None:
                state = self.state[event.ctx]
                data = state.encoder.encode(event.payload) if state.encoder else event.payload
                await self._audio(event.ctx, state, data)
        elif isinstance(event, Done):
            state = self.state[event.ctx]
            if state.encoder is not None or state.words:
                await self._audio(event.ctx, state, state.encoder.finish() if state.encoder else b"")
            await self._final(event.ctx)
        elif isinstance(event, Acked):
            if event.ctx is not None:
                await self._final(event.ctx)
        elif isinstance(event, Failed):
            context_id = event.ctx.context_id if event.ctx is not None else None
            await self.send({"error": event.code, "message": event.message, "contextId": context_id})
            if event.ctx is not None and event.ended:
                await self._final(event.ctx)

    async def _audio(self, ctx: SessionContext, state: _State, data: bytes) -> None:
        if not data and not state.words:
            return
        align = None
        if state.words:
            align, state.clock = alignment(state.words, state.clock)
            state.words.clear()
        await self.send(
            {
                "audio": b64(data) if data else None,
                "isFinal": None,
                "normalizedAlignment": align,
                "alignment": align,
                "contextId": ctx.context_id,
            }
        )

    async def _final(self, ctx: SessionContext) -> None:
        self.finished(ctx)
        state = self.state.pop(ctx, None)
        if state is not None and state.encoder is not None and not ctx.done:
            state.encoder.close()
        await self.send({"isFinal": True, "contextId": ctx.context_id})


class ElevenLabs(Api):
    def routes(self) -> list[web.AbstractRouteDef]:
        return [web.get(PATH, self.handler)]

    async def handler(self, request: web.Request) -> web.StreamResponse:
        try:
            fmt = OutputFormat.parse(request.query.get("output_format", "mp3_44100_128"))
        except ValueError as exc:
            return http_error(400, "invalid_output_format", str(exc))
        try:
            voice = self.voices.resolve(request.match_info["voice_id"], self.host.synth.engine.voices)
        except UnknownVoice as exc:
            return http_error(400, "voice_not_found", str(exc))
        return await serve_socket(
            self.host,
            request,
            lambda ws: ElevenLabsSocket(self.host, ws, request, voice, fmt),
            refuse_draining=lambda: http_error(503, "draining", "the server is draining; connect to another server"),
        )
