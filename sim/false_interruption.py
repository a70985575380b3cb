"""``streamvox simulate false-interruption``: a cough or a noise burst over the bot's reply.

One run: the bot speaks a reply through :class:`~agent.runtime.speech.SpeechOutput` into a real-time
:class:`~agent.runtime.playback.ArraySink`; ``at_ms`` into it the caller's microphone carries a
synthetic cough or a band-limited noise burst (:mod:`sim.sounds`), fed to the real Silero VAD
in 32 ms chunks on the clock. :class:`~agent.runtime.bargein.BargeIn` may yield (pause) and must resume:
the run checks, sample by sample, that the device played every sample the server sent exactly
once (only the pause's two fade ramps may differ) and that the reply finished, and reports the
yield (onset -> quiet) and the gap (quiet -> resumed).
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from agent.runtime.bargein import BargeIn, BargeInMetrics
from agent.runtime.speech import SpeechOutput, UtteranceStatus
from agent.runtime.vad import SileroVAD, VADParams
from tts_service.client import TTSClient

from .sounds import cough, noise_burst

__all__ = ["REPLY", "SOUNDS", "FalseRun", "compare_played", "run_false_interruption", "simulate_false"]

REPLY = "Your table is booked for seven thirty tonight, and we will send you a reminder an hour before."
SOUNDS: dict[str, Callable[[], np.ndarray]] = {"cough": cough, "noise": lambda: noise_burst(150.0)}
_RATE = 16000
_CHUNK = 512


@dataclass(slots=True)
class FalseRun:
    index: int
    sound: str
    status: str
    pauses: int
    barged_in: bool
    yield_ms: list[float]
    gap_ms: list[float]
    samples_sent: int
    samples_played: int
    samples_differing: int  # within the fade ramps; more is a defect
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def compare_played(played: np.ndarray, sent: np.ndarray, *, fade_n: int, pauses: int) -> list[str]:
    """Problems if ``played`` is not ``sent`` played once: lost or repeated samples, or
    differences beyond the ``2 * fade_n`` ramp samples of each pause, or a ramp that amplifies."""
    problems = []
    if played.size != sent.size:
        problems.append(f"{played.size - sent.size:+d} samples ({'replayed' if played.size > sent.size else 'lost'})")
        return problems
    differing = int(np.count_nonzero(played != sent))
    if differing > 2 * fade_n * pauses:
        problems.append(f"{differing} samples differ (ramps allow {2 * fade_n * pauses})")
    if np.any(np.abs(played.astype(np.int32)) > np.abs(sent.astype(np.int32))):
        problems.append("a ramp amplified the audio")
    return problems


async def run_false_interruption(
    client: TTSClient,
    output: SpeechOutput,
    barge: BargeIn,
    sound: str,
    *,
    at_ms: float = 400.0,
    index: int = 0,
    timeout_s: float = 30.0,
) -> FalseRun:
    """One run on a started ``output`` (ArraySink) whose jitter buffer is watched for what was sent."""
    if barge.vad is None or barge.vad.params.sample_rate != _RATE:
        raise ValueError(f"the scenario feeds {_RATE} Hz caller audio: give BargeIn a SileroVAD at {_RATE} Hz")
    sent: list[np.ndarray] = []
    real_push = output.jitter.push

    def push(samples, now=None):  # the audio the server sent, in order (a tap, for the check)
        sent.append(np.asarray(samples, dtype=np.int16).copy())
        return real_push(samples, now)

    output.jitter.push = push  # type: ignore[method-assign]
    n_false, n_rec, pauses0 = len(barge.false_interruptions), len(barge.records), output.pauses
    played0 = sum(s.samples.size for s in output.sink.played)
    try:
        barge.reset_vad()
        utt = await output.say(client, REPLY)
        t0 = await utt.wait_playing(timeout_s)
        signal = np.concatenate(
            (np.zeros(round(at_ms * _RATE / 1000), np.float32), SOUNDS[sound](), np.zeros(_RATE, np.float32))
        )
        for k in range(math.ceil(signal.size / _CHUNK)):
            piece = signal[k * _CHUNK : (k + 1) * _CHUNK]
            captured_at = t0 + min(signal.size, (k + 1) * _CHUNK) / _RATE
            delay = captured_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            barge.feed(piece, captured_at=captured_at)
        status = await utt.wait(timeout_s)
    finally:
        output.jitter.push = real_push  # type: ignore[method-assign]
    played = np.concatenate([s.samples for s in output.sink.played])[played0:]
    sent_all = np.concatenate(sent) if sent else np.zeros(0, np.int16)
    falses = barge.false_interruptions[n_false:]
    pauses = output.pauses - pauses0
    fade_n = round(output.pause_fade_ms * output.sample_rate / 1000)
    problems = compare_played(played, sent_all, fade_n=fade_n, pauses=pauses)
    if status is not UtteranceStatus.FINISHED:
        problems.append(f"the reply did not finish ({status.value})")
    if len(barge.records) > n_rec:
        problems.append("the sound barged in")
    if len(falses) != pauses:
        problems.append(f"{pauses} pauses but {len(falses)} resumes")
    return FalseRun(
        index=index,
        sound=sound,
        status=status.value,
        pauses=pauses,
        barged_in=len(barge.records) > n_rec,
        yield_ms=[f.yield_ms for f in falses],
        gap_ms=[f.gap_ms for f in falses],
        samples_sent=int(sent_all.size),
        samples_played=int(played.size),
        samples_differing=int(np.count_nonzero(played != sent_all)) if played.size == sent_all.size else -1,
        problems=problems,
    )


async def simulate_false(
    url: str,
    *,
    sound: str = "cough",
    runs: int = 10,
    at_ms: float = 400.0,
    spread_ms: float = 300.0,
    make_output: Callable[[], SpeechOutput],
    on_run: Callable[[FalseRun], None] | None = None,
) -> list[FalseRun]:
    """``runs`` runs on one connection; run ``i`` starts the sound ``at_ms + spread * frac(i * phi)``
    into the reply (so the sound meets the VAD's window grid at different phases)."""
    if sound not in SOUNDS:
        raise ValueError(f"unknown sound {sound!r}; choose one of {sorted(SOUNDS)}")
    results = []
    async with TTSClient(url) as client:
        output = make_output()
        barge = BargeIn(output, vad=SileroVAD(VADParams(sample_rate=_RATE)), metrics=BargeInMetrics())
        async with output:
            for i in range(runs):
                offset = spread_ms * ((i * 0.6180339887498949) % 1.0)
                res = await run_false_interruption(client, output, barge, sound, at_ms=at_ms + offset, index=i)
                results.append(res)
                if on_run is not None:
                    on_run(res)
        await barge.aclose()
    return results


def summary_lines(results: list[FalseRun]) -> list[str]:
    def stat(values: list[float]) -> str:
        if not values:
            return "-"
        return f"median {statistics.median(values):.0f}, max {max(values):.0f}"

    yields = [y for r in results for y in r.yield_ms]
    gaps = [g for r in results for g in r.gap_ms]
    return [
        f"runs: {len(results)}, paused in {sum(r.pauses > 0 for r in results)}, "
        f"barged in: {sum(r.barged_in for r in results)}, replies finished: "
        f"{sum(r.status == 'finished' for r in results)}",
        f"yield ms: {stat(yields)}; quiet gap ms: {stat(gaps)}",
        f"samples lost or replayed: {sum(abs(r.samples_played - r.samples_sent) for r in results)}",
        "result: "
        + (
            "OK"
            if all(r.ok for r in results)
            else "FAILED: " + "; ".join(f"run {r.index + 1}: {r.problems}" for r in results if r.problems)
        ),
    ]
