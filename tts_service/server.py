"""aiohttp transports: WebSocket protocol v1 and HTTP chunked streaming, plus the drain. Thin I/O.

The WebSocket connection itself (contexts, tombstones, the bounded outbox) is
:mod:`tts_service.ws`. This module builds the application around one synthesizer (any engine's
:class:`~tts_service.core.runtime.SynthesizerBase`):
routes, the API key and the separate admin key, the access log (keys redacted), HTTP one-shot
streams, health and load, and the *drain* that a SIGTERM (or ``POST /v1/admin/drain``) starts:
readiness 503 at once, an in-band ``draining`` notice on every connection, new contexts refused,
live ones finished within ``drain_timeout_s``, then an explicit ``shutting_down`` error for
whatever is still live and a 1001 close. A load balancer gets its drain phase and no client
mistakes a cut-off for a finished utterance.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import signal
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode

import numpy as np
from aiohttp import WSMsgType, web
from aiohttp.abc import AbstractAccessLogger

from . import compat
from . import protocol as P
from .aio import get_within
from .audio import StreamEncoder, wav_header
from .core.runtime import SynthesizerBase
from .core.scheduler import Output, Overloaded
from .protocol import CloseCode, ErrorCode, Limits, ProtocolError
from .ws import OUTBOX_HIGH_WATER, YIELD_EVERY, Connection

log = logging.getLogger(__name__)
access_log = logging.getLogger("streamvox.access")
_Connection = Connection  # the name tests (and older code) patch
DRAIN_RETRY_AFTER_MS = 1000  # what a draining server tells refused clients: go elsewhere, soon
HTTP_CHUNK_TIMEOUT_S = 60.0  # a one-shot stream whose next audio takes longer than this is ended
ADMIN_PREFIX = "/v1/admin/"  # guarded by the admin key alone, never by the client key
KEY_PARAMS = frozenset({"token", "api_key"})  # query parameters that carry a key (browsers, Cartesia)
ADMIN_KEY_HOWTO = "--admin-key-file PATH, $STREAMVOX_ADMIN_KEY_FILE or $STREAMVOX_ADMIN_KEY"


@dataclass(slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = P.DEFAULT_PORT
    api_key: str | None = None  # the clients' key: /v1/* and /tts/*
    admin_key: str | None = None  # /v1/admin/* only; None: the admin endpoints are off
    access_log: bool = False  # one line per request on the 'streamvox.access' logger, keys redacted
    limits: Limits = field(default_factory=Limits)
    drain_timeout_s: float = 30.0  # how long live contexts may take to finish after SIGTERM
    voice_map: compat.VoiceMap = field(default_factory=compat.VoiceMap)  # the compatible APIs' voice names


# ---------------------------------------------------------------- HTTP


class _Cut:
    """Put in an HTTP stream's queue at the drain deadline: end the body without its last chunk."""


_CUT = _Cut()
_EMPTY = np.zeros(0, dtype=np.float32)


