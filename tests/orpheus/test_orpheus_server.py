"""The real aiohttp server (tts_service.server, unchanged) serving protocol v1 with the Orpheus engine."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import pytest

from support.tts_helpers import on_loopback
from tts_service import protocol as P
from tts_service.client import AudioFrame, TTSClient, TTSError, TTSOverloaded
from tts_service.orpheus.runtime import OrpheusSynthesizer
from tts_service.orpheus.scheduler import OrpheusOptions
from tts_service.server import Server

FRAMES_PER_SEGMENT = 10  # max new tokens 70: about 0.85 s of (noise) audio per sentence


@pytest.fixture(scope="module")
def engine():
    from tts_service.orpheus.serve import build_engine

    return build_engine(
        random_weights="tiny",
        device="cpu",
        max_slots=2,
        max_len=256,
        max_new_tokens=7 * FRAMES_PER_SEGMENT,
        progress=lambda *_: None,
    )


@contextlib.asynccontextmanager
async def serving(engine, **options):
    # A tiny model on a busy 2-core CPU is slower than real time; admission by step time is
    # tested in test_orpheus_scheduler.py, here it would refuse every stream.
    options.setdefault("capacity", 1000.0)
    server = Server(OrpheusSynthesizer(engine, options=OrpheusOptions(**options)))
    async with on_loopback(server.app) as urls:
        yield urls


async def test_streams_a_context_to_done(engine):
    async with serving(engine) as (url, http), TTSClient(url) as client:
        ctx = await client.open(voice="leah", pace=False)
        assert ctx.sample_rate == 24000
        await ctx.send_text("Hello there. ")
        await ctx.send_text("How are you today?")
        await ctx.end()
        frames = [item async for item in ctx if isinstance(item, AudioFrame)]
        assert ctx.done
        audio_s = sum(f.duration_s for f in frames)
        assert 0 < audio_s <= 2 * FRAMES_PER_SEGMENT * 2048 / 24000 + 1e-6
        assert ctx.audio_ms == pytest.approx(audio_s * 1000, abs=1)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{http}/v1/voices") as r:
                body = await r.json()
                assert body["default"] == "tara" and {v["name"] for v in body["voices"]} >= {"tara", "zoe"}
            async with session.get(f"{http}/readyz") as r:
                ready = await r.json()
                assert ready["ready"] and ready["capacity_streams"] >= 1
            async with session.post(f"{http}{P.HTTP_TTS_PATH}", json={"text": "One short line."}) as r:
                wav = await r.read()
                assert r.status == 200 and wav[:4] == b"RIFF" and len(wav) > 44


async def test_cancel_is_acked_and_no_frame_follows_the_ack(engine):
    async with serving(engine) as (url, _http), TTSClient(url) as client:
        ctx = await client.open(pace=True)
        await ctx.send_text("A first sentence to speak. And a second one after it. And a third.")
        await ctx.end()
        first = await asyncio.wait_for(anext(ctx), 30)
        assert isinstance(first, AudioFrame)
        result = await ctx.cancel()
        assert result.acked
        after_ack = client.frames_dropped
        await asyncio.sleep(0.5)  # a running tick finishes meanwhile; nothing of it may arrive
        assert client.frames_dropped == after_ack
        # the connection and the freed slot serve the next turn
        ctx2 = await client.open(pace=False)
        await ctx2.send_text("Next turn.")
        await ctx2.end()
        assert len(await ctx2.collect()) > 0 and ctx2.done


async def test_full_server_says_overloaded(engine):
    async with serving(engine, max_streams=1) as (url, _http), TTSClient(url) as client:
        ctx = await client.open(pace=True)
        await ctx.send_text("Keep this stream busy for a while.")
        with pytest.raises(TTSOverloaded):
            await client.open()
        await ctx.cancel()


async def test_a_failing_tick_becomes_an_error_of_its_streams(engine, monkeypatch):
    def broken(plan):
        raise RuntimeError("device lost")

    async with serving(engine) as (url, _http), TTSClient(url) as client:
        monkeypatch.setattr(engine, "tick", broken)
        ctx = await client.open(pace=False)
        await ctx.send_text("This will fail.")
        await ctx.end()
        with pytest.raises(TTSError) as err:
            await asyncio.wait_for(ctx.collect(), 30)
        assert err.value.code == "internal" and "device lost" in err.value.message
        monkeypatch.undo()
        ctx2 = await client.open(pace=False)  # the server goes on
        await ctx2.send_text("This works.")
        await ctx2.end()
        assert len(await ctx2.collect()) > 0


async def test_a_speaking_rate_is_refused_not_ignored(engine):
    """Orpheus speaks at its model's rate: a context asking for another gets ``bad_request``."""
    async with serving(engine) as (url, _http), TTSClient(url) as client:
        with pytest.raises(TTSError, match="own rate"):
            await client.open(speed=1.5, text="Hi.")
