"""The LiveKit plug-in against the real streamvox server, alone and inside an AgentSession.

Timing bounds are deliberately generous (a busy 2-core machine); the figures that matter are
printed (run with ``-s``) and measured properly by ``python -m tests.livekit.measure_ttfb``.
"""

from __future__ import annotations

import asyncio
import re
import time

import pytest
from livekit.agents import APIConnectionError, APIConnectOptions, APIStatusError
from livekit.agents.metrics import TTSMetrics
from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT

from agent.livekit import CancelReport, StreamvoxTTS
from tests.livekit.conftest import BARGE_IN_SENTENCE
from tests.livekit.helpers import (
    MicInput,
    RecordingAudioOutput,
    RunningServer,
    ScriptedLLM,
    TaggingAgent,
    check_replies,
    run_turns,
    running_server,
)
from tts_service.localproc import free_port

SHORT = "Sure, I can help with that."
LONG = (
    "Let me explain this in some detail, because there is a lot to say. The first thing you should "
    "know is that the process has several steps. The second thing is that each step takes a while "
    "to complete, and you will need to be patient with all of them."
)
NO_RETRY = APIConnectOptions(max_retry=0, timeout=5.0)


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split()


class Events:
    """The plug-in's ``metrics_collected`` and ``stream_cancelled`` events, awaitable."""

    def __init__(self, tts: StreamvoxTTS) -> None:
        self.metrics: list[TTSMetrics] = []
        self.cancels: list[CancelReport] = []
        self._changed = asyncio.Event()
        tts.on("metrics_collected", lambda m: self._add(self.metrics, m))
        tts.on("stream_cancelled", lambda c: self._add(self.cancels, c))

    def _add(self, into: list, item) -> None:
        into.append(item)
        self._changed.set()

    async def wait(self, *, metrics: int = 0, cancels: int = 0, timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            while len(self.metrics) < metrics or len(self.cancels) < cancels:
                self._changed.clear()
                await self._changed.wait()


# ---------------------------------------------------------------- the plug-in alone


async def test_stream_tokens_in_audio_and_timed_strings_out(lk_server: RunningServer) -> None:
    tts = StreamvoxTTS(url=lk_server.url)
    events = Events(tts)
    text = "Hello there. This is a streaming test, sent one token at a time."
    try:
        stream = tts.stream()
        for token in re.findall(r"\S+\s*", text):  # like an LLM: token by token
            stream.push_text(token)
            await asyncio.sleep(0.005)
        stream.end_input()
        audio_s, timed = 0.0, []
        async for ev in stream:
            assert ev.frame.sample_rate == 24000 and ev.frame.num_channels == 1
            audio_s += ev.frame.duration
            timed += ev.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])
        await stream.aclose()
    finally:
        await tts.aclose()

    assert 2.0 < audio_s < 10.0
    assert words("".join(timed)) == words(text)  # one TimedString per word, spoken order
    starts = [t.start_time for t in timed]
    assert starts == sorted(starts) and 0.0 <= starts[0] and timed[-1].end_time <= audio_s + 0.1
    assert len(events.metrics) == 1, events.metrics
    m = events.metrics[0]
    assert m.streamed and not m.cancelled and 0.0 < m.ttfb < 5.0 and m.acquire_time >= 0.0
    assert abs(m.audio_duration - audio_s) < 0.05 and m.characters_count == len(text)
    print(f"\nstream: TTFB {m.ttfb * 1000:.0f} ms, acquire {m.acquire_time * 1000:.1f} ms, {audio_s:.2f} s audio")


async def test_synthesize_one_shot(lk_server: RunningServer) -> None:
    tts = StreamvoxTTS(url=lk_server.url, sample_rate=16000)
    events = Events(tts)
    try:
        tts.prewarm()  # synthesize() waits for the prewarm's socket rather than opening another
        async with tts.synthesize("A one-shot synthesis works too.") as chunked:
            frame = await chunked.collect()
        await events.wait(metrics=1)
        assert tts.connections_opened == 1
    finally:
        await tts.aclose()
    assert frame.sample_rate == 16000 and 1.0 < frame.duration < 5.0
    m = events.metrics[0]
    assert not m.streamed and 0.0 < m.ttfb < 5.0 and m.connection_reused


