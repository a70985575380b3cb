"""How much bot audio sits downstream of a barge-in flush in the Pipecat demo path.

Pipecat's TTS service pushes each streamvox frame as it arrives, and the output transport queues
whatever it is given (SmallWebRTC's ``write_audio_frame`` awaits each 40 ms chunk's playout, so
the backlog waits in the transport's queue). The backlog at any moment is the audio received
minus the audio played since the first frame: the server's pacing lead. This script measures it
on the real server (in-process thread) over a few long replies, and the same for frames passed
through :class:`agent.pipecat_yield.YieldGate`'s rule (hand a frame on once the audio already
handed on is less than ``lead_ms`` ahead of the clock)::

    .venv/bin/python scripts/transport_lead.py --replies 5
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import numpy as np

from sim.barge_in import LONG_ANSWER
from tts_service.client import AudioFrame, TTSClient
from tts_service.localproc import ServerThread
from tts_service.piper.scheduler import PiperSchedulerOptions
from tts_service.piper.serve import load_piper_engine


async def one_reply(client: TTSClient, rate: int) -> list[tuple[float, float]]:
    """(arrival time, seconds) of every frame of one long reply."""
    ctx = await client.open(sample_rate=rate)
    await ctx.send_text(LONG_ANSWER)
    await ctx.end()
    return [(item.received_at, item.duration_s) async for item in ctx if isinstance(item, AudioFrame)]


def backlog_ungated(frames: list[tuple[float, float]]) -> list[float]:
    """Audio handed on but not yet played, just after each frame arrived (played from the first)."""
    t0, out, received = frames[0][0], [], 0.0
    for at, dur in frames:
        received += dur
        out.append(received - max(0.0, at - t0))
    return out


def backlog_gated(frames: list[tuple[float, float]], lead_s: float) -> list[float]:
    """The same with YieldGate's rule: a frame goes on once what went before is < lead ahead."""
    released_until, out = 0.0, []
    for at, dur in frames:
        now = max(at, released_until - lead_s)  # the gate waits until the frame is due
        released_until = max(now, released_until) + dur
        out.append(released_until - now)
    return out


def summary(values: list[float]) -> str:
    ms = np.asarray(values) * 1000
    return f"median {statistics.median(ms):.0f}, p95 {np.percentile(ms, 95):.0f}, max {ms.max():.0f} ms"


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replies", type=int, default=5)
    ap.add_argument("--rate", type=int, default=24000, help="the demo's output rate")
    ap.add_argument("--lead-ms", type=float, default=80.0, help="YieldGate's lead")
    args = ap.parse_args()
    server = ServerThread(
        load_piper_engine([], progress=lambda *_: None), options=PiperSchedulerOptions(capacity=1000.0)
    )
    url = server.start()
    ungated: list[float] = []
    gated: list[float] = []
    try:
        async with TTSClient(url) as client:
            for _ in range(args.replies):
                frames = await one_reply(client, args.rate)
                ungated += backlog_ungated(frames)
                gated += backlog_gated(frames, args.lead_ms / 1000)
                await asyncio.sleep(0.2)
    finally:
        server.stop()
    print(f"{args.replies} replies of {len(LONG_ANSWER)} characters at {args.rate} Hz, {time.strftime('%Y-%m-%d')}")
    print(f"downstream of the TTS service, no gate (Pipecat's transport queue): {summary(ungated)}")
    print(f"downstream of YieldGate(lead_ms={args.lead_ms:.0f}): {summary(gated)}")


if __name__ == "__main__":
    asyncio.run(main())
