"""aiohttp transports: WebSocket protocol v1 and HTTP chunked streaming. Thin I/O only.

Every connection owns an *outbox* drained by one writer task, so audio of many contexts and
control messages leave in a single order. A cancel removes the context's frames still in the
outbox, then queues the ack: nothing of that context can follow the ack onto the wire.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from aiohttp import WSMsgType, web

from . import protocol as P
from .audio import StreamEncoder, wav_header
from .metrics import Metrics
from .protocol import ErrorCode, Limits, MsgType, ProtocolError
from .runtime import Synthesizer
from .scheduler import Output, Overloaded

log = logging.getLogger(__name__)
OUTBOX_HIGH_WATER = 48  # queued audio frames per connection before unpaced streams are held back


@dataclass(slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = P.DEFAULT_PORT
    api_key: str | None = None
    limits: Limits = field(default_factory=Limits)


# ---------------------------------------------------------------- WebSocket


@dataclass(slots=True)
class _Context:
    context_id: str
    sid: int
    stream: int
    encoder: StreamEncoder
    chars: int = 0
    frames_sent: int = 0


class _Connection:
    """One WebSocket client: its contexts, its outbox, its writer."""

    def __init__(self, ws: web.WebSocketResponse, synth: Synthesizer, limits: Limits) -> None:
        self.ws = ws
        self.synth = synth
        self.limits = limits
        self.contexts: dict[str, _Context] = {}
        self.by_sid: dict[int, _Context] = {}
        self._stream_numbers = itertools.count(1)
        self._outbox: deque[tuple[int | None, str | bytes]] = deque()
        self._queued_frames = 0
        self._wake = asyncio.Event()
        self._closed = False

    # -- outbox
    def send(self, msg: str | bytes, sid: int | None = None) -> None:
        if self._closed:
            return
        self._outbox.append((sid, msg))
        if isinstance(msg, bytes):
            self._queued_frames += 1
        self._wake.set()

    def purge(self, sid: int) -> int:
        """Remove a stream's unsent messages; return how many audio frames were removed."""
        kept: deque[tuple[int | None, str | bytes]] = deque()
        dropped = 0
        for item in self._outbox:
            if item[0] == sid:
                if isinstance(item[1], bytes):
                    dropped += 1
            else:
                kept.append(item)
        self._outbox = kept
        self._queued_frames -= dropped
        return dropped

    async def writer(self) -> None:
        try:
            while True:
                while not self._outbox:
                    self._wake.clear()
                    await self._wake.wait()
                _, msg = self._outbox.popleft()
                if isinstance(msg, bytes):
                    self._queued_frames -= 1
                    await self.ws.send_bytes(msg)
                else:
                    await self.ws.send_str(msg)
        except (ConnectionError, RuntimeError):  # peer went away; the reader notices too
            self._closed = True

    # -- sink protocol, one adapter per context
    def sink(self, ctx_id: str) -> _ContextSink:
        return _ContextSink(self, ctx_id)

    def deliver(self, ctx_id: str, out: Output) -> None:
        ctx = self.contexts.get(ctx_id)
        if ctx is None or ctx.sid != out.sid:
            return  # the gate: a stale stream never reaches a reused context id
        if out.kind == "audio":
            payload = ctx.encoder.encode(out.samples)
            if payload:
                self.send(P.pack_frame(ctx.stream, ctx.frames_sent, payload), ctx.sid)
                ctx.frames_sent += 1
        elif out.kind == "words":
            self.send(P.words(ctx_id, out.words or []), ctx.sid)
        elif out.kind == "done":
            tail = ctx.encoder.encode(_EMPTY, last=True)  # the resampler's last samples
            if tail:
                self.send(P.pack_frame(ctx.stream, ctx.frames_sent, tail), ctx.sid)
                ctx.frames_sent += 1
            self.send(P.done(ctx_id, ctx.frames_sent, out.audio_ms), ctx.sid)
            self._forget(ctx_id)
        elif out.kind == "error":
            self.send(P.error(out.code, out.message, ctx_id, context_ended=True), ctx.sid)
            self._forget(ctx_id)

    def _forget(self, ctx_id: str) -> None:
        ctx = self.contexts.pop(ctx_id, None)
        if ctx is not None:
            self.by_sid.pop(ctx.sid, None)

    # -- client messages
    def handle(self, raw: str) -> None:
        try:
            msg = P.parse_client_message(raw, self.limits)
            getattr(self, f"_on_{msg.type}")(msg)
        except ProtocolError as exc:
            self.synth.metrics.errors.labels(exc.code).inc()
            # A context that is not live (never started, or refused at start) has ended as far as the client
            # is concerned; an error about one message of a live context leaves that context running.
            extra = {"context_ended": exc.context_id not in self.contexts} if exc.context_id else {}
            self.send(P.error(exc.code, exc.message, exc.context_id, **extra))

    def _open(self, msg: P.ClientMessage) -> _Context:
        ctx_id = msg.context_id or ""
        if ctx_id in self.contexts:
            raise ProtocolError(
                ErrorCode.BAD_REQUEST, f"context {ctx_id!r} is already live; cancel or end it first", ctx_id
            )
        if len(self.contexts) >= self.limits.max_contexts:
            raise ProtocolError(
                ErrorCode.TOO_MANY_CONTEXTS,
                f"{self.limits.max_contexts} contexts are live on this connection; end or cancel one",
                ctx_id,
            )
        voice = msg.voice
        if voice is not None and voice not in self.synth.engine.voices:
            raise ProtocolError(
                ErrorCode.UNKNOWN_VOICE,
                f"unknown voice {voice!r}; available: {sorted(self.synth.engine.voices)}",
                ctx_id,
            )
        rate = msg.sample_rate or self.synth.engine.sample_rate
        encoding = msg.encoding or P.PCM_S16LE
        sink = self.sink(ctx_id)
        try:
            sid = self.synth.open(sink, voice=voice, pace=True if msg.pace is None else msg.pace)
        except Overloaded as exc:
            self.synth.metrics.errors.labels(ErrorCode.OVERLOADED).inc()
            self.send(
                P.error(
                    ErrorCode.OVERLOADED,
                    f"server overloaded: {exc.reason}; retry later",
                    ctx_id,
                    retry_after_ms=exc.retry_after_ms,
                    context_ended=True,
                )
            )
            raise _Handled() from None
        ctx = _Context(
            ctx_id,
            sid,
            next(self._stream_numbers),
            StreamEncoder(in_rate=self.synth.engine.sample_rate, out_rate=rate, encoding=encoding),
        )
        self.contexts[ctx_id] = ctx
        self.by_sid[sid] = ctx
        self.send(P.started(ctx_id, ctx.stream, rate, encoding))
        return ctx

    def _on_start(self, msg: P.ClientMessage) -> None:
        try:
            ctx = self._open(msg)
        except _Handled:
            return
        if msg.text:
            self._append(ctx, msg.text)

    def _on_text(self, msg: P.ClientMessage) -> None:
        ctx = self.contexts.get(msg.context_id or "")
        if ctx is None:
            try:
                ctx = self._open(P.ClientMessage(type=MsgType.START, context_id=msg.context_id))
            except _Handled:
                return
        self._append(ctx, msg.text or "")

    def _append(self, ctx: _Context, text: str) -> None:
        if ctx.chars + len(text) > self.limits.max_context_chars:
            raise ProtocolError(
                ErrorCode.TEXT_TOO_LONG,
                f"context text would exceed {self.limits.max_context_chars} characters; "
                "end this context and continue in a new one",
                ctx.context_id,
            )
        try:
            self.synth.push_text(ctx.sid, text)
        except ValueError as exc:
            raise ProtocolError(ErrorCode.BAD_REQUEST, str(exc), ctx.context_id) from None
        except KeyError:
            raise _finished(ctx.context_id) from None
        ctx.chars += len(text)

    def _known(self, msg: P.ClientMessage) -> _Context:
        ctx = self.contexts.get(msg.context_id or "")
        if ctx is None:
            raise ProtocolError(
                ErrorCode.BAD_REQUEST, f"unknown context {msg.context_id!r}; send 'start' first", msg.context_id
            )
        return ctx

    def _on_flush(self, msg: P.ClientMessage) -> None:
        try:
            self.synth.flush(self._known(msg).sid)
        except KeyError:
            raise _finished(msg.context_id) from None

    def _on_end(self, msg: P.ClientMessage) -> None:
        ctx = self._known(msg)
        try:
            self.synth.end(ctx.sid)
        except KeyError:
            pass  # already finishing

    def _on_cancel(self, msg: P.ClientMessage) -> None:
        t0 = time.perf_counter()
        ctx_id = msg.context_id or ""
        ctx = self.contexts.get(ctx_id)
        dropped = 0
        if ctx is not None:
            dropped = self.synth.cancel(ctx.sid) + self.purge(ctx.sid)
            self._forget(ctx_id)
        self.send(P.cancelled(ctx_id, dropped))
        self.synth.metrics.cancel_ack.observe(time.perf_counter() - t0)

    def _on_ping(self, msg: P.ClientMessage) -> None:
        self.send(P.pong(msg.ping_id))

    def close(self) -> None:
        self._closed = True
        for ctx in list(self.contexts.values()):
            self.synth.cancel(ctx.sid)
        self.contexts.clear()
        self.by_sid.clear()


