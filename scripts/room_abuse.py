"""What junk does to the demo room: N junk offers, N text/plain posts and N idle phone sockets,
then the room's memory (RSS), its asyncio tasks and the agents it built, before and after each
round (the first round raises the allocator's high-water mark; later rounds show what is kept).

    .venv/bin/python scripts/room_abuse.py [--n 1000] [--rounds 3] [--json out/room_abuse.json]

The room (``pipelines.pipecat_agent.room_app``) runs in a child process of its own (its RSS is
the room's alone) under uvicorn on loopback, with its default limits but a 2 s deadline for
Twilio's ``start`` (so that the sockets are reaped within the run); no agent may be built, so no
TTS server or LLM is started. Issue 22 saw
10 junk offers build 10 agents and take memory from 191 to 485 MB; the figures belong in
docs/BENCHMARKS.md with the command and the load.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def serve(port: int) -> None:
    """The room alone, in this process (the measured one), with a route that counts its tasks."""
    import uvicorn

    from pipelines.pipecat_agent import AgentConfig, room_app
    from pipelines.room_limits import RoomLimits

    agents: list = []
    config = AgentConfig(tts_url="ws://127.0.0.1:9/v1/stream", llm_base_url="http://127.0.0.1:9/v1")
    config.room = RoomLimits(ws_start_timeout_s=2.0, max_waiting_sockets=100_000)  # to measure holding them all
    app = room_app(config, on_agent=agents.append)

    @app.get("/_probe")
    async def probe() -> dict:
        gc.collect()
        return {"tasks": len(asyncio.all_tasks()), "agents": len(agents)}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error")


async def main(n: int, rounds: int) -> dict:
    import aiohttp
    import websockets

    from tts_service.localproc import ChildServer, free_port

    port = free_port()
    room = ChildServer([__file__, "--serve", str(port)], what="the room", port=port, ready_path="/healthz")
    await asyncio.to_thread(room.start, 120)
    base = f"http://127.0.0.1:{port}"
    statuses: dict[str, int] = {}
    try:
        async with aiohttp.ClientSession() as http:

            async def post(kind: str, **kw) -> None:
                async with http.post(f"{base}/api/offer", **kw) as resp:
                    await resp.read()
                    statuses[f"{kind} {resp.status}"] = statuses.get(f"{kind} {resp.status}", 0) + 1

            async def state() -> dict:
                async with http.get(f"{base}/_probe") as resp:
                    return {"rss_mb": round(rss_mb(room.proc.pid), 1), **(await resp.json())}

            await post("warm-up", json={"sdp": "x", "type": "offer"})  # first-request imports and caches
            before = await state()
            rounds_out = []
            t0 = time.monotonic()
            for _round in range(rounds):
                for i in range(0, n, 50):
                    batch = range(i, min(n, i + 50))
                    await asyncio.gather(*(post("junk offer", json={"sdp": "x", "type": "offer"}) for _ in batch))
                    body = '{"sdp": "x", "type": "offer"}'
                    plain = {"Content-Type": "text/plain"}
                    await asyncio.gather(*(post("text/plain", data=body, headers=plain) for _ in batch))
                after_junk = await state()
                sockets = []
                for i in range(0, n, 100):
                    batch = range(i, min(n, i + 100))
                    sockets += await asyncio.gather(*(websockets.connect(f"ws://127.0.0.1:{port}/ws") for _ in batch))
                peak = await state()
                closed = 0
                for ws in sockets:
                    try:
                        await asyncio.wait_for(ws.recv(), 10)
                    except websockets.ConnectionClosed as exc:
                        closed += exc.rcvd is not None and exc.rcvd.code == 1008
                del sockets
                await asyncio.sleep(1.0)
                rounds_out.append(
                    {
                        "after_junk": after_junk,
                        "sockets_open": peak,
                        "after": await state(),
                        "idle_sockets_closed_by_the_room": closed,
                    }
                )
            elapsed = time.monotonic() - t0
    finally:
        room.stop()
    return {
        "n": n,
        "load_1min": round(os.getloadavg()[0], 2),
        "before": before,
        "rounds": rounds_out,
        "statuses": statuses,
        "seconds": round(elapsed, 1),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3, help="repeat; RSS flat across rounds = nothing kept")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the measured room (a child)
    args = parser.parse_args()
    os.environ.setdefault("LOGURU_LEVEL", "ERROR")
    if args.serve:
        serve(args.serve)
        sys.exit(0)
    result = asyncio.run(main(args.n, args.rounds))
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
