"""deploy/haproxy/haproxy.cfg run for real: two replicas on loopback, each with the agent-check
responder, HAProxy in front. WebSockets pass through, and a draining replica gets no new ones.

The config is the shipped one with only its addresses rewritten (frontend port, the two servers
and their agent ports), so a change to the shipped balancing or checks is what runs here.
"""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path

import pytest

from support.tts_helpers import running_server
from tts_service.client import AudioFrame, TTSClient
from tts_service.haproxy_agent import Agent
from tts_service.localproc import free_port

CFG = Path(__file__).resolve().parents[2] / "deploy" / "haproxy" / "haproxy.cfg"
HAPROXY = shutil.which("haproxy")

pytestmark = pytest.mark.skipif(HAPROXY is None, reason="haproxy is not installed (apt-get install haproxy)")


def local_config(front: int, backends: list[tuple[int, int]]) -> str:
    text = CFG.read_text()
    text = re.sub(r"^(\s*)bind :\d+$", rf"\1bind 127.0.0.1:{front}", text, count=1, flags=re.M)
    text = re.sub(r"^\s*server .*\n", "", text, flags=re.M)
    lines = "".join(
        f"    server tts{i} 127.0.0.1:{port} agent-port {agent}\n" for i, (port, agent) in enumerate(backends)
    )
    return text.rstrip("\n") + "\n" + lines


async def _speak(url: str) -> tuple[TTSClient, int]:
    client = TTSClient(url, connect_attempts=1)  # one try: a connection sent to a draining replica would fail
    try:
        ctx = await client.open(text="Through the load balancer.", pace=False)
        await ctx.end()
        frames = [item async for item in ctx if isinstance(item, AudioFrame)]
    except BaseException:
        await client.close()
        raise
    return client, len(frames)


async def test_websockets_pass_through_and_a_draining_replica_gets_no_new_ones(engine, tmp_path) -> None:
    async with running_server(engine) as one, running_server(engine) as two:
        agents = [Agent(srv.http_url) for srv in (one, two)]
        listeners = [await agent.start("127.0.0.1", 0) for agent in agents]
        front = free_port()
        backends = [
            (int(srv.http_url.rsplit(":", 1)[1]), listener.sockets[0].getsockname()[1])
            for srv, listener in zip((one, two), listeners)
        ]
        cfg = tmp_path / "haproxy.cfg"
        cfg.write_text(local_config(front, backends))
        proc = await asyncio.create_subprocess_exec(
            HAPROXY, "-db", "-f", str(cfg), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        url = f"ws://127.0.0.1:{front}/v1/stream"
        clients: list[TTSClient] = []
        try:
            # both servers up (health check rise 2 x inter 2 s), agent weights read
            for _ in range(100):
                try:
                    client, frames = await _speak(url)
                    clients.append(client)
                    break
                except Exception:
                    await asyncio.sleep(0.2)
            assert clients and frames > 0, "no audio through HAProxy"
            await asyncio.sleep(4.5)  # let the second server rise too

            one.server.start_drain(timeout_s=30)  # its live connection finishes; no new ones
            await asyncio.sleep(2.5)  # agent-inter 1 s: the agent has answered "drain"
            before = len(two.server._connections)
            more = await asyncio.gather(*(_speak(url) for _ in range(3)))
            clients += [c for c, _ in more]
            assert all(n > 0 for _, n in more)
            assert all(c.connections == 1 for c, _ in more), "a connection was refused and retried"
            assert len(two.server._connections) - before == 3
        finally:
            await asyncio.gather(*(c.close() for c in clients))
            proc.terminate()
            out = (await asyncio.wait_for(proc.communicate(), 10))[0].decode(errors="replace")
            for listener in listeners:
                listener.close()
            for agent in agents:
                await agent.aclose()
        assert "ALERT" not in out, out[-2000:]
