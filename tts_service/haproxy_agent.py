"""HAProxy agent-check responder: tells HAProxy how loaded the streamvox replica beside it is.

HAProxy's ``agent-check`` opens a TCP connection to ``agent-port`` every ``agent-inter`` and
reads one line. This answers, from the replica's own ``/readyz``:

* ``ready up N%`` - accepting; the weight N is the unused share of its capacity (1..100), so
  ``balance leastconn`` prefers emptier replicas even when connection counts are equal (a
  connection can carry many contexts, so counts alone say little);
* ``drain`` - full or draining: no new connections, the live ones go on (WebSocket contexts finish);
* ``down`` - ``/readyz`` unreachable.

Run it beside each replica (the image has it)::

    python -m tts_service.haproxy_agent --listen 0.0.0.0:8766 --server http://127.0.0.1:8765

and see ``deploy/haproxy/haproxy.cfg``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys

import aiohttp

from .readiness import READYZ_PATH, readiness

log = logging.getLogger(__name__)


def agent_reply(status: int | None, body: object) -> str:
    """The agent-check line for one ``/readyz`` answer (``status`` None: unreachable)."""
    if status is None:
        return "down\n"
    r = readiness(status, body)
    if not r.accepting:
        return "drain\n"
    weight = max(1, min(100, round(100 * (1.0 - r.load))))
    return f"ready up {weight}%\n"


class Agent:
    """One responder for one replica; ``serve()`` runs until cancelled."""

    def __init__(self, server_url: str, *, timeout_s: float = 0.5) -> None:
        self.readyz_url = server_url.rstrip("/") + READYZ_PATH
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def probe(self) -> str:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        try:
            async with self._session.get(self.readyz_url) as resp:
                try:
                    body = await resp.json(content_type=None)
                except ValueError:
                    body = None
                return agent_reply(resp.status, body)
        except (aiohttp.ClientError, OSError, TimeoutError):
            return agent_reply(None, None)

    async def _answer(self, _reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write((await self.probe()).encode("ascii"))
            await writer.drain()
        except (ConnectionError, OSError):
            pass  # HAProxy gave up on this check; the next one comes in agent-inter
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    async def start(self, host: str, port: int) -> asyncio.Server:
        return await asyncio.start_server(self._answer, host, port)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host or "0.0.0.0", int(port)


async def _run(args: argparse.Namespace) -> None:
    agent = Agent(args.server, timeout_s=args.timeout)
    host, port = args.listen
    server = await agent.start(host, port)
    print(f"streamvox agent-check on {host}:{port} reading {agent.readyz_url}", flush=True)
    try:
        async with server:
            await server.serve_forever()
    finally:
        await agent.aclose()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tts_service.haproxy_agent", description=__doc__.split("\n")[0])
    p.add_argument("--listen", type=_host_port, default=("0.0.0.0", 8766), help="HOST:PORT (default 0.0.0.0:8766)")
    p.add_argument("--server", default="http://127.0.0.1:8765", help="the replica's HTTP base URL")
    p.add_argument("--timeout", type=float, default=0.5, help="seconds to wait for /readyz")
    args = p.parse_args(argv)
    try:
        asyncio.run(_run(args))
    except OSError as exc:
        host, port = args.listen
        print(f"streamvox agent-check: cannot listen on {host}:{port}: {exc.strerror}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