async def test_a_replica_list_skips_a_dead_replica(lk_server: RunningServer) -> None:
    dead = f"ws://127.0.0.1:{free_port()}/v1/stream"
    tts = StreamvoxTTS(url=[dead, lk_server.url], sample_rate=16000)
    try:
        for _ in range(2):
            async with tts.synthesize(SHORT) as chunked:
                frame = await chunked.collect()
            assert frame.duration > 0.5
        # one pooled connection, placed on the replica that answers, kept for the second turn
        assert tts.connections_opened == 1
    finally:
        await tts.aclose()


async def test_aclose_cancels_on_the_server_and_keeps_the_connection(lk_server: RunningServer) -> None:
    srv = lk_server.server
    tts = StreamvoxTTS(url=lk_server.url)
    events = Events(tts)
    connections, acked = srv.ws_connections, srv.cancels_acked
    try:
        stream = tts.stream()
        stream.push_text(LONG)
        stream.end_input()
        frames = 0
        async for _ in stream:
            frames += 1
            if frames == 3:
                break
        t0 = time.perf_counter()
        await stream.aclose()
        aclose_s = time.perf_counter() - t0
        await events.wait(cancels=1)

        nxt = tts.stream()  # the next turn: same socket
        nxt.push_text(SHORT)
        nxt.end_input()
        audio_s = sum([ev.frame.duration async for ev in nxt])
        await nxt.aclose()
    finally:
        await tts.aclose()

    assert aclose_s < 0.25, "aclose() must not wait for a server round trip"
    report = events.cancels[0]
    assert report.acked and report.latency_s < 1.0
    assert srv.cancels_acked == acked + 1
    assert audio_s > 1.0
    assert srv.ws_connections == connections + 1  # one socket for both streams
    assert events.metrics[-1].connection_reused
    assert tts.stats.cancels_acked == 1 and tts.stats.cancels_unacked == 0
    print(f"\naclose {aclose_s * 1000:.1f} ms, cancel->ack {report.latency_s * 1000:.1f} ms")


async def test_missing_ack_drops_the_connection(engine, monkeypatch: pytest.MonkeyPatch) -> None:
    from tts_service import server as server_module

    monkeypatch.setattr(server_module._Connection, "_on_cancel", lambda self, msg: None)  # a server that never acks
    async with running_server(engine) as srv:
        tts = StreamvoxTTS(url=srv.url, cancel_ack_timeout_s=0.3)
        events = Events(tts)
        try:
            stream = tts.stream()
            stream.push_text(LONG)
            stream.end_input()
            async for _ in stream:
                break
            await stream.aclose()
            await events.wait(cancels=1)
            assert not events.cancels[0].acked and tts.stats.cancels_unacked == 1

            nxt = tts.stream()  # still works, on a fresh socket
            nxt.push_text(SHORT)
            nxt.end_input()
            audio_s = sum([ev.frame.duration async for ev in nxt])
            await nxt.aclose()
        finally:
            await tts.aclose()
        assert audio_s > 1.0
        assert srv.server.ws_connections == 2


async def _stream_error(tts: StreamvoxTTS, expected: type[BaseException]) -> BaseException:
    """Say "Hello." once without retries and return the error the stream raises."""
    tts.on("error", lambda _: None)
    try:
        stream = tts.stream(conn_options=NO_RETRY)
        stream.push_text("Hello.")
        stream.end_input()
        with pytest.raises(expected) as info:
            async for _ in stream:
                pass
        await stream.aclose()
    finally:
        await tts.aclose()
    return info.value


async def test_errors_are_translated_once(lk_server: RunningServer) -> None:
    err = await _stream_error(StreamvoxTTS(url=lk_server.url, voice="no-such-voice"), APIStatusError)
    assert err.status_code == 404 and not err.retryable
    assert err.__cause__ is None and "no-such-voice" in err.message

    secret = "s3cret-key"
    tts = StreamvoxTTS(url=f"ws://127.0.0.1:9/v1/stream?token={secret}", api_key=secret)
    conn_err = await _stream_error(tts, APIConnectionError)
    assert conn_err.retryable and secret not in str(conn_err) and secret not in repr(conn_err)


# ---------------------------------------------------------------- inside an AgentSession


