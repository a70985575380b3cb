"""First audio through each compatible endpoint vs ``/v1/stream``, in the same run (issue 20).

    .venv/bin/python scripts/compat_first_audio.py                 # 20 rounds, ~1 min
    .venv/bin/python scripts/compat_first_audio.py --rounds 40 --json out/compat_first_audio.json

One streamvox server runs as its own process on loopback (``streamvox serve``, as in production).
Each round sends the same text once to each endpoint, in a shuffled order, one request at a
time, every endpoint at 24 kHz 16-bit PCM (OpenAI's only rate), each over a connection already
open (a WebSocket, or an HTTP keep-alive connection): the figure is the time from sending the
text to receiving its first audio byte, as each API's client sees it on the wire:

* ``/v1/stream``: ``start`` with the text, then ``end`` -> the first binary frame;
* ``/v1/audio/speech``: the POST (``response_format: pcm``) -> the first body chunk;
* ``/tts/websocket``: a generation request with ``continue: false`` -> the first ``chunk``;
* ``multi-stream-input``: the text with ``flush: true`` -> the first message with ``audio``.

After its first audio each request is cancelled (``cancel``, a closed response,
``close_context``) and the next waits for the server to be idle (``/readyz``), so no request
runs beside another one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tts_service.localproc import ChildServer

TEXT = "Sure, I can help with that. Your order shipped yesterday and should arrive on Friday."
RATE = 24000


class Endpoints:
    """One open connection per endpoint; each ``*_first`` returns seconds to the first audio."""

    def __init__(self, http: aiohttp.ClientSession, base: str) -> None:
        self.http, self.base = http, base
        self.ws_base = base.replace("http://", "ws://")
        self.n = 0

    async def open(self) -> None:
        self.stream = await self.http.ws_connect(self.ws_base + "/v1/stream")
        await self.stream.receive()  # ready
        self.cartesia = await self.http.ws_connect(self.ws_base + "/tts/websocket")
        self.eleven = await self.http.ws_connect(
            self.ws_base + f"/v1/text-to-speech/bench/multi-stream-input?model_id=x&output_format=pcm_{RATE}"
        )

    async def close(self) -> None:
        for ws in (self.stream, self.cartesia, self.eleven):
            await ws.close()

    def _id(self) -> str:
        self.n += 1
        return f"r{self.n}"

    async def stream_first(self) -> float:
        ctx = self._id()
        t0 = time.perf_counter()
        await self.stream.send_json({"type": "start", "context_id": ctx, "sample_rate": RATE, "text": TEXT})
        await self.stream.send_json({"type": "end", "context_id": ctx})
        while (await self.stream.receive()).type != aiohttp.WSMsgType.BINARY:
            pass  # started, words
        dt = time.perf_counter() - t0
        await self.stream.send_json({"type": "cancel", "context_id": ctx})
        while True:  # frames sent before the cancel, then its ack
            msg = await self.stream.receive()
            if msg.type == aiohttp.WSMsgType.TEXT and json.loads(msg.data)["type"] == "cancelled":
                return dt

    async def openai_first(self) -> float:
        body = {"model": "tts-1", "voice": "alloy", "input": TEXT, "response_format": "pcm"}
        t0 = time.perf_counter()
        async with self.http.post(self.base + "/v1/audio/speech", json=body) as resp:
            await resp.content.readany()
            dt = time.perf_counter() - t0
            resp.close()  # hang up: the server cancels the rest
        return dt

    async def cartesia_first(self) -> float:
        ctx = self._id()
        fmt = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": RATE}
        msg = {"context_id": ctx, "transcript": TEXT, "continue": False, "voice": {"mode": "id", "id": "x"}}
        t0 = time.perf_counter()
        await self.cartesia.send_json(msg | {"output_format": fmt, "model_id": "sonic"})
        while not _is(json.loads((await self.cartesia.receive()).data), "context_id", ctx, "data"):
            pass  # timestamps, and chunks of the previous round sent before its cancel
        dt = time.perf_counter() - t0
        await self.cartesia.send_json({"context_id": ctx, "cancel": True})
        return dt

    async def elevenlabs_first(self) -> float:
        ctx = self._id()
        t0 = time.perf_counter()
        await self.eleven.send_json({"text": TEXT, "context_id": ctx, "flush": True})
        while not _is(json.loads((await self.eleven.receive()).data), "contextId", ctx, "audio"):
            pass
        dt = time.perf_counter() - t0
        await self.eleven.send_json({"context_id": ctx, "close_context": True})
        while not _is(json.loads((await self.eleven.receive()).data), "contextId", ctx, "isFinal"):
            pass
        return dt


def _is(msg: dict, id_key: str, ctx: str, field: str) -> bool:
    return msg.get(id_key) == ctx and bool(msg.get(field))


async def idle(http: aiohttp.ClientSession, base: str) -> None:
    """Wait until the server runs no stream (the previous request's cancel has landed)."""
    for _ in range(200):
        async with http.get(base + "/readyz") as resp:
            if (await resp.json())["active_streams"] == 0:
                return
        await asyncio.sleep(0.01)


async def run(base: str, rounds: int, seed: int) -> dict[str, list[float]]:
    rng = random.Random(seed)
    async with aiohttp.ClientSession() as http:
        ep = Endpoints(http, base)
        await ep.open()
        kinds: dict[str, Callable[[], Awaitable[float]]] = {
            "/v1/stream": ep.stream_first,
            "/v1/audio/speech": ep.openai_first,
            "/tts/websocket": ep.cartesia_first,
            "multi-stream-input": ep.elevenlabs_first,
        }
        for fn in kinds.values():  # warm-up: the first request of each path pays one-time costs
            await fn()
            await idle(http, base)
        got: dict[str, list[float]] = {k: [] for k in kinds}
        for _ in range(rounds):
            order = list(kinds)
            rng.shuffle(order)
            for kind in order:
                got[kind].append(await kinds[kind]())
                await idle(http, base)
        await ep.close()
    return got


def table(got: dict[str, list[float]]) -> str:
    """Medians, p90, and the median of the per-round differences to ``/v1/stream`` (the same
    round: the same machine load), which is steadier than a difference of medians."""
    ref = got["/v1/stream"]
    lines = [
        "| endpoint | first audio, median | p90 | median of (it − /v1/stream), per round |",
        "|---|---:|---:|---:|",
    ]
    for kind, xs in got.items():
        ordered = sorted(xs)
        med, p90 = statistics.median(xs), ordered[min(len(xs) - 1, int(0.9 * len(xs)))]
        diff = statistics.median(x - r for x, r in zip(xs, ref, strict=True))
        lines.append(f"| `{kind}` | {1000 * med:.1f} ms | {1000 * p90:.1f} ms | {1000 * diff:+.1f} ms |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None, help="write the raw figures (seconds) here")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    with ChildServer.tts() as server:
        got = asyncio.run(run(server.base, args.rounds, args.seed))
    print(table(got))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rounds": args.rounds, "text": TEXT, "seconds": got}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
