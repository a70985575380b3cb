"""Next-turn TTFB right after a cancel, with and without aborting the orphaned batch.

A voice agent cancels the bot's reply (barge-in) and immediately starts the next one on the same
connection. If the worker is still computing the cancelled stream's window, the next turn's
first audio waits for it; the runtime aborts a running batch whose streams were all cancelled
(onnxruntime ``RunOptions.terminate``). This script measures both ways on one in-process server.

    .venv/bin/python scripts/next_turn_after_cancel.py 1    # with the abort (the default server)
    .venv/bin/python scripts/next_turn_after_cancel.py 0    # abort disabled, for comparison
"""

import asyncio
import statistics
import sys
import time

from aiohttp import web

from tts_service.client import AudioFrame, TTSClient
from tts_service.localproc import free_port
from tts_service.piper.runtime import PiperSynthesizer
from tts_service.piper.scheduler import PiperSchedulerOptions
from tts_service.piper.serve import load_piper_engine
from tts_service.server import Server

LONG = "This is a long answer that the caller will interrupt. " + (
    "It goes on with many more words about the weather, the traffic and the news of the day, without a pause, " * 3
)


async def trial(client: TTSClient) -> float:
    ctx = await client.open(text=LONG, pace=True)
    await ctx.end()
    n = 0
    async for item in ctx:
        if isinstance(item, AudioFrame):
            n += 1
            if n == 8:  # the caller barges in about a third of a second into the reply
                break
    await ctx.cancel()
    t0 = time.perf_counter()
    nxt = await client.open(text="Sure, what else?")
    await nxt.end()
    ttfb = float("nan")
    async for item in nxt:
        if isinstance(item, AudioFrame):
            ttfb = 1000 * (time.perf_counter() - t0)
            break
    await nxt.cancel()
    return ttfb


async def main(abort: bool, trials: int = 12) -> None:
    synth = PiperSynthesizer(
        load_piper_engine([], progress=lambda *_: None), options=PiperSchedulerOptions(capacity=1000)
    )
    if not abort:
        synth._abort_if_orphaned = lambda: None
    runner = web.AppRunner(Server(synth).app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    async with TTSClient(f"ws://127.0.0.1:{port}/v1/stream") as client:
        xs = [await trial(client) for _ in range(trials)]
    print(
        f"abort {'on' if abort else 'off'}: next-turn TTFB median {statistics.median(xs):.0f} ms, "
        f"max {max(xs):.0f} ms over {trials} trials; batches aborted {synth.metrics.batches_aborted._value.get():.0f}"
    )
    await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:2] != ["0"]))
