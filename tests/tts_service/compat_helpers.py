"""A real server that counts requests per path, for the compatible endpoints' client tests.

The Pipecat and LiveKit suites point their frameworks' own services at it by URL and check how
many connections (WebSocket handshakes are requests too) each service opened.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web

from support.tts_helpers import NO_ADMISSION_LIMIT, RunningServer, on_loopback
from tts_service.piper.runtime import PiperSynthesizer
from tts_service.piper.scheduler import PiperSchedulerOptions
from tts_service.server import Server, ServerConfig


@dataclass
class Counted:
    srv: RunningServer
    requests: dict[str, int] = field(default_factory=dict)  # path -> requests prepared

    @property
    def http_url(self) -> str:
        return self.srv.http_url

    @property
    def ws_base(self) -> str:
        return self.srv.http_url.replace("http://", "ws://")

    def sample(self, name: str, labels: dict[str, str] | None = None) -> int:
        """A counter of the server's Prometheus registry (0 when absent)."""
        return int(self.srv.server.synth.metrics.registry.get_sample_value(name, labels or {}) or 0)

    @property
    def cancels_acked(self) -> int:
        return self.sample("streamvox_cancel_ack_seconds_count")

    @property
    def streams_cancelled(self) -> int:
        return self.sample("streamvox_streams_total", {"status": "cancelled"})


@contextlib.asynccontextmanager
async def counted_server(engine, config: ServerConfig | None = None) -> AsyncIterator[Counted]:
    """A real server on loopback that counts the requests per path."""
    server = Server(
        PiperSynthesizer(engine, options=PiperSchedulerOptions(capacity=NO_ADMISSION_LIMIT)), config or ServerConfig()
    )
    requests: dict[str, int] = {}

    async def count(request: web.Request, _response: web.StreamResponse) -> None:
        requests[request.path] = requests.get(request.path, 0) + 1

    server.app.on_response_prepare.append(count)
    async with on_loopback(server.app) as (ws_url, http_url):
        yield Counted(RunningServer(server, ws_url, http_url), requests)
