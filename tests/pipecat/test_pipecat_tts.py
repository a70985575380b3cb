"""StreamvoxTTSService in Pipecat pipelines (``run_test``) against the real server on loopback.

Timing bounds are generous on purpose: the machine is a shared, noisy 2-core box. What is
asserted exactly are the protocol facts: one connection, one cancel, one ack, zero frames of an
interrupted context after the ``InterruptionFrame``.
"""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest
from loguru import logger
from pipecat.frames.frames import (
    ErrorFrame,
    InterruptionFrame,
    MetricsFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
    TTSTextFrame,
)
from pipecat.metrics.metrics import TTFBMetricsData
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.tests.utils import SleepFrame, run_test

from agent.pipecat import StreamvoxTTSService
from support.pipecat_harness import RealtimePlayer, counting_server, llm_reply
from support.tts_helpers import NO_ADMISSION_LIMIT
from tts_service.client import TTSClient
from tts_service.piper.scheduler import PiperSchedulerOptions

METRICS = PipelineParams(enable_metrics=True, report_only_initial_ttfb=False)

REPLY = (
    "Sure, I can help with that. Your booking is moved to Tuesday afternoon at three. "
    "You will get a confirmation message in a minute or two. "
    "Is there anything else I can do for you today?"
)
LONG_REPLY = (
    "Let me walk you through the three options we have for your trip next week. "
    "The first one leaves early in the morning and arrives just before lunch, with one change in the middle. "
    "The second one is a direct connection in the afternoon, which is a little more expensive. "
    "The third one is an overnight service with a sleeping car, which many people like."
)
NEXT_REPLY = "Of course, the direct one it is."


def _audio(frames, context_id=None) -> list[TTSAudioRawFrame]:
    return [f for f in frames if isinstance(f, TTSAudioRawFrame) and (context_id is None or f.context_id == context_id)]


def _ttfbs(frames) -> list[float]:
    return [
        d.value
        for f in frames
        if isinstance(f, MetricsFrame)
        for d in f.data
        if isinstance(d, TTFBMetricsData) and d.value > 0
    ]


def _pcm(frames: list[TTSAudioRawFrame]) -> np.ndarray:
    return np.frombuffer(b"".join(f.audio for f in frames), dtype="<i2").astype(np.float32) / 32768.0


async def test_streamed_reply_arrives_as_audio_at_the_pipeline_rate(server):
    tts = StreamvoxTTSService(url=server.ws_url, sample_rate=16000)
    down, _ = await run_test(tts, frames_to_send=[*llm_reply(REPLY), SleepFrame(sleep=2.0)], pipeline_params=METRICS)

    audio = _audio(down)
    assert audio, "no audio"
    assert {f.sample_rate for f in audio} == {16000}
    assert {f.num_channels for f in audio} == {1}
    assert len({f.context_id for f in audio}) == 1, "one LLM turn must be one protocol context"
    pcm = _pcm(audio)
    seconds = pcm.size / 16000
    assert 6.0 < seconds < 20.0, seconds  # four sentences of speech
    assert float(np.sqrt(np.mean(pcm**2))) > 0.01, "silent audio"
    # Paced streaming: the reply plays out in about real time, so the last frame came long
    # after the first; the whole reply ended with done -> TTSStoppedFrame.
    assert any(isinstance(f, TTSStoppedFrame) for f in down)
    spoken = [f.text for f in down if isinstance(f, TTSTextFrame)]
    assert [w.lower().strip(",.?") for w in spoken] == [w.lower().strip(",.?") for w in REPLY.split()]
    ttfbs = _ttfbs(down)
    assert len(ttfbs) == 1 and 0 < ttfbs[0] < 3.0, ttfbs
    assert tts.stats.connections == 1 and server.ws_connections == 1
    print(f"TTFB {1000 * ttfbs[0]:.0f} ms, {seconds:.1f} s of audio, playout gaps {1000 * tts.stats.max_lag_s:.0f} ms")


@pytest.mark.parametrize("rate", [8000, 24000, 48000, 32000])
async def test_sample_rate_is_negotiated(server, rate):
    # 8 kHz for phone transports, 24/48 kHz for WebRTC; 32 kHz is not a server rate, so the
    # server sends the voice's native rate and the service resamples.
    tts = StreamvoxTTSService(url=server.ws_url, sample_rate=rate, pace=False)
    down, _ = await run_test(tts, frames_to_send=[*llm_reply("Hello, how are you today?"), SleepFrame(sleep=1.0)])
    audio = _audio(down)
    assert audio and {f.sample_rate for f in audio} == {rate}
    seconds = sum(len(f.audio) for f in audio) / 2 / rate
    assert 0.8 < seconds < 4.0, seconds


