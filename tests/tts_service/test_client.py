"""TTSClient behaviours a voice agent leans on: non-waiting open, cancelled opens, lost connections."""

from __future__ import annotations

import asyncio

import pytest

from support.tts_helpers import RunningServer, eventually, running_server
from tts_service.client import AudioFrame, TTSClient, TTSConnectionError, TTSError
from tts_service.piper.scheduler import PiperSchedulerOptions


async def test_open_without_waiting_streams_audio(live: RunningServer) -> None:
    async with TTSClient(live.ws_url) as client:
        ctx = await client.open(wait=False, pace=False)
        await ctx.send_text("No round trip before this text. ")
        await ctx.end()
        frames = [item async for item in ctx if isinstance(item, AudioFrame)]
        assert frames and ctx.sample_rate == live.synth.engine.sample_rate
        assert ctx.done


async def test_open_without_waiting_reports_a_refusal_when_iterated(live: RunningServer) -> None:
    async with TTSClient(live.ws_url) as client:
        ctx = await client.open(wait=False, voice="no-such-voice")
        with pytest.raises(TTSError) as info:
            async for _ in ctx:
                pass
        assert info.value.code == "unknown_voice"
        # The connection is still good.
        ok = await client.open(text="Still here.", pace=False)
        await ok.end()
        assert await ok.collect()


async def test_a_cancelled_open_does_not_leave_the_context_on_the_server(live: RunningServer) -> None:
    cancelled = live.synth.metrics.streams.labels("cancelled")
    async with TTSClient(live.ws_url) as client:
        before, cancels = live.synth.scheduler.active, cancelled._value.get()
        task = asyncio.create_task(client.open(text="An open that the caller abandons at once."))
        await asyncio.sleep(0)  # 'start' is on the wire, 'started' not yet back
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The server got 'start', then the client's clean-up 'cancel'.
        await eventually(lambda: cancelled._value.get() == cancels + 1, timeout=5.0)
        assert live.synth.scheduler.active == before


async def test_wait_disconnected_reports_a_lost_connection(engine) -> None:
    async with running_server(engine, options=PiperSchedulerOptions(capacity=1000.0)) as srv:
        client = TTSClient(srv.ws_url, connect_attempts=1)
        await client.connect()
        waiter = asyncio.create_task(client.wait_disconnected())
        ctx = await client.open(text="The server goes away while this plays. " * 3)
        await ctx.end()
    # The server is gone: the context and the waiter both learn it (a server that shuts down
    # says so first with 'shutting_down'; either way the context ends with an error, not quietly).
    reason = await asyncio.wait_for(waiter, 10)
    assert reason
    with pytest.raises(TTSError) as info:
        async for _ in ctx:
            pass
    assert info.value.code in ("connection", "shutting_down"), info.value
    await client.close()
    with pytest.raises(TTSConnectionError, match="closed"):
        await client.connect()


async def test_a_bug_in_the_compute_loop_does_not_silence_the_server(engine) -> None:
    async with running_server(engine, options=PiperSchedulerOptions(capacity=1000.0)) as srv:
        sched = srv.synth.scheduler
        real = sched.schedule
        calls = {"n": 0}

        def flaky(now):
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("a bug in one scheduling step")
            return real(now)

        sched.schedule = flaky
        async with TTSClient(srv.ws_url) as client:
            ctx = await client.open(text="Still speaking after a crash.", pace=False)
            await ctx.end()

            async def audio() -> list[AudioFrame]:
                return [item async for item in ctx if isinstance(item, AudioFrame)]

            frames = await asyncio.wait_for(audio(), 30)  # a dead compute loop would hang here
        assert calls["n"] > 1 and frames
