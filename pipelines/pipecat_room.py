"""The demo room's web app: our page, the SmallWebRTC signalling, and the Twilio media-stream socket.

One FastAPI app, one port (7860 by default), one agent per browser session or phone call:

* ``GET /``: the demo page (``pipelines/web/``: plain JS over the browser's own
  ``RTCPeerConnection``, no request to any other host, so it works offline). ``/client/`` (where
  Pipecat's prebuilt page used to be) redirects to it. The page POSTs ``/start``
  (-> ``{"sessionId"}``), then its SDP offer to ``/sessions/{id}/api/offer``; ICE candidates
  may follow with ``PATCH`` on the same path. ``/api/offer`` takes them directly (what a script
  or an aiortc client uses).
* ``WS /ws``: a Twilio ``<Connect><Stream>`` media stream (``pipelines.pipecat_agent`` has the
  TwiML).

Same signalling routes as Pipecat's development runner, which this replaces so that the agent,
its figures and its shutdown stay under our control (the runner keeps its app in module globals).

This module knows transports, not the pipeline: the app is given a factory that builds an agent
on a transport (``pipelines.pipecat_agent.room_app`` passes its ``build_agent``), so the
dependency runs one way, agent -> room.

Every call is a whole pipeline, so the room treats calls as a bounded resource
(``pipelines.room_limits``): requests from foreign pages or hosts are refused before anything is
read, an offer is checked before any pipeline is built for it, bodies are capped, at most
``max_calls`` calls run at once (more: HTTP 503, or on the phone a short "all lines are busy" and
a hang-up), and every half-open thing has a deadline: an answered offer whose WebRTC never
connects, a ``/ws`` that never sends Twilio's ``start`` (and at most ``max_waiting_sockets`` such
at once), a ``/start`` session never used.
``GET /healthz`` (the room answers) and ``GET /readyz`` (its parts are up and a line is free) say
how it stands.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from fastapi import FastAPI, Request, WebSocket  # module level: FastAPI resolves annotations here
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from loguru import logger
from pipecat.transports.base_transport import BaseTransport, TransportParams
from pipecat.transports.smallwebrtc.connection import SmallWebRTCConnection
from pipecat.transports.smallwebrtc.request_handler import (
    IceCandidate,
    SmallWebRTCPatchRequest,
    SmallWebRTCRequest,
    SmallWebRTCRequestHandler,
)
from pipecat.transports.smallwebrtc.transport import SmallWebRTCTransport
from pipecat.workers.runner import WorkerRunner

from agent import pipecat_downlink
from agent.webrtc_uplink import release_audio_sooner
from pipelines.loop_watch import LoopWatch
from pipelines.room_limits import Refusal, RoomLimits, check_candidates, check_offer, read_json

WEB_DIR = Path(__file__).resolve().parent / "web"  # shipped as package data (pyproject.toml)


class RoomAgent(Protocol):
    """What the room needs of an agent: a pipeline worker to run until the call ends."""

    @property
    def worker(self): ...


# (transport, phone) -> agent; ``phone``: the transport is an 8 kHz phone line
# (transport, phone, the page's echo mode: "browser-aec" | "agent-aec" | "raw-mic" | None when it did not say) -> agent
AgentFactory = Callable[[BaseTransport, bool, str | None], RoomAgent]
PAGE_ECHO_MODES = ("browser-aec", "agent-aec", "raw-mic")  # what the page sends in /start (pipelines/web/app.js)


@dataclass(slots=True)
class _Session:
    """A ``/start`` session: when it was last used (monotonic) and the page's echo mode, where it said one."""

    used: float
    echo: str | None = None


# -> the "all lines are busy" message as 8 kHz mu-law (None: hang up without a word)
BusyClip = Callable[[], Awaitable[bytes | None]]
# -> {part name: up?} for /readyz (the TTS server, the LLM)
PartsStatus = Callable[[], dict[str, bool]]

TWILIO_CHUNK = 160  # 20 ms of 8 kHz mu-law, as Twilio sends it
REFUSAL_LOG_EVERY_S = 10.0  # a flood of refused requests is one log line per reason and interval


class Lines:
    """Calls against the cap: a line is taken before a pipeline is built, given back when it ends."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.in_use = 0

    @property
    def full(self) -> bool:
        return self.in_use >= self.cap

    def take(self) -> bool:
        if self.full:
            return False
        self.in_use += 1
        return True

    def give(self) -> None:
        self.in_use = max(0, self.in_use - 1)

    def busy(self) -> Refusal:
        return Refusal(503, f"all {self.cap} lines are busy (STREAMVOX_MAX_CALLS); try again later")


class _RefusalLog:
    """One WARNING per reason per interval: a page hammering the room must not flood the terminal."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def __call__(self, what: str, reason: str) -> None:
        now = time.monotonic()
        if now - self._last.get(reason, -REFUSAL_LOG_EVERY_S) >= REFUSAL_LOG_EVERY_S:
            self._last[reason] = now
            logger.warning(f"room: refused {what}: {reason}")


