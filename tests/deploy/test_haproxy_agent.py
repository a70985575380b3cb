"""The HAProxy agent-check responder against a real server: the line HAProxy reads."""

from __future__ import annotations

import asyncio

import pytest

from tts_service.haproxy_agent import Agent, agent_reply
from tts_service.localproc import free_port


async def _ask(port: int) -> str:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        return (await asyncio.wait_for(reader.read(100), 5)).decode("ascii")
    finally:
        writer.close()
        await writer.wait_closed()


async def test_an_idle_replica_is_ready_with_full_weight(deploy_server) -> None:
    agent = Agent(deploy_server.http_url)
    server = await agent.start("127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        assert await _ask(port) == "ready up 100%\n"
        assert await _ask(port) == "ready up 100%\n"  # one answer per connection, as HAProxy asks
    finally:
        server.close()
        await server.wait_closed()
        await agent.aclose()


async def test_an_unreachable_replica_is_down() -> None:
    agent = Agent(f"http://127.0.0.1:{free_port()}")
    try:
        assert await agent.probe() == "down\n"
    finally:
        await agent.aclose()


@pytest.mark.parametrize(
    ("status", "body", "line"),
    [
        (200, {"ready": True, "load": 0.25, "capacity_streams": 8}, "ready up 75%\n"),
        # today's server: load is its own share (streamvox_load), beside busy_streams
        (200, {"ready": True, "load": 0, "busy_streams": 0, "capacity_streams": 4}, "ready up 100%\n"),
        (200, {"ready": True, "load": 0.5, "busy_streams": 2, "capacity_streams": 4}, "ready up 50%\n"),
        (200, {"ready": True, "load": 2, "capacity_streams": 8, "active_streams": 3}, "ready up 75%\n"),
        (200, {"ready": True, "load": 0.999, "capacity_streams": 8}, "ready up 1%\n"),  # never weight 0 while ready
        (503, {"ready": False, "load": 8, "capacity_streams": 8}, "drain\n"),  # full
        (503, {"ready": False, "draining": True}, "drain\n"),
        (200, {"ready": True, "draining": True}, "drain\n"),
        (500, "not json", "drain\n"),
    ],
)
def test_replies_follow_readyz(status: int, body: object, line: str) -> None:
    assert agent_reply(status, body) == line
