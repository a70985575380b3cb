"""Next-turn TTFB after an interruption: pooled persistent connection vs a fresh one per stream.

    .venv/bin/python -m tests.livekit.measure_ttfb [--trials 10] [--rtt-ms 0 40] [--gap-s 0 1]

The TTS server runs as its own process, as in a deployment. For each
network round-trip time (0 = loopback; otherwise an in-process TCP proxy delays each direction
by half of it, the TCP handshake included) and each mode, a trial is:

1. turn A: a long reply is streamed until 0.4 s of audio has arrived, then ``aclose()`` - what
   the AgentSession does on barge-in;
2. turn B, ``gap`` seconds later: a new stream gets the next reply's text (the LLM's tokens are
   already there); its TTFB is stream creation -> first audio frame, as the caller would hear it.
   ``gap`` 0 is the worst case (B lands while the server still finishes A's in-flight batch);
   1 s is closer to a conversation (the caller talks, Whisper transcribes, the LLM starts).

Modes alternate trial by trial, so both see the same server and machine state. ``pooled`` is
``StreamvoxTTS()`` (cancel + ack on the kept socket); ``fresh`` is
``StreamvoxTTS(persistent_connection=False)``: a socket per stream, closed on interruption, as
LiveKit's reference plug-ins end up doing. Cancel->ack is the pooled mode's gate -> server ack.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from agent.livekit import CancelReport, StreamvoxTTS
from tts_service import protocol as P
from tts_service.localproc import ChildServer

LONG = (
    "Let me explain this in some detail, because there is a lot to say. The first thing you should "
    "know is that the process has several steps, and each of them takes a while."
)
NEXT = "Sure, go ahead."


@dataclass
class Samples:
    ttfb_s: list[float] = field(default_factory=list)
    acquire_s: list[float] = field(default_factory=list)
    aclose_s: list[float] = field(default_factory=list)
    reused: int = 0


@contextlib.asynccontextmanager
async def server_process() -> AsyncIterator[int]:
    """`streamvox serve` with admission control off (``--capacity 1000``): under this barge-in-only
    load (every stream cut after its first windows) the measured cost would otherwise refuse even
    an idle server, which is not what we measure here."""
    server = ChildServer.tts(extra=["--capacity", "1000"], output="quiet")
    await asyncio.to_thread(server.start, 30.0)
    try:
        yield server.port
    finally:
        await asyncio.to_thread(server.stop)


@contextlib.asynccontextmanager
async def delay_proxy(upstream: int, rtt_s: float) -> AsyncIterator[int]:
    """A TCP proxy adding ``rtt_s / 2`` each way (and one RTT before the first byte: the handshake)."""
    loop = asyncio.get_running_loop()
    one_way = rtt_s / 2

    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def read() -> None:
            while data := await src.read(65536):
                queue.put_nowait((loop.time() + one_way, data))
            queue.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (item := await queue.get()) is not None:
                await asyncio.sleep(max(0.0, item[0] - loop.time()))
                dst.write(item[1])
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            reader.cancel()
            dst.close()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(rtt_s)  # SYN / SYN-ACK
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def trial(tts: StreamvoxTTS, out: Samples, gap_s: float = 0.0) -> None:
    a = tts.stream()
    a.push_text(LONG)
    a.end_input()
    heard = 0.0
    async for ev in a:
        heard += ev.frame.duration
        if heard >= 0.4:
            break
    t0 = time.perf_counter()
    await a.aclose()
    out.aclose_s.append(time.perf_counter() - t0)
    await asyncio.sleep(gap_s)

    t1 = time.perf_counter()
    b = tts.stream()
    b.push_text(NEXT)
    b.end_input()
    async for _ in b:
        out.ttfb_s.append(time.perf_counter() - t1)
        break
    out.acquire_s.append(b._acquire_time)
    out.reused += bool(b._connection_reused)
    await b.aclose()


def _ms(values: list[float]) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return f"{statistics.median(values) * 1000:6.1f} / {p90 * 1000:6.1f}"


async def measure(port: int, rtt_ms: float, gap_s: float, trials: int) -> None:
    async with contextlib.AsyncExitStack() as stack:
        if rtt_ms > 0:
            port = await stack.enter_async_context(delay_proxy(port, rtt_ms / 1000))
        url = f"ws://127.0.0.1:{port}{P.WS_PATH}"
        pooled, fresh = StreamvoxTTS(url=url), StreamvoxTTS(url=url, persistent_connection=False)
        cancels: list[CancelReport] = []
        pooled.on("stream_cancelled", cancels.append)
        results = {"pooled": Samples(), "fresh": Samples()}
        try:
            pooled.prewarm()
            await trial(pooled, Samples())  # warm-up of both paths (first-use costs), not counted
            await trial(fresh, Samples())
            cancels.clear()
            for _ in range(trials):
                for name, tts in (("pooled", pooled), ("fresh", fresh)):
                    await trial(tts, results[name], gap_s)
                    await asyncio.sleep(0.3)  # let the server go idle between trials
            sockets = pooled.connections_opened
        finally:
            await pooled.aclose()
            await fresh.aclose()
        acked = [c.latency_s for c in cancels if c.acked]
        print(f"\nRTT {rtt_ms:g} ms, next turn {gap_s:g} s after the interruption, {trials} trials per mode")
        print("  (median / p90, ms)")
        print(f"  {'mode':7} {'next-turn TTFB':>16} {'acquire':>16} {'aclose()':>16}  reused")
        for name, s in results.items():
            print(f"  {name:7} {_ms(s.ttfb_s):>16} {_ms(s.acquire_s):>16} {_ms(s.aclose_s):>16}  {s.reused}/{trials}")
        print(f"  cancel->ack (pooled, gate -> ack): {_ms(acked)}  ({len(acked)}/{len(cancels)} acked)")
        print(f"  sockets opened by the pooled TTS: {sockets}; by the fresh one: {2 * trials + 2}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--rtt-ms", type=float, nargs="+", default=[0.0, 40.0])
    parser.add_argument("--gap-s", type=float, nargs="+", default=[0.0, 1.0])
    args = parser.parse_args()
    async with server_process() as port:
        for rtt in args.rtt_ms:
            for gap in args.gap_s:
                await measure(port, rtt, gap, args.trials)


if __name__ == "__main__":
    asyncio.run(main())