async def test_interruption_cancels_on_the_same_connection(server):
    tts = StreamvoxTTSService(url=server.ws_url, sample_rate=16000)
    frames = [
        *llm_reply(LONG_REPLY),
        SleepFrame(sleep=1.5),  # mid-utterance: LONG_REPLY is ~15 s of speech
        InterruptionFrame(),
        SleepFrame(sleep=0.5),
        *llm_reply(NEXT_REPLY),
        SleepFrame(sleep=3.5),
    ]
    down, _ = await run_test(tts, frames_to_send=frames, pipeline_params=METRICS)

    cut = next(i for i, f in enumerate(down) if isinstance(f, InterruptionFrame))
    before, after = down[:cut], down[cut + 1 :]
    first_ctx = {f.context_id for f in _audio(before)}
    assert len(first_ctx) == 1, first_ctx
    (old,) = first_ctx
    assert not any(isinstance(f, TTSStoppedFrame) for f in before), "the first reply finished before the barge-in"
    assert _audio(after, old) == [], "audio of the interrupted context after the InterruptionFrame"
    new = {f.context_id for f in _audio(after)}
    assert len(new) == 1 and old not in new, new
    assert sum(len(f.audio) for f in _audio(after)) / 2 / 16000 > 1.0

    # cancel sent, acknowledged by the server, and all of it on the one connection
    assert tts.stats.cancels == 1 and tts.stats.cancel_acks == 1 and tts.stats.cancel_ack_timeouts == 0
    assert server.cancels_acked() == 1
    assert tts.stats.connections == 1
    assert server.ws_connections == 1
    assert 0 < tts.stats.cancel_ack_latency_s[0] < 1.0
    # TTFB is reported for every utterance, not only the first
    assert len(_ttfbs(down)) == 2, _ttfbs(down)
    print(
        f"cancel ack {1000 * tts.stats.cancel_ack_latency_s[0]:.1f} ms, "
        f"server dropped {tts.stats.frames_dropped_server} frames, "
        f"{tts.stats.frames_dropped} late frames dropped here, "
        f"TTFB {[round(1000 * t) for t in _ttfbs(down)]} ms"
    )


async def test_missing_ack_replaces_the_connection(server, monkeypatch):
    from tts_service import server as server_module

    monkeypatch.setattr(server_module._Connection, "_on_cancel", lambda self, msg: None)  # a server that never acks
    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(str(m)), level="WARNING")
    try:
        tts = StreamvoxTTSService(url=server.ws_url, sample_rate=16000, cancel_ack_timeout_s=0.4)
        frames = [
            *llm_reply(LONG_REPLY),
            SleepFrame(sleep=1.2),
            InterruptionFrame(),
            SleepFrame(sleep=1.5),
            *llm_reply(NEXT_REPLY),
            SleepFrame(sleep=3.5),
        ]
        down, _ = await run_test(tts, frames_to_send=frames)
    finally:
        logger.remove(sink)

    cut = next(i for i, f in enumerate(down) if isinstance(f, InterruptionFrame))
    (old,) = {f.context_id for f in _audio(down[:cut])}
    assert _audio(down[cut:], old) == []
    assert tts.stats.cancel_ack_timeouts == 1 and tts.stats.cancel_acks == 0
    # the server kept streaming the cancelled context until the socket was dropped: gated here
    assert tts.stats.frames_dropped > 0
    assert tts.stats.connections == 2 and server.ws_connections == 2
    assert any("not acknowledged" in w for w in warnings), warnings
    assert sum(len(f.audio) for f in _audio(down[cut:])) / 2 / 16000 > 1.0, "no audio on the new connection"


async def test_context_holds_only_the_spoken_words(server):
    rate = 16000
    tts = StreamvoxTTSService(url=server.ws_url, sample_rate=rate)
    timings: list[tuple[str, float]] = []  # the server's word timings, from the start of the audio
    on_message = tts._on_message

    async def spy(msg):
        if msg["type"] == "words":
            timings.extend((w["word"], w["start"]) for w in msg["words"])
        await on_message(msg)

    tts._on_message = spy
    player = RealtimePlayer(sample_rate=rate)
    context = LLMContext([{"role": "user", "content": "Which trains are there?"}])
    aggregators = LLMContextAggregatorPair(context)
    pipeline = Pipeline([tts, player, aggregators.assistant()])
    frames = [*llm_reply(LONG_REPLY), SleepFrame(sleep=3.0), InterruptionFrame(), SleepFrame(sleep=0.5)]
    await run_test(pipeline, frames_to_send=frames)

    assistant = [m["content"] for m in context.get_messages() if m["role"] == "assistant"]
    assert len(assistant) == 1, context.get_messages()
    said = assistant[0].split()
    played_s = player.played.seconds_played(player.played.interrupted_at[0])
    heard = [w for w, start in timings if start < played_s]
    assert 1.5 < played_s < 6.0, played_s
    assert len(LONG_REPLY.split()) - len(said) > 10, "the whole reply landed in the context"
    assert abs(len(said) - len(heard)) <= 1, (said, heard, played_s)
    norm = [re.sub(r"[^a-z]", "", w.lower()) for w in LONG_REPLY.split()]
    assert [re.sub(r"[^a-z]", "", w.lower()) for w in said] == norm[: len(said)]
    print(
        f"played {played_s:.2f} s (delivery lag {1000 * tts.stats.max_lag_s:.0f} ms): {len(heard)} words heard, "
        f"{len(said)} in the context: {' '.join(said)!r}"
    )