_EMPTY = np.zeros(0, dtype=np.float32)


def _finished(context_id: str | None) -> ProtocolError:
    # The stream finished (its done/error is on its way) while this message was in flight.
    return ProtocolError(ErrorCode.BAD_REQUEST, f"context {context_id!r} has finished; start a new context", context_id)


class _Handled(Exception):
    """The error was already sent; stop processing this message."""


@dataclass(slots=True)
class _ContextSink:
    conn: _Connection
    ctx_id: str

    def deliver(self, out: Output) -> None:
        self.conn.deliver(self.ctx_id, out)

    def backed_up(self) -> bool:
        return self.conn._queued_frames > OUTBOX_HIGH_WATER


# ---------------------------------------------------------------- HTTP


class _QueueSink:
    """HTTP one-shot: outputs go to a bounded queue the response handler drains."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Output] = asyncio.Queue()

    def deliver(self, out: Output) -> None:
        self.queue.put_nowait(out)

    def backed_up(self) -> bool:
        return self.queue.qsize() > OUTBOX_HIGH_WATER


def _http_error(status: int, code: str, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status, headers=headers)


class Server:
    """Builds the aiohttp application around one :class:`Synthesizer`."""

    def __init__(self, synth: Synthesizer, config: ServerConfig | None = None) -> None:
        self.synth = synth
        self.config = config or ServerConfig()
        self.app = web.Application(middlewares=[self._auth])
        self.app.add_routes(
            [
                web.get(P.WS_PATH, self.ws_handler),
                web.post(P.HTTP_TTS_PATH, self.http_tts),
                web.get("/v1/voices", self.voices),
                web.get("/healthz", self.healthz),
                web.get("/readyz", self.readyz),
                web.get("/metrics", self.metrics),
            ]
        )
        self.app.on_startup.append(self._on_startup)
        self.app.on_shutdown.append(self._on_shutdown)
        self._connections: set[_Connection] = set()
        self.ready = False

    async def _on_startup(self, _app: web.Application) -> None:
        await self.synth.start()
        self.ready = True

    async def _on_shutdown(self, _app: web.Application) -> None:
        self.ready = False
        for conn in list(self._connections):
            conn.close()
            await conn.ws.close()
        await self.synth.stop()

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        key = self.config.api_key
        if key and request.path.startswith("/v1/"):
            header = request.headers.get("Authorization", "")
            given = header[7:] if header.startswith("Bearer ") else request.query.get("token", "")
            if not hmac.compare_digest(given.encode(), key.encode()):
                return _http_error(
                    401,
                    ErrorCode.UNAUTHORIZED,
                    "missing or wrong API key: send 'Authorization: Bearer KEY' or ?token=KEY",
                )
        return await handler(request)

    # -- WebSocket
    async def ws_handler(self, request: web.Request) -> web.WebSocketResponse:
        # JSON may escape each character as \uXXXX, a surrogate pair as two: up to 12 bytes per character.
        ws = web.WebSocketResponse(heartbeat=30.0, max_msg_size=12 * self.config.limits.max_text_chars + 4096)
        await ws.prepare(request)
        conn = _Connection(ws, self.synth, self.config.limits)
        self._connections.add(conn)
        engine = self.synth.engine
        conn.send(P.ready(engine.sample_rate, sorted(engine.voices), self.config.limits.max_contexts))
        writer = asyncio.create_task(conn.writer())
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    try:
                        conn.handle(msg.data)
                    except Exception:  # a bug must not kill the connection
                        log.exception("error handling %r", msg.data[:200])
                        conn.send(P.error(ErrorCode.INTERNAL, "internal error handling the message"))
                elif msg.type == WSMsgType.BINARY:
                    conn.send(
                        P.error(
                            ErrorCode.BAD_REQUEST,
                            "binary messages are not accepted from clients; send JSON text messages",
                        )
                    )
                elif msg.type == WSMsgType.ERROR:
                    log.info("websocket error: %s", ws.exception())
        finally:
            conn.close()
            self._connections.discard(conn)
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)
        return ws

    # -- HTTP one-shot
    async def http_tts(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return _http_error(400, ErrorCode.BAD_REQUEST, 'body must be a JSON object like {"text": "Hello"}')
        if not isinstance(body, dict):
            return _http_error(400, ErrorCode.BAD_REQUEST, 'body must be a JSON object like {"text": "Hello"}')
        text = body.get("text")
        if not isinstance(text, str) or not text.strip():
            return _http_error(400, ErrorCode.BAD_REQUEST, "'text' must be a non-empty string")
        if len(text) > self.config.limits.max_context_chars:
            return _http_error(
                413,
                ErrorCode.TEXT_TOO_LONG,
                f"text of {len(text)} characters exceeds {self.config.limits.max_context_chars}",
            )
        voice, rate, encoding, pace = (
            body.get("voice"),
            body.get("sample_rate"),
            body.get("encoding", P.WAV),
            body.get("pace", False),
        )
        try:
            if voice is not None and not isinstance(voice, str):
                raise ProtocolError(ErrorCode.BAD_REQUEST, "'voice' must be a string")
            if rate is not None and (not isinstance(rate, int) or isinstance(rate, bool)):
                raise ProtocolError(ErrorCode.BAD_REQUEST, "'sample_rate' must be an integer")
            if not isinstance(pace, bool):
                raise ProtocolError(ErrorCode.BAD_REQUEST, "'pace' must be true or false")
            P.validate_format(rate, encoding if isinstance(encoding, str) else repr(encoding), P.HTTP_ENCODINGS)
        except ProtocolError as exc:
            return _http_error(400, exc.code, exc.message)
        engine = self.synth.engine
        if voice is not None and voice not in engine.voices:
            return _http_error(
                404, ErrorCode.UNKNOWN_VOICE, f"unknown voice {voice!r}; available: {sorted(engine.voices)}"
            )
        rate = rate or engine.sample_rate
        sink = _QueueSink()
        try:
            sid = self.synth.open(sink, voice=voice, pace=pace)
        except Overloaded as exc:
            return _http_error(
                503,
                ErrorCode.OVERLOADED,
                f"server overloaded: {exc.reason}",
                **{"Retry-After": str(max(1, round(exc.retry_after_ms / 1000)))},
            )
        encoder = StreamEncoder(
            in_rate=engine.sample_rate, out_rate=rate, encoding=P.PCM_S16LE if encoding == P.WAV else encoding
        )
        content_type = {P.WAV: "audio/wav", P.MULAW: "audio/basic", P.PCM_S16LE: "audio/L16"}[encoding]
        resp = web.StreamResponse(
            headers={
                "Content-Type": f"{content_type}; rate={rate}" if encoding != P.WAV else content_type,
                "X-Sample-Rate": str(rate),
                "Cache-Control": "no-store",
            }
        )
        resp.enable_chunked_encoding()
        finished = False
        try:
            self.synth.push_text(sid, text)
            self.synth.end(sid)
            await resp.prepare(request)
            if encoding == P.WAV:
                await resp.write(wav_header(rate))
            while True:
                out = await asyncio.wait_for(sink.queue.get(), timeout=60.0)
                if out.kind == "audio":
                    await resp.write(encoder.encode(out.samples))
                elif out.kind == "done":
                    await resp.write(encoder.encode(_EMPTY, last=True))
                    finished = True
                    break
                elif out.kind == "error":
                    log.warning("HTTP synthesis failed: %s", out.message)
                    finished = True
                    break  # headers are gone: truncating the body is the only signal left
            await resp.write_eof()
        finally:
            if not finished:
                self.synth.cancel(sid)  # client went away (or timed out): stop the work
        return resp

    async def voices(self, _request: web.Request) -> web.Response:
        engine = self.synth.engine
        return web.json_response(
            {
                "default": engine.default_voice,
                "voices": [
                    {"name": name, "sample_rate": v.sample_rate, "model": str(v.files.model_path)}
                    for name, v in engine.voices.items()
                ],
            }
        )

    async def healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(self, _request: web.Request) -> web.Response:
        sched = self.synth.scheduler
        now = time.monotonic()
        load = sched.load(now)
        capacity = sched.capacity_streams()
        accepting = self.ready and sched.refusal(now) is None
        body = {
            "ready": accepting,
            "active_streams": sched.active,
            "load": load,
            "capacity_streams": capacity,
            "real_time_factor": round(sched.cost_per_audio_s, 4),
            "voices": sorted(self.synth.engine.voices),
        }
        return web.json_response(body, status=200 if accepting else 503)

    async def metrics(self, _request: web.Request) -> web.Response:
        self.synth._sync_gauges()
        return web.Response(body=self.synth.metrics.render(), content_type="text/plain", charset="utf-8")


def build_app(
    engine, *, config: ServerConfig | None = None, options=None, metrics: Metrics | None = None
) -> web.Application:
    """An aiohttp app serving ``engine``; run it with ``web.run_app`` or an ``AppRunner``."""
    return Server(Synthesizer(engine, options=options, metrics=metrics), config).app


__all__ = ["Server", "ServerConfig", "build_app"]