class _QueueSink:
    """HTTP one-shot: outputs go to a queue the response handler drains (bounded by backed_up)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Output | _Cut] = asyncio.Queue()

    def deliver(self, out: Output) -> None:
        self.queue.put_nowait(out)

    def backed_up(self) -> bool:
        return self.queue.qsize() > OUTBOX_HIGH_WATER


def _http_error(status: int, code: str, message: str, **headers: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status, headers=headers)


def _bearer(header: str) -> str | None:
    """The token of an ``Authorization: Bearer X`` header; the scheme is case-insensitive (RFC 9110)."""
    scheme, _, token = header.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def _same(given: str, key: str) -> bool:
    return hmac.compare_digest(given.encode(), key.encode())


def redact_query(path_qs: str) -> str:
    """``path_qs`` with the value of every key-carrying parameter (``?token=``, ``?api_key=``)
    replaced by ``***``: a browser's WebSocket cannot set a header, so its key travels in the
    URL, and an access log must not keep it."""
    path, sep, query = path_qs.partition("?")
    if not sep:
        return path_qs
    pairs = parse_qsl(query, keep_blank_values=True)
    if not any(k.lower() in KEY_PARAMS for k, _ in pairs):
        return path_qs
    return f"{path}?" + urlencode([(k, "***" if k.lower() in KEY_PARAMS else v) for k, v in pairs], safe="*")


class RedactingAccessLogger(AbstractAccessLogger):
    """aiohttp's access log, but the request line goes through :func:`redact_query` and no header
    is written (``Authorization`` and the compatible APIs' key headers stay out)."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        version = f"HTTP/{request.version.major}.{request.version.minor}"
        self.logger.info(
            '%s "%s %s %s" %d %d %.3f',
            request.remote or "-",
            request.method,
            redact_query(request.path_qs),
            version,
            response.status,
            response.body_length,
            time,
        )


class _WebSocket(web.WebSocketResponse):
    """aiohttp closes an oversized message with 1009 and no reason; say what the limit is."""

    def __init__(self, *, cap: int, **kwargs) -> None:
        super().__init__(max_msg_size=cap, **kwargs)
        self._cap = cap

    async def close(self, *, code: int = 1000, message: bytes = b"", drain: bool = True) -> bool:
        if code == CloseCode.TOO_BIG and not message:
            message = f"message over the {self._cap}-byte limit; send text in pieces".encode()
        return await super().close(code=code, message=message, drain=drain)


class Server:
    """Builds the aiohttp application around one synthesizer (Piper's, Orpheus', ...)."""

    def __init__(self, synth: SynthesizerBase, config: ServerConfig | None = None) -> None:
        self.synth = synth
        self.config = config or ServerConfig()
        cap = self.config.limits.message_cap()
        self.app = web.Application(middlewares=[self._errors, self._auth], client_max_size=cap)
        self.app.add_routes(
            [
                web.get(P.WS_PATH, self.ws_handler),
                web.post(P.HTTP_TTS_PATH, self.http_tts),
                web.post(P.ADMIN_DRAIN_PATH, self.admin_drain),
                web.get("/v1/voices", self.voices),
                web.get("/healthz", self.healthz),
                web.get("/readyz", self.readyz),
                web.get("/metrics", self.metrics),
            ]
        )
        compat.register(self, self.app, self.config.voice_map)
        self.app.on_startup.append(self._on_startup)
        self.app.on_shutdown.append(self._on_shutdown)
        self._connections: set[Connection] = set()
        self._http_sinks: set[_QueueSink] = set()
        self.ready = False
        self.draining = False
        self.drained = asyncio.Event()  # set when a drain has closed every connection
        self._drain_task: asyncio.Task | None = None
        self._drain_deadline = 0.0

    async def _on_startup(self, _app: web.Application) -> None:
        await self.synth.start()
        self.ready = True

    async def _on_shutdown(self, _app: web.Application) -> None:
        self.ready = False
        if self._drain_task is not None and not self._drain_task.done():
            self._drain_task.cancel()  # a hard stop (second signal) ends the drain too
        self._cut_off("the server is shutting down now")
        await self._close_all()
        await self.synth.stop()

    @web.middleware
    async def _errors(self, request: web.Request, handler):
        """aiohttp's own 413 is plain text; the protocol promises a JSON reason."""
        try:
            return await handler(request)
        except web.HTTPRequestEntityTooLarge:
            return _http_error(
                413,
                ErrorCode.TEXT_TOO_LONG,
                f"request body over the limit of {self.config.limits.message_cap()} bytes; "
                f"texts are limited to {self.config.limits.max_context_chars} characters",
            )

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        if request.path.startswith(ADMIN_PREFIX):
            refusal = self._admin_refusal(request)
            return refusal if refusal is not None else await handler(request)
        key = self.config.api_key
        if key and request.path.startswith(compat.GUARDED_PREFIXES):
            given = _bearer(request.headers.get("Authorization", ""))
            if given is None:
                given = compat.api_key_of(request) or request.query.get("token", "")
            if not _same(given, key):
                return compat.unauthorized(request) or _http_error(
                    401,
                    ErrorCode.UNAUTHORIZED,
                    "missing or wrong API key: send 'Authorization: Bearer KEY' or ?token=KEY",
                )
        return await handler(request)

    def _admin_refusal(self, request: web.Request) -> web.Response | None:
        """``None`` when the request carries the admin key in its ``Authorization`` header.

        The client key never opens an admin endpoint (every agent holds it), and the admin key is
        taken from the header only: a URL ends up in proxies' logs and browser histories."""
        admin = self.config.admin_key
        if not admin:
            return _http_error(
                403,
                ErrorCode.UNAUTHORIZED,
                f"admin endpoints are off: start the server with an admin key ({ADMIN_KEY_HOWTO}), "
                "separate from the client API key",
            )
        given = _bearer(request.headers.get("Authorization", "")) or ""
        if given and _same(given, admin):
            return None
        client = self.config.api_key
        if given and client and _same(given, client):
            return _http_error(
                403,
                ErrorCode.UNAUTHORIZED,
                "this is the client API key; admin endpoints need the admin key ('Authorization: Bearer ADMIN_KEY')",
            )
        if not given and any(k.lower() in KEY_PARAMS for k in request.query):
            message = "the admin key is taken from the 'Authorization: Bearer ADMIN_KEY' header only, never the URL"
        else:
            message = "missing or wrong admin key: send 'Authorization: Bearer ADMIN_KEY'"
        return _http_error(401, ErrorCode.UNAUTHORIZED, message)

    # -- drain
    def start_drain(self, timeout_s: float | None = None) -> asyncio.Task:
        """Begin draining (idempotent): readiness and refusals change before this returns; the
        task ends when every connection is closed."""
        if self._drain_task is None:
            timeout_s = self.config.drain_timeout_s if timeout_s is None else timeout_s
            self.draining = True
            self.synth.metrics.draining.set(1)
            self._drain_deadline = time.monotonic() + timeout_s
            log.info("draining: %d live streams, up to %.1f s", self.synth.scheduler.active, timeout_s)
            for conn in list(self._connections):
                conn.notice_draining(DRAIN_RETRY_AFTER_MS, self._deadline_ms())
            self._drain_task = asyncio.get_running_loop().create_task(self._drain(timeout_s), name="streamvox-drain")
        return self._drain_task

    async def drain(self, timeout_s: float | None = None) -> None:
        """Drain and return once done; also what ``POST /v1/admin/drain`` starts."""
        await asyncio.shield(self.start_drain(timeout_s))

    def _deadline_ms(self) -> int:
        return max(0, round(1000 * (self._drain_deadline - time.monotonic())))

    async def _drain(self, timeout_s: float) -> None:
        try:
            while time.monotonic() < self._drain_deadline:
                if not self.synth.scheduler.active:  # WebSocket contexts and HTTP streams alike
                    break
                await asyncio.sleep(0.05)  # a poll: cheap, and the scheduler has no "all done" event
            cut = self._cut_off(f"the server shut down before this context finished ({timeout_s:g} s drain)")
            if cut:
                log.warning("drain deadline: cut off %d live contexts", cut)
            await self._close_all()
        finally:
            self.drained.set()
        log.info("drained")

    def _cut_off(self, message: str) -> int:
        cut = sum(conn.cut_off(message) for conn in list(self._connections))
        for sink in list(self._http_sinks):
            sink.queue.put_nowait(_CUT)
            cut += 1
        return cut

    async def _close_all(self) -> None:
        """Send what is queued (bounded), then close every socket with 1001."""
        conns = list(self._connections)
        await asyncio.gather(*(conn.flushed(1.0) for conn in conns))
        for conn in conns:
            conn.close()
            conn.start_close(CloseCode.GOING_AWAY, "server shutting down")
            self.synth.metrics.connections_closed.labels("drained").inc()
        await asyncio.gather(*(conn.wait_closed() for conn in conns))

    async def admin_drain(self, request: web.Request) -> web.Response:
        """``POST /v1/admin/drain`` (admin key required, see ``_admin_refusal``): start the SIGTERM
        drain from outside."""
        timeout_s = None
        if request.can_read_body:
            try:
                body = P.loads_strict(await request.read() or b"{}")
            except ProtocolError as exc:
                return _http_error(400, exc.code, exc.message)
            value = body.get("timeout_s") if isinstance(body, dict) else None
            if value is not None and (not isinstance(value, int | float) or isinstance(value, bool) or value < 0):
                return _http_error(400, ErrorCode.BAD_REQUEST, "'timeout_s' must be a number of seconds >= 0")
            timeout_s = value
        self.start_drain(timeout_s)
        return web.json_response(
            {"draining": True, "deadline_ms": self._deadline_ms(), "active_streams": self.synth.scheduler.active},
            status=202,
        )

    def _refuse_draining(self) -> web.Response:
        return _http_error(
            503,
            ErrorCode.DRAINING,
            "the server is draining for shutdown; connect to another server",
            **{"Retry-After": str(max(1, round(DRAIN_RETRY_AFTER_MS / 1000)))},
        )

    # -- WebSocket
    async def ws_handler(self, request: web.Request) -> web.StreamResponse:
        if self.draining:  # refuse at the handshake: an accepted-then-closed socket looks like a crash
            return self._refuse_draining()
        ws = _WebSocket(heartbeat=30.0, cap=self.config.limits.message_cap())
        await ws.prepare(request)
        conn = Connection(ws, self.synth, self.config.limits, transport=request.transport)
        engine = self.synth.engine
        conn.send(P.ready(engine.sample_rate, sorted(engine.voices), self.config.limits.max_contexts))
        handled = 0
        async with self.attached(conn):
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
                    if ws.close_code == CloseCode.TOO_BIG:
                        self.synth.metrics.connections_closed.labels("too_big").inc()
                    log.info("websocket error: %s", ws.exception())
                handled += 1
                if handled % YIELD_EVERY == 0:
                    # a burst already in the read buffer is handled without suspending: let the
                    # writer send the replies (and other connections run) between slices of it
                    await asyncio.sleep(0)
        return ws

    @contextlib.asynccontextmanager
    async def attached(self, conn: Connection):
        """Count ``conn`` among the server's connections (drain notice, cut-off, close) and run its
        writer; on exit close it. ``/v1/stream`` and the compatible endpoints' connections alike."""
        self._connections.add(conn)
        self.synth.metrics.connections.set(len(self._connections))
        writer = asyncio.create_task(conn.writer())
        try:
            yield conn
        finally:
            conn.close()
            self._connections.discard(conn)
            self.synth.metrics.connections.set(len(self._connections))
            await conn.wait_closed()  # before the writer is cancelled (see wait_closed)
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)

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
        if self.draining:
            return self._refuse_draining()
        try:
            P.check_text(text)
        except ProtocolError as exc:
            return _http_error(400, exc.code, exc.message)
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
        self._http_sinks.add(sink)
        try:
            self.synth.push_text(sid, text)
            self.synth.end(sid)
            await resp.prepare(request)
            if encoding == P.WAV:
                await resp.write(wav_header(rate))
            while True:
                out = await get_within(sink.queue, HTTP_CHUNK_TIMEOUT_S)
                if isinstance(out, _Cut):
                    # The drain deadline: end without the last chunk, so the client sees a
                    # truncated body (an error), never a short file that looks complete.
                    log.warning("HTTP stream cut off by the drain deadline")
                    if request.transport is not None:
                        request.transport.abort()
                    return resp
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
            self._http_sinks.discard(sink)
            if not finished:
                self.synth.cancel(sid)  # client went away (or timed out, or was cut off): stop the work
        return resp

    async def voices(self, _request: web.Request) -> web.Response:
        engine = self.synth.engine
        return web.json_response(
            {
                "default": engine.default_voice,
                "voices": [
                    {"name": v.name, "sample_rate": v.sample_rate, "model": v.model} for v in engine.describe_voices()
                ],
            }
        )

    async def healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    def load(self, now: float | None = None) -> float:
        """The load figure in 0..1 for placement and autoscaling: streams that cost compute over
        the streams the measured cost admits; 1 when a new stream would be refused (or draining).
        Cheap: a pass over the live streams, no compute."""
        sched = self.synth.scheduler
        now = time.monotonic() if now is None else now
        if self.draining or sched.refusal(now) is not None:
            return 1.0
        return round(min(1.0, sched.load(now) / max(1, sched.capacity_streams())), 4)

    async def readyz(self, _request: web.Request) -> web.Response:
        sched = self.synth.scheduler
        now = time.monotonic()
        capacity = sched.capacity_streams()
        accepting = self.ready and not self.draining and sched.refusal(now) is None
        body = {
            "ready": accepting,
            "draining": self.draining,
            "load": self.load(now),
            "active_streams": sched.active,
            "busy_streams": sched.load(now),
            "capacity_streams": capacity,
            "real_time_factor": round(sched.cost_per_audio_s, 4),
            "voices": sorted(self.synth.engine.voices),
        }
        return web.json_response(body, status=200 if accepting else 503)

    async def metrics(self, _request: web.Request) -> web.Response:
        self.synth._sync_gauges()
        self.synth.metrics.load.set(self.load())
        return web.Response(body=self.synth.metrics.render(), content_type="text/plain", charset="utf-8")