async def test_server_down_is_reported_without_dialling_per_token(unused_tcp_port):
    tts = StreamvoxTTSService(url=f"ws://127.0.0.1:{unused_tcp_port}/v1/stream", sample_rate=16000)
    frames = [*llm_reply(REPLY), SleepFrame(sleep=0.5), *llm_reply(NEXT_REPLY)]
    down, up = await run_test(tts, frames_to_send=frames)
    errors = [f.error for f in up if isinstance(f, ErrorFrame)]
    assert not _audio(down)
    assert any("cannot connect" in e for e in errors), errors
    assert sum("not connected" in e for e in errors) == 2, errors  # one per turn, not one per token
    assert tts._connect_failures <= 3  # set-up, then at most one attempt per turn (backoff)
    assert tts.is_usable, "a server that is down may come back: not a fatal error"


async def test_replicas_skip_a_dead_one_and_a_drain_moves_between_turns(engine, unused_tcp_port):
    dead = f"ws://127.0.0.1:{unused_tcp_port}/v1/stream"
    async with counting_server(engine) as a, counting_server(engine) as b:
        by_url = {a.ws_url: a, b.ws_url: b}
        tts = StreamvoxTTSService(url=[dead, a.ws_url, b.ws_url], sample_rate=16000, pace=False)
        drained: list[str] = []

        async def drain_after_the_first_turn() -> None:
            # between turns (the first context finished, the second not begun): drain its replica
            while not (tts.stats.contexts == 1 and not tts._session.open_contexts and tts._replica is not None):
                await asyncio.sleep(0.02)
            drained.append(tts._replica.url)
            by_url[tts._replica.url].server.start_drain()

        watcher = asyncio.create_task(drain_after_the_first_turn())
        frames = [*llm_reply("Hello there, how are you?"), SleepFrame(sleep=2.5), *llm_reply(NEXT_REPLY)]
        try:
            down, up = await run_test(tts, frames_to_send=[*frames, SleepFrame(sleep=2.5)])
        finally:
            watcher.cancel()
    errors = [f.error for f in up if isinstance(f, ErrorFrame)]
    contexts = list(dict.fromkeys(f.context_id for f in _audio(down)))
    assert len(contexts) == 2 and not errors, (contexts, errors)  # both turns spoken, nothing failed
    assert drained, "the first turn never finished"
    other = b if drained[0] == a.ws_url else a
    assert tts.stats.drains >= 1 and tts.stats.contexts_lost == 0
    assert other.ws_connections == 1, "the second turn went to the replica that was not draining"
    assert tts._replica is not None and tts._replica.url == other.ws_url


async def test_a_start_refused_by_a_full_replica_is_opened_on_another(engine):
    one_stream = PiperSchedulerOptions(capacity=NO_ADMISSION_LIMIT, max_streams=1)
    async with counting_server(engine, options=one_stream) as a, counting_server(engine, options=one_stream) as b:
        tts = StreamvoxTTSService(url=[a.ws_url, b.ws_url], sample_rate=16000, pace=False)
        busy: list[TTSClient] = []

        async def fill_the_replica_it_chose() -> None:
            # after set-up, another agent takes the only stream of the replica this service is on
            while tts._replica is None:
                await asyncio.sleep(0.02)
            client = TTSClient(tts._replica.url)
            busy.append(client)
            ctx = await client.open(text=LONG_REPLY, pace=True)
            await ctx.end()

        filler = asyncio.create_task(fill_the_replica_it_chose())
        try:
            frames = [SleepFrame(sleep=1.5), *llm_reply(NEXT_REPLY), SleepFrame(sleep=3.0)]
            down, up = await run_test(tts, frames_to_send=frames)
            await filler
        finally:
            filler.cancel()
            for client in busy:
                await client.close()
    errors = [f.error for f in up if isinstance(f, ErrorFrame)]
    assert not errors, errors  # the refusal was absorbed, not reported
    assert _audio(down) and sum(len(f.audio) for f in _audio(down)) / 2 / 16000 > 1.0
    assert tts.stats.contexts_moved == 1 and tts.stats.contexts == 1
    full = busy[0].replicas.replicas[0].url
    assert tts._replica is not None and tts._replica.url != full
