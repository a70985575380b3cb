"""The WebRTC uplink with lost packets: barge-in and voice-to-voice at the caller, aiortc's jitter
buffer against ours (``agent/webrtc_uplink.py``), side by side in one run.

The demo room (``pipelines.pipecat_room``: Silero VAD, Whisper, the streamvox server and voice;
a scripted LLM endpoint, so the LLM's time does not blur the comparison) and an aiortc client
standing in for the browser. The client drops every ``--loss-every``-th RTP packet it sends (0:
none); loopback loses nothing by itself. Each session: the greeting, a barge-in over it, the
agent's answer, a question, a barge-in over the answer. Measured at the client, from the audio it
received (20 ms RMS frames), as at the demo page:

* barge-in: the caller's first word -> the agent quiet (0.3 s with no voiced frame);
* voice-to-voice: the end of the caller's speech -> the agent's first voiced frame.

The client's own receiver is aiortc's in both modes, so only the agent's uplink differs.

    .venv/bin/python scripts/uplink_loss.py --runs 3 --loss-every 50 --json out/uplink_loss.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import aiohttp

from agent import webrtc_uplink
from bench.stats import median, percentile
from support.pipecat_harness import (
    QUIET_S,
    RATE,
    VOICED,
    counting_server,
    fake_llm,
    first_time,
    room_server,
    silenced_at,
    speech,
    webrtc_call,
)

BARGE_IN = "Sorry to interrupt you"  # no comma: one run of speech, so no turn ends inside it
QUESTION = "What is the capital of France"
REPLIES = [
    "Of course. What would you like to know about the trains today?",
    "The capital of France is Paris. It is a large and busy city on the river Seine, with many museums, "
    "old bridges and famous gardens. Most people arrive by train at one of its six big stations.",
]


async def session(base: str, http: aiohttp.ClientSession, mode: str, loss: int, barge: bytes, question: bytes):
    webrtc_uplink.release_audio_sooner("aiortc")  # the caller's own receiver: the same in both modes
    async with webrtc_call(
        http, base, loss_every=loss, before_offer=lambda: webrtc_uplink.release_audio_sooner(mode)
    ) as call:  # ^ the agent's receiver, made when it takes the offer
        return await _converse(call, barge, question)


async def _converse(call, barge: bytes, question: bytes) -> dict[str, Any]:
    heard, mic = call.heard, call.mic

    async def voiced_after(t0: float, timeout: float) -> float:
        return await first_time(heard, lambda t, rms: t > t0 and rms > VOICED, timeout, "the agent's voice")

    async def quiet_since(t0: float, timeout: float) -> float:
        """The last voiced frame after t0 that ``QUIET_S`` of quiet followed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            last = silenced_at([(t, rms) for t, rms in heard if t >= t0], t0)
            if heard and heard[-1][0] - last >= QUIET_S:
                return last
            await asyncio.sleep(0.02)
        raise TimeoutError("the agent kept talking")

    async def say(pcm: bytes, *, over_speech: bool = False) -> tuple[float, float]:
        """Speak ``pcm``: over the agent's voice (``over_speech``: in a voiced frame, not a pause)."""
        deadline = time.monotonic() + 2.0
        while over_speech and not (heard and heard[-1][1] > VOICED) and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        start = time.monotonic()
        mic.say(pcm)
        await asyncio.sleep(len(pcm) / 2 / RATE)  # the microphone plays it in real time
        while mic.speech_ended_at < start:  # noqa: ASYNC110 - the track sets it, with no event to wait on
            await asyncio.sleep(0.01)
        return start, mic.speech_ended_at

    out: dict[str, Any] = {"barge_in_ms": [], "v2v_ms": []}
    spoke = await voiced_after(0.0, 30)  # the greeting
    await asyncio.sleep(max(0.0, spoke + 1.5 - time.monotonic()))
    for pcm, then_answer in ((barge, True), (question, False)):
        onset, end = await say(pcm, over_speech=then_answer)
        if then_answer:  # a barge-in: how soon the agent went quiet, then its answer
            out["barge_in_ms"].append(1000 * (await quiet_since(onset, 10) - onset))
        first = await voiced_after(end, 15)
        out["v2v_ms"].append(1000 * (first - end))
        if not then_answer:  # the long answer: talk over it too
            await asyncio.sleep(max(0.0, first + 1.5 - time.monotonic()))
            onset, _ = await say(barge, over_speech=True)
            out["barge_in_ms"].append(1000 * (await quiet_since(onset, 10) - onset))
        else:
            await quiet_since(first, 20)  # let the short answer finish
            await asyncio.sleep(0.5)
    out["packets_sent"], out["packets_dropped"] = call.uplink.sent, call.uplink.dropped
    return out


async def run(args) -> dict[str, Any]:
    from pipelines.pipecat_agent import AgentConfig
    from tts_service.piper.serve import load_piper_engine

    engine = load_piper_engine()
    results: dict[str, list] = {m: [] for m in args.modes}
    async with counting_server(engine) as tts, fake_llm(REPLIES * (2 * args.runs * len(args.modes))) as (llm, _):
        barge, question = await speech(tts.ws_url, BARGE_IN), await speech(tts.ws_url, QUESTION)
        config = AgentConfig(tts_url=tts.ws_url, llm_base_url=llm, llm_model="fake")
        async with room_server(config) as (base, _agents), aiohttp.ClientSession() as http:
            for i in range(args.runs):
                for mode in args.modes:  # interleaved, so drift on a shared machine hits both alike
                    figures = await session(base, http, mode, args.loss_every, barge, question)
                    results[mode].append(figures)
                    print(f"{mode} run {i + 1}/{args.runs}: {json.dumps(figures)}", flush=True)
    return results


def report(results: dict[str, list]) -> str:
    lines = []
    for mode, sessions in results.items():
        lines.append(f"{mode}: {len(sessions)} sessions")
        for key, what in (("barge_in_ms", "barge-in, onset -> agent quiet"), ("v2v_ms", "voice-to-voice")):
            values = [v for s in sessions for v in s[key]]
            if values:
                mid, p95 = median(values), percentile(values, 95)
                lines.append(f"  {what:32s} median {mid:7.1f} ms   p95 {p95:7.1f} ms   (n={len(values)})")
        dropped = sum(s["packets_dropped"] for s in sessions)
        lines.append(f"  uplink packets dropped by the client: {dropped} of {sum(s['packets_sent'] for s in sessions)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="sessions per mode (default 3)")
    parser.add_argument("--loss-every", type=int, default=50, help="drop every N-th uplink packet (0: none; 50)")
    parser.add_argument("--modes", default="aiortc,prompt", help="aiortc and/or prompt, comma-separated")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if args.runs < 1 or args.loss_every < 0 or args.loss_every == 1:
        parser.error("--runs >= 1; --loss-every 0 (none) or >= 2")
    if not args.modes or set(args.modes) - set(webrtc_uplink.MODES):
        parser.error(f"--modes takes {' and/or '.join(webrtc_uplink.MODES)}")
    t0 = time.monotonic()
    results = asyncio.run(run(args))
    n = sum(map(len, results.values()))
    print(f"\n{n} sessions in {time.monotonic() - t0:.0f} s, losing every {args.loss_every}-th uplink packet\n")
    print(report(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"loss_every": args.loss_every, "sessions": results}, indent=1))
        print(f"\nwritten: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