class _Gate:
    """ASGI middleware: the Host on every request, the Origin on every WebSocket and every request
    that is not a GET, Twilio's signature on the phone socket; refused before a route reads a byte."""

    def __init__(self, app, limits: RoomLimits, log: _RefusalLog) -> None:
        self.app, self.limits, self.log = app, limits, log

    async def __call__(self, scope, receive, send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = headers.get("host")
        try:
            self.limits.check_host(host)
            if kind == "websocket" or scope["method"] not in ("GET", "HEAD"):
                self.limits.check_origin(headers.get("origin"), host)
            if kind == "websocket" and scope["path"] == "/ws":
                query = scope.get("query_string", b"").decode("latin-1")
                self.limits.check_twilio(headers.get("x-twilio-signature"), host, scope["path"], query)
        except Refusal as refusal:
            self.log(f"{scope.get('method', 'WebSocket')} {scope['path']}", refusal.reason)
            if kind == "websocket":
                await receive()  # websocket.connect; a close before accept is an HTTP 403
                await send({"type": "websocket.close", "code": 1008, "reason": refusal.reason[:120]})
            else:
                await _refused(refusal)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _refused(refusal: Refusal) -> JSONResponse:
    headers = {"Retry-After": "10"} if refusal.status == 503 else None
    return JSONResponse({"error": refusal.reason}, status_code=refusal.status, headers=headers)


def build_room_app(
    make_agent: AgentFactory,
    *,
    on_agent: Callable[[RoomAgent], None] | None = None,
    limits: RoomLimits | None = None,
    busy_clip: BusyClip | None = None,
    parts: PartsStatus | None = None,
) -> FastAPI:
    """The app; ``on_agent`` sees every agent created (tests and figures use it); ``limits``:
    :class:`RoomLimits` (its defaults when None); ``busy_clip``: what a phone caller hears when
    every line is taken; ``parts``: the health of the agent's servers, for ``/readyz``."""
    if not (WEB_DIR / "index.html").is_file():
        raise FileNotFoundError(f"the demo page is missing ({WEB_DIR}/index.html): reinstall streamvox")
    release_audio_sooner()  # the caller's voice reaches the agent sooner, and stays prompt (agent.webrtc_uplink)
    pipecat_downlink.install()  # the agent's voice leaves evenly and without gaps (agent.pipecat_downlink)
    limits = limits or RoomLimits()
    handler = SmallWebRTCRequestHandler()
    sessions: dict[str, _Session] = {}  # /start session id -> its session, the least recently used first
    lines = Lines(limits.max_calls)
    live_pcs: set[str] = set()  # peer connections with an agent (an offer naming one renegotiates)
    tasks: set[asyncio.Task] = set()
    log_refusal = _RefusalLog()

    async def run(agent: RoomAgent) -> None:
        if on_agent is not None:
            on_agent(agent)
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(agent.worker)
        await runner.run()

    def background(coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return task

    async def run_call(agent: RoomAgent) -> None:
        """Run a call that holds a line, and give the line back however it ends."""
        try:
            await run(agent)
        finally:
            lines.give()

    watch = LoopWatch()

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        watch.start()
        yield
        await watch.stop()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await handler.close()

    app = FastAPI(lifespan=lifespan)
    app.add_middleware(_Gate, limits=limits, log=log_refusal)
    app.mount("/assets", StaticFiles(directory=WEB_DIR), name="assets")

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        # no-cache: a page kept from an older run would speak an older protocol to this agent
        return FileResponse(WEB_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/client/", include_in_schema=False)
    @app.get("/client", include_in_schema=False)
    async def old_page() -> RedirectResponse:
        return RedirectResponse(url="/")

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok", "calls": lines.in_use, "max_calls": lines.cap, "loop": watch.figures()}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        state = dict(parts()) if parts is not None else {}
        ready = all(state.values()) and not lines.full
        body = {"ready": ready, "parts": state, "calls": lines.in_use, "max_calls": lines.cap, "full": lines.full}
        return JSONResponse(body, status_code=200 if ready else 503)

    def prune_sessions() -> None:
        stale = time.monotonic() - limits.session_ttl_s
        for sid in [s for s, session in sessions.items() if session.used < stale]:
            del sessions[sid]
        while len(sessions) >= limits.max_sessions:  # the oldest make room
            del sessions[next(iter(sessions))]

    def use_session(session_id: str) -> _Session | None:
        session = sessions.pop(session_id, None)
        if session is None or session.used < time.monotonic() - limits.session_ttl_s:
            return None
        session.used = time.monotonic()
        sessions[session_id] = session  # to the end: the most recently used
        return session

    @app.post("/start")
    async def start(request: Request) -> Response:
        try:
            data = await read_json(request, limits.max_body_bytes)
            if lines.full:
                raise lines.busy()
        except Refusal as refusal:
            return _refused(refusal)
        prune_sessions()
        session_id = str(uuid.uuid4())
        body = data.get("body") if isinstance(data, dict) else None
        mode = body.get("echo_mode") if isinstance(body, dict) else None
        # anything but the page's two modes: it did not say (older pages, other clients)
        sessions[session_id] = _Session(time.monotonic(), mode if mode in PAGE_ECHO_MODES else None)
        return JSONResponse({"sessionId": session_id})

    async def reap_unconnected(connection: SmallWebRTCConnection, agent: RoomAgent, call: asyncio.Task) -> None:
        """An answered offer whose WebRTC never connects would hold its pipeline for good."""
        deadline = time.monotonic() + limits.connect_timeout_s
        while time.monotonic() < deadline:
            if call.done() or connection.is_connected():
                return
            await asyncio.sleep(0.2)
        logger.info(f"room: call {connection.pc_id} did not connect within {limits.connect_timeout_s:g} s; ended")
        await agent.worker.cancel()
        try:
            await connection.disconnect()
        except Exception as exc:  # already closing: nothing more to free
            logger.debug(f"room: closing {connection.pc_id}: {exc}")

    async def offer(data, echo_mode: str | None = None) -> dict:
        checked = check_offer(data)  # before anything is built for it
        renegotiation = checked["pc_id"] is not None and checked["pc_id"] in live_pcs
        if not renegotiation and not lines.take():
            raise lines.busy()
        built = False

        async def connected(connection: SmallWebRTCConnection) -> None:
            nonlocal built
            params = TransportParams(audio_in_enabled=True, audio_out_enabled=True)
            transport = SmallWebRTCTransport(webrtc_connection=connection, params=params)
            agent = make_agent(transport, False, echo_mode)
            built = True
            call = background(run_call(agent))
            pc_id = connection.pc_id
            live_pcs.add(pc_id)
            call.add_done_callback(lambda _t: live_pcs.discard(pc_id))
            background(reap_unconnected(connection, agent, call))

        request = SmallWebRTCRequest(**checked)
        try:
            return await handler.handle_web_request(request=request, webrtc_connection_callback=connected)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            raise Refusal(400, f"the SDP offer was refused: {exc}") from None
        finally:
            if not renegotiation and not built:
                lines.give()

    async def candidates(data) -> dict:
        pc_id, items = check_candidates(data)
        patch = SmallWebRTCPatchRequest(pc_id=pc_id, candidates=[IceCandidate(**c) for c in items])
        try:
            await handler.handle_patch_request(patch)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            raise Refusal(400, f"an ICE candidate was refused: {exc}") from None
        return {"status": "success"}

    async def signalling(request: Request, patch: bool, echo_mode: str | None = None) -> Response:
        """Offer or candidates; malformed input is a 4xx with the reason, not a traceback."""
        try:
            data = await read_json(request, limits.max_body_bytes)
            return JSONResponse(await candidates(data) if patch else await offer(data, echo_mode))
        except Refusal as refusal:
            return _refused(refusal)

    @app.post("/api/offer")
    async def post_offer(request: Request):
        return await signalling(request, patch=False)

    @app.patch("/api/offer")
    async def patch_offer(request: Request):
        return await signalling(request, patch=True)

    @app.api_route("/sessions/{session_id}/{path:path}", methods=["GET", "POST", "PATCH"])
    async def session_route(session_id: str, path: str, request: Request):
        session = use_session(session_id)
        if session is None:
            return JSONResponse({"error": "unknown or expired session id; POST /start first"}, status_code=404)
        if not path.endswith("api/offer"):
            return Response(status_code=200)
        return await signalling(request, patch=request.method == "PATCH", echo_mode=session.echo)

    async def busy_line(websocket: WebSocket, call) -> None:
        """Every line is taken: say so (when a clip is at hand), then hang up. Closing the stream
        ends ``<Connect><Stream>``; with no TwiML after it, Twilio ends the call."""
        log_refusal("a phone call", f"all {lines.cap} lines are busy")
        clip = None
        if busy_clip is not None:
            try:
                clip = await asyncio.wait_for(busy_clip(), 5.0)
            except Exception as exc:  # no voice for it: the hang-up alone still tells the caller
                logger.warning(f"room: no 'lines busy' message to play ({exc})")
        if clip:
            sid = call["stream_id"]
            for i in range(0, len(clip), TWILIO_CHUNK):
                payload = base64.b64encode(clip[i : i + TWILIO_CHUNK]).decode()
                media = {"event": "media", "streamSid": sid, "media": {"payload": payload}}
                await websocket.send_text(json.dumps(media))
            await websocket.send_text(json.dumps({"event": "mark", "streamSid": sid, "mark": {"name": "busy"}}))
            await _wait_for_mark(websocket, "busy", len(clip) / 8000 + 1.0)
        await websocket.close(code=1013, reason="all lines are busy; try again later")

    waiting = [0]  # /ws sockets that have not sent their `start` yet

    @app.websocket("/ws")
    async def phone(websocket: WebSocket) -> None:
        if waiting[0] >= limits.max_waiting_sockets:  # each one holds a socket and tasks until its deadline
            log_refusal("a phone socket", f"{waiting[0]} phone sockets already wait for their 'start'")
            await websocket.close(code=1013, reason="too many sockets waiting; try again later")
            return
        await websocket.accept()
        waiting[0] += 1
        try:
            call = await asyncio.wait_for(twilio_start(websocket), limits.ws_start_timeout_s)
        except TimeoutError:
            log_refusal("a phone socket", f"no Twilio 'start' within {limits.ws_start_timeout_s:g} s")
            await _close_quietly(websocket, 1008, f"no Twilio 'start' within {limits.ws_start_timeout_s:g} s")
            return
        except (ValueError, KeyError, TypeError, RuntimeError) as exc:  # not Twilio, or gone already
            log_refusal("a phone socket", str(exc))
            await _close_quietly(websocket, 1008, str(exc)[:120])
            return
        finally:
            waiting[0] -= 1
        if not lines.take():
            with contextlib.suppress(RuntimeError, OSError):
                await busy_line(websocket, call)
            return
        await run_call(make_agent(twilio_transport_for(websocket, call), True, None))

    return app


async def _close_quietly(websocket: WebSocket, code: int, reason: str) -> None:
    """Close a socket the caller may have left already: a refusal, not a traceback in the log."""
    from starlette.websockets import WebSocketDisconnect

    with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
        await websocket.close(code=code, reason=reason)


async def _wait_for_mark(websocket: WebSocket, name: str, timeout_s: float) -> None:
    """Until Twilio echoes mark ``name`` (its playback reached it), the call stops, or ``timeout_s``."""

    async def wait() -> None:
        while True:
            message = json.loads(await websocket.receive_text())
            if message.get("event") == "stop" or message.get("mark", {}).get("name") == name:
                return

    with contextlib.suppress(TimeoutError, ValueError, KeyError, RuntimeError, AttributeError):
        await asyncio.wait_for(wait(), timeout_s)


async def twilio_start(websocket):
    """Twilio's call data from the stream's first messages (``connected``, ``start``)."""
    from pipecat.runner.utils import parse_telephony_websocket

    kind, call = await parse_telephony_websocket(websocket)
    if kind != "twilio":
        raise ValueError(f"this endpoint speaks Twilio media streams; the caller looks like {kind!r}")
    return call


async def twilio_transport(websocket) -> BaseTransport:
    """A Twilio media stream on an accepted FastAPI WebSocket (reads Twilio's ``start`` message)."""
    return twilio_transport_for(websocket, await twilio_start(websocket))


def twilio_transport_for(websocket, call) -> BaseTransport:
    """The transport of a Twilio stream whose ``start`` has been read (``call``: its call data).

    Unlike the runner's ``create_transport``, this works without Twilio credentials: hanging up
    the call at the end of the pipeline (``auto_hang_up``) needs them, so it is enabled only when
    ``TWILIO_ACCOUNT_SID`` and ``TWILIO_AUTH_TOKEN`` are set.
    """
    from pipecat.serializers.twilio import TwilioFrameSerializer
    from pipecat.transports.websocket.fastapi import FastAPIWebsocketParams, FastAPIWebsocketTransport

    sid, token = os.environ.get("TWILIO_ACCOUNT_SID", ""), os.environ.get("TWILIO_AUTH_TOKEN", "")
    serializer = TwilioFrameSerializer(
        stream_sid=call["stream_id"],
        call_sid=call["call_id"],
        account_sid=sid or None,
        auth_token=token or None,
        params=TwilioFrameSerializer.InputParams(auto_hang_up=bool(sid and token)),
    )
    params = FastAPIWebsocketParams(
        audio_in_enabled=True, audio_out_enabled=True, add_wav_header=False, serializer=serializer
    )
    return FastAPIWebsocketTransport(websocket=websocket, params=params)
