"""The demo room's web app: the SmallWebRTC page and signalling, and the Twilio media-stream socket.

One FastAPI app, one port (7860 by default), one agent per browser session or phone call:

* ``GET /client/``: Pipecat's SmallWebRTC prebuilt page (``/`` redirects there). Its script
  POSTs ``/start`` (-> ``{"sessionId"}``), then the SDP offer to ``/sessions/{id}/api/offer``
  and ICE candidates with ``PATCH`` on the same path; ``/api/offer`` takes them directly (what
  a script or an aiortc client uses).
* ``WS /ws``: a Twilio ``<Connect><Stream>`` media stream (``pipelines.pipecat_agent`` has the
  TwiML).

Same routes as Pipecat's development runner, which this replaces so that the agent, its figures
and its shutdown stay under our control (the runner keeps its app in module globals).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, WebSocket  # module level: FastAPI resolves annotations here
from fastapi.responses import JSONResponse, RedirectResponse, Response
from loguru import logger
from pipecat.transports.base_transport import TransportParams
from pipecat.transports.smallwebrtc.connection import SmallWebRTCConnection
from pipecat.transports.smallwebrtc.request_handler import (
    IceCandidate,
    SmallWebRTCPatchRequest,
    SmallWebRTCRequest,
    SmallWebRTCRequestHandler,
)
from pipecat.transports.smallwebrtc.transport import SmallWebRTCTransport
from pipecat.workers.runner import WorkerRunner

from pipelines.pipecat_agent import Agent, AgentConfig, build_agent, twilio_transport


def build_room_app(config: AgentConfig, *, on_agent: Callable[[Agent], None] | None = None) -> FastAPI:
    """The app; ``on_agent`` sees every agent created (tests and figures use it)."""
    handler = SmallWebRTCRequestHandler()
    sessions: dict[str, dict] = {}
    tasks: set[asyncio.Task] = set()

    async def run(agent: Agent) -> None:
        if on_agent is not None:
            on_agent(agent)
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(agent.worker)
        await runner.run()

    def start_agent(agent: Agent) -> None:
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
    try:
        from pipecat_ai_small_webrtc_prebuilt.frontend import SmallWebRTCPrebuiltUI

        app.mount("/client", SmallWebRTCPrebuiltUI)
    except ImportError:  # the page is optional; signalling works without it
        logger.warning("pipecat-ai-small-webrtc-prebuilt is not installed: no page at /client")

    @app.get("/", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse(url="/client/")

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
            start_agent(build_agent(transport, config, phone=False))

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

    @app.post("/api/offer")
    async def post_offer(request: Request):
        return await offer(await request.json())

    @app.patch("/api/offer")
    async def patch_offer(request: Request):
        return await candidates(await request.json())

    @app.api_route("/sessions/{session_id}/{path:path}", methods=["GET", "POST", "PATCH"])
    async def session_route(session_id: str, path: str, request: Request):
        if session_id not in sessions:
            return Response(content="unknown session id; POST /start first", status_code=404)
        if not path.endswith("api/offer"):
            return Response(status_code=200)
        data = await request.json()
        return JSONResponse(await offer(data) if request.method == "POST" else await candidates(data))

    @app.websocket("/ws")
    async def phone(websocket: WebSocket) -> None:
        await websocket.accept()
        transport = await twilio_transport(websocket)
        await run(build_agent(transport, config, phone=True))

    return app
