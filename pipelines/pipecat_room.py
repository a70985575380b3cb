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
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Protocol

from fastapi import FastAPI, Request, WebSocket  # module level: FastAPI resolves annotations here
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
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

from agent.webrtc_uplink import release_audio_sooner

WEB_DIR = Path(__file__).resolve().parent / "web"  # shipped as package data (pyproject.toml)


class RoomAgent(Protocol):
    """What the room needs of an agent: a pipeline worker to run until the call ends."""

    @property
    def worker(self): ...


# (transport, phone) -> agent; ``phone``: the transport is an 8 kHz phone line
AgentFactory = Callable[[BaseTransport, bool], RoomAgent]


def build_room_app(make_agent: AgentFactory, *, on_agent: Callable[[RoomAgent], None] | None = None) -> FastAPI:
    """The app; ``on_agent`` sees every agent created (tests and figures use it)."""
    if not (WEB_DIR / "index.html").is_file():
        raise FileNotFoundError(f"the demo page is missing ({WEB_DIR}/index.html): reinstall streamvox")
    release_audio_sooner()  # the caller's voice reaches the agent sooner, and stays prompt (agent.webrtc_uplink)
    handler = SmallWebRTCRequestHandler()
    sessions: dict[str, dict] = {}
    tasks: set[asyncio.Task] = set()

    async def run(agent: RoomAgent) -> None:
        if on_agent is not None:
            on_agent(agent)
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(agent.worker)
        await runner.run()

    def start_agent(agent: RoomAgent) -> None:
        task = asyncio.create_task(run(agent))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await handler.close()

    app = FastAPI(lifespan=lifespan)
    app.mount("/assets", StaticFiles(directory=WEB_DIR), name="assets")

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        # no-cache: a page kept from an older run would speak an older protocol to this agent
        return FileResponse(WEB_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/client/", include_in_schema=False)
    @app.get("/client", include_in_schema=False)
    async def old_page() -> RedirectResponse:
        return RedirectResponse(url="/")

    @app.post("/start")
    async def start(request: Request) -> dict:
        try:
            body = await request.json()
        except ValueError:
            body = {}
        session_id = str(uuid.uuid4())
        sessions[session_id] = body.get("body", {}) if isinstance(body, dict) else {}
        return {"sessionId": session_id}

    async def offer(data: dict) -> dict | None:
        async def connected(connection: SmallWebRTCConnection) -> None:
            params = TransportParams(audio_in_enabled=True, audio_out_enabled=True)
            transport = SmallWebRTCTransport(webrtc_connection=connection, params=params)
            start_agent(make_agent(transport, False))

        request = SmallWebRTCRequest(
            sdp=data["sdp"], type=data["type"], pc_id=data.get("pc_id"), restart_pc=data.get("restart_pc")
        )
        return await handler.handle_web_request(request=request, webrtc_connection_callback=connected)

    async def candidates(data: dict) -> dict:
        patch = SmallWebRTCPatchRequest(
            pc_id=data["pc_id"], candidates=[IceCandidate(**c) for c in data.get("candidates", [])]
        )
        await handler.handle_patch_request(patch)
        return {"status": "success"}

    async def signalling(request: Request, patch: bool) -> Response:
        """Offer or candidates; malformed input is a 400 with the reason, not a traceback."""
        try:
            data = await request.json()
            if not isinstance(data, dict):
                raise ValueError("the body must be a JSON object")
            return JSONResponse(await candidates(data) if patch else await offer(data))
        except (ValueError, KeyError, TypeError) as exc:
            what = "candidates (pc_id, candidates)" if patch else "an SDP offer (sdp, type)"
            return JSONResponse({"error": f"expected {what}: {exc!r}"}, status_code=400)

    @app.post("/api/offer")
    async def post_offer(request: Request):
        return await signalling(request, patch=False)

    @app.patch("/api/offer")
    async def patch_offer(request: Request):
        return await signalling(request, patch=True)

    @app.api_route("/sessions/{session_id}/{path:path}", methods=["GET", "POST", "PATCH"])
    async def session_route(session_id: str, path: str, request: Request):
        if session_id not in sessions:
            return JSONResponse({"error": "unknown session id; POST /start first"}, status_code=404)
        if not path.endswith("api/offer"):
            return Response(status_code=200)
        return await signalling(request, patch=request.method == "PATCH")

    @app.websocket("/ws")
    async def phone(websocket: WebSocket) -> None:
        await websocket.accept()
        transport = await twilio_transport(websocket)
        await run(make_agent(transport, True))

    return app


async def twilio_transport(websocket) -> BaseTransport:
    """A Twilio media stream on an accepted FastAPI WebSocket (reads Twilio's ``start`` message).

    Unlike the runner's ``create_transport``, this works without Twilio credentials: hanging up
    the call at the end of the pipeline (``auto_hang_up``) needs them, so it is enabled only when
    ``TWILIO_ACCOUNT_SID`` and ``TWILIO_AUTH_TOKEN`` are set.
    """
    from pipecat.runner.utils import parse_telephony_websocket
    from pipecat.serializers.twilio import TwilioFrameSerializer
    from pipecat.transports.websocket.fastapi import FastAPIWebsocketParams, FastAPIWebsocketTransport

    kind, call = await parse_telephony_websocket(websocket)
    if kind != "twilio":
        raise ValueError(f"this endpoint speaks Twilio media streams; the caller looks like {kind!r}")
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
