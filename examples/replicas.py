"""Speak through a set of streamvox replicas: placement by load, failover, drain between turns.

Start three servers, then run this (each turn prints the replica that served it)::

    streamvox serve --port 8765 & streamvox serve --port 8766 & streamvox serve --port 8767 &
    python examples/replicas.py

In Kubernetes, give one URL whose host name is the headless Service (deploy/k8s/services.yaml)
and ``discover=True``: every A/AAAA record is a replica. Stop one server (Ctrl-C or SIGTERM)
while this runs: its turn in progress finishes, and the next turns go to the others.

While the replica it connected to stays up, every turn goes there: the client keeps one connection and
places a new one (on the replica with the lower ``/readyz`` load) only when that replica drains or
fails. (8766 is also ``pipelines.local_llm``'s default port: do not run both.)
"""

import asyncio
import time

from tts_service.client import AudioFrame, TTSClient, TTSError

REPLICAS = [f"ws://127.0.0.1:{port}/v1/stream" for port in (8765, 8766, 8767)]
TURNS = ["Hello, thanks for calling.", "Let me check that for you.", "Your order ships tomorrow."] * 3


async def main() -> None:
    async with TTSClient(REPLICAS) as client:  # or TTSClient("ws://streamvox-replicas:8765/v1/stream", discover=True)
        for text in TURNS:
            t0 = time.perf_counter()
            try:
                ctx = await client.open(text=text)
                await ctx.end()
                audio_s = sum([item.duration_s async for item in ctx if isinstance(item, AudioFrame)])
            except TTSError as exc:  # a replica died mid-turn: the turn is lost, never replayed
                print(f"turn failed: {exc}")
                continue
            wall = time.perf_counter() - t0
            print(f"{audio_s:.1f} s of audio in {wall:.1f} s from {ctx.replica_url}")


if __name__ == "__main__":
    asyncio.run(main())