def build_app(synth: SynthesizerBase, *, config: ServerConfig | None = None) -> web.Application:
    """An aiohttp app serving ``synth`` (any engine's, e.g. from ``tts_service.engines.build``);
    run it with ``web.run_app`` or an ``AppRunner``."""
    return Server(synth, config).app


async def run(server: Server, *, host: str, port: int) -> None:
    """Serve until drained: the first SIGTERM/SIGINT (or ``POST /v1/admin/drain``) drains, a
    second signal stops at once. (``web.run_app`` would close every stream the instant the
    signal came, and then wait 60 s for an HTTP stream it had already starved.)"""
    logs = (
        {"access_log_class": RedactingAccessLogger, "access_log": access_log}
        if server.config.access_log
        else {"access_log": None}
    )
    runner = web.AppRunner(server.app, handle_signals=False, shutdown_timeout=2.0, **logs)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal(signum: int) -> None:
            if server.draining:
                log.warning("second %s: stopping now", signal.Signals(signum).name)
                stop.set()
            else:
                log.info("%s: draining (a second one stops at once)", signal.Signals(signum).name)
                server.start_drain()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        done = asyncio.ensure_future(server.drained.wait())
        halt = asyncio.ensure_future(stop.wait())
        await asyncio.wait({done, halt}, return_when=asyncio.FIRST_COMPLETED)
        for fut in (done, halt):
            fut.cancel()
    finally:
        await runner.cleanup()


__all__ = ["RedactingAccessLogger", "Server", "ServerConfig", "build_app", "redact_query", "run"]