async def test_agent_session_five_turns_two_interrupted_one_connection(lk_server: RunningServer) -> None:
    from livekit.agents import AgentSession

    srv = lk_server.server
    plan = [False, True, False, True, False]  # True: interrupted with session.interrupt()
    tts = StreamvoxTTS(url=lk_server.url)
    events = Events(tts)
    llm = ScriptedLLM([LONG if interrupted else SHORT for interrupted in plan])
    sink = RecordingAudioOutput()
    session = AgentSession(llm=llm, tts=tts, vad=None, turn_handling={"turn_detection": None})
    session.output.audio = sink
    connections, acked, cancelled = srv.ws_connections, srv.cancels_acked, srv.streams_cancelled
    try:
        await session.start(agent=TaggingAgent())
        await run_turns(session, sink, plan)
        await events.wait(cancels=2)
        opened = tts.connections_opened
    finally:
        await session.aclose()
        await tts.aclose()

    assert llm.prompts == [f"question {i}" for i in range(5)]
    # Every interruption became a server-acknowledged cancel, and nothing else did.
    cancels, metrics = events.cancels, events.metrics
    assert [c.acked for c in cancels] == [True, True]
    assert srv.cancels_acked == acked + 2 and srv.streams_cancelled == cancelled + 2
    # The sink got no frame of an interrupted reply after its clear_buffer().
    check_replies(sink, plan)
    # One WebSocket for all five turns (opened by prewarm), every stream on it.
    assert srv.ws_connections == connections + 1
    assert opened == 1
    assert len(metrics) == 3 and all(m.connection_reused for m in metrics)
    after = [m.ttfb for m in metrics[1:]]  # turns 2 and 4 follow an interruption
    print(
        f"\nsession: TTFB per completed turn {[round(m.ttfb * 1000) for m in metrics]} ms "
        f"(after interruption: {[round(t * 1000) for t in after]}), "
        f"cancel->ack {[round(c.latency_s * 1000, 1) for c in cancels]} ms"
    )


async def test_real_speech_through_silero_vad_interrupts(
    lk_server: RunningServer, silero_vad, whisper_stt, barge_in_speech
) -> None:
    """Caller speech over the agent -> Silero VAD -> interruption -> acked cancel -> Whisper -> reply.

    ``aec_warmup_duration=0``: the default 3 s warm-up ignores caller audio during the session's
    first 3 s of agent speech (echo protection for speakerphones); a test sink has no echo, and
    the barge-in here comes 0.8 s into the first reply. The sink cannot pause, so the VAD
    interrupts at once instead of pausing for the false-interruption timeout as a room output would.
    """
    from pipelines.livekit_agent import build_session

    tts = StreamvoxTTS(url=lk_server.url)
    events = Events(tts)
    llm = ScriptedLLM([LONG, "Of course, what is your question?"])
    sink = RecordingAudioOutput()
    mic = MicInput(16000)
    session = build_session(
        vad=silero_vad, stt_engine=whisper_stt, llm_engine=llm, tts_engine=tts, aec_warmup_duration=0.0
    )
    session.input.audio = mic
    session.output.audio = sink
    try:
        await session.start(agent=TaggingAgent())
        handle = session.generate_reply(user_input="Tell me about the process.")
        await sink.wait_for_audio(0, 0.8)
        mic.say(barge_in_speech)
        await asyncio.wait_for(handle.wait_for_playout(), 10.0)
        assert handle.interrupted
        await events.wait(cancels=1)
        await sink.wait_for_audio(1, 0.3, timeout=20.0)  # Whisper heard the caller, the LLM answered
    finally:
        await session.aclose()
        await tts.aclose()

    cancels = events.cancels
    assert cancels[0].acked
    assert mic.speech_started_at is not None
    cleared_at = min(t for t, reply in sink.clears if reply == 0)
    talk_over_s = cleared_at - mic.speech_started_at
    assert 0.2 < talk_over_s < 2.5  # min_interruption_duration (0.5 s) + VAD latency
    assert not [f for f in sink.frames if f.reply == 0 and f.at > cleared_at]
    assert {"stop", "question"} & set(words(llm.prompts[-1])), llm.prompts
    print(
        f"\nVAD barge-in: speech onset -> clear_buffer {talk_over_s * 1000:.0f} ms, "
        f"cancel->ack {cancels[0].latency_s * 1000:.1f} ms, heard {llm.prompts[-1]!r} "
        f"(said {BARGE_IN_SENTENCE!r})"
    )
