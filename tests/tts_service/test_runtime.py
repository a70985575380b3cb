"""The runtime with the real voice: it sleeps until the scheduler's clock or an event says so
(no polling loop), and delivers each window's audio as soon as that window is computed."""

from __future__ import annotations

import asyncio
import time

import pytest

from tts_service.core.scheduler import Output
from tts_service.piper.engine import PiperEngine
from tts_service.piper.runtime import PiperSynthesizer
from tts_service.piper.scheduler import PiperSchedulerOptions


class ListSink:
    def __init__(self) -> None:
        self.outputs: list[tuple[float, Output]] = []
        self.done = asyncio.Event()

    def deliver(self, out: Output) -> None:
        self.outputs.append((time.monotonic(), out))
        if out.kind in ("done", "error"):
            self.done.set()

    def backed_up(self) -> bool:
        return False


@pytest.fixture
async def synth(engine: PiperEngine):
    synth = PiperSynthesizer(engine, options=PiperSchedulerOptions(capacity=1000.0))
    await synth.start()
    yield synth
    await synth.stop()


def _count_calls(obj, name: str) -> list[float]:
    calls: list[float] = []
    original = getattr(obj, name)

    def counted(*args, **kwargs):
        calls.append(time.monotonic())
        return original(*args, **kwargs)

    setattr(obj, name, counted)
    return calls


async def test_the_runtime_has_no_polling_loop(synth: PiperSynthesizer) -> None:
    """A fixed-interval poll would call schedule() every few ms while a stream is live. Here it is
    called once per batch plus the wake-ups the scheduler asked for (paced work falling due)."""
    schedules = _count_calls(synth.scheduler, "schedule")
    batches = _count_calls(synth, "_run")
    sink = ListSink()
    sid = synth.open(sink, voice=None, pace=True)
    await asyncio.sleep(0.5)  # an open context without text: nothing to compute, nothing to wake for
    assert len(schedules) <= synth.workers, schedules  # each compute loop looked once at start
    synth.push_text(sid, "Hello there, this is a short reply that lasts for a few seconds of audio.")
    synth.end(sid)
    t0 = time.monotonic()
    await asyncio.wait_for(sink.done.wait(), 30)
    elapsed = time.monotonic() - t0
    audio_s = sum(len(o.samples) for _, o in sink.outputs if o.kind == "audio") / synth.engine.sample_rate
    assert audio_s > 2.5 and elapsed > audio_s - 1.0  # paced: delivery took about real time
    # per batch: the schedule() that made it and the one after it; plus one wake per paced
    # deadline (a window is ~0.7 s of audio, so a handful). A 20 ms poll would add elapsed / 0.02.
    per_batch = 1 + synth.workers  # its own schedule() and one by each loop it wakes
    assert len(schedules) <= per_batch * len(batches) + 2 + audio_s / 0.5, (len(schedules), len(batches), elapsed)
    assert len(schedules) < elapsed / 0.02 / 2


async def test_each_window_is_delivered_when_computed_startup_first(synth: PiperSynthesizer) -> None:
    """Two unpaced streams: every batch holds one window, and its audio reaches the sink before
    the next batch starts; the second stream's first window goes before the first stream's rest."""
    batches = _count_calls(synth, "_run")
    a, b = ListSink(), ListSink()
    first = synth.open(a, voice=None, pace=False)
    synth.push_text(first, "The first stream speaks a long sentence that needs several windows to decode.")
    synth.end(first)
    await asyncio.sleep(0)  # let the compute loop take stream 1's first batch
    second = synth.open(b, voice=None, pace=False)
    synth.push_text(second, "A second stream, starting later.")
    synth.end(second)
    await asyncio.wait_for(asyncio.gather(a.done.wait(), b.done.wait()), 30)
    audio_a = [t for t, o in a.outputs if o.kind == "audio"]
    audio_b = [t for t, o in b.outputs if o.kind == "audio"]
    # stream 1's audio arrived in several deliveries (one per window), not all at once at the end
    deliveries_a = sorted({round(t, 3) for t in audio_a})
    assert len(deliveries_a) >= 3
    # stream 2's first audio came before stream 1 had finished: its start-up went first
    assert audio_b[0] < audio_a[-1]
    assert len(batches) >= len(deliveries_a)


async def test_two_workers_compute_two_streams_at_once(engine: PiperEngine) -> None:
    """With ``workers=2`` two batches run at the same time (one per stream, never one stream
    twice), and every stream still gets all its audio and its ``done``."""
    synth = PiperSynthesizer(engine, options=PiperSchedulerOptions(capacity=1000.0, workers=2))
    assert synth.workers == 2
    running: list[int] = []
    peak = [0]
    original = synth._run

    async def counting(plan):
        running.append(1)
        peak[0] = max(peak[0], len(running))
        try:
            return await original(plan)
        finally:
            running.pop()

    synth._run = counting
    await synth.start()
    try:
        sinks = [ListSink() for _ in range(3)]
        sids = [synth.open(sink, voice=None, pace=False) for sink in sinks]
        for sid in sids:
            synth.push_text(sid, "Each of these streams says a sentence long enough for a few windows.")
            synth.end(sid)
        await asyncio.wait_for(asyncio.gather(*(s.done.wait() for s in sinks)), 60)
        assert peak[0] == 2
        lengths = [sum(len(o.samples) for _, o in s.outputs if o.kind == "audio") for s in sinks]
        # same text: about the same audio (durations are sampled, so not to the sample)
        assert min(lengths) > 2 * engine.sample_rate and max(lengths) < 1.15 * min(lengths), lengths
        assert all([o.kind for _, o in s.outputs][-1] == "done" for s in sinks)
        assert synth.scheduler.active == 0
    finally:
        await synth.stop()


def test_options_fit_the_engine(engine: PiperEngine) -> None:
    """Window sizes raised to the free first window, the engine's context, one window per batch
    on a CPU; on CUDA many windows per batch with a frame budget to hold them."""
    from tts_service.piper.runtime import fit_options

    cpu = fit_options(engine, None)
    assert cpu.windows == (engine.free_frames(), 64, 96, 192) and cpu.context_frames == engine.context
    assert cpu.max_jobs == 1 and cpu.workers == 1

    class Cuda:
        device, context = "cuda", 11

        def free_frames(self) -> int:
            return 54

    gpu = fit_options(Cuda(), None)
    assert gpu.max_jobs == 16 and gpu.max_tick_frames >= 16 * (96 + 22)
