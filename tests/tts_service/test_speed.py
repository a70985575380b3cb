"""A stream's speaking rate (``speed``) through the whole path, on a real server with the real voice.

``/v1/stream``'s ``start`` takes it; the OpenAI, Cartesia and ElevenLabs endpoints map their own
fields onto it. The voice's rate is a per-segment input of the front part only, so streams of
different rates share the decoder's batches: the batch test holds rows of two rates to their
solo decode, sample for sample. Renders vary a little (the voice samples its noise), so lengths
are held to generous ratios.
"""

from __future__ import annotations

import asyncio
import base64
import json

import aiohttp
import numpy as np
import openai
import pytest

from support.tts_helpers import NO_ADMISSION_LIMIT, RunningServer, raw_connection, running_server
from tts_service import protocol as P
from tts_service.client import AudioFrame, TTSClient
from tts_service.piper.engine import SPEED_RANGE, PiperEngine, Window
from tts_service.piper.scheduler import PiperSchedulerOptions

TEXT = "The quick brown fox jumps over the lazy dog."
# At 2.0 the voice's audio measured ~0.65 of its length at 1.0, at 0.5 ~1.7 (docs/BENCHMARKS.md).
FASTER, SLOWER = 0.85, 1.3


async def _openai_seconds(srv: RunningServer, speed: float | None) -> tuple[float, int]:
    """Seconds of 24 kHz pcm and the number of body chunks, as the ``openai`` SDK streams them."""
    client = openai.AsyncOpenAI(base_url=srv.http_url + "/v1", api_key="unused", max_retries=0)
    args = {"model": "tts-1", "voice": "alloy", "input": TEXT, "response_format": "pcm"}
    if speed is not None:
        args["speed"] = speed
    body, chunks = bytearray(), 0
    async with client.audio.speech.with_streaming_response.create(**args) as resp:
        assert resp.status_code == 200
        async for chunk in resp.iter_bytes():
            body += chunk
            chunks += 1
    await client.close()
    return len(body) / 2 / 24000, chunks


async def test_openai_speed_changes_the_length(live: RunningServer) -> None:
    normal, _ = await _openai_seconds(live, None)
    fast, _ = await _openai_seconds(live, 2.0)
    slow, _ = await _openai_seconds(live, 0.5)
    sdk, chunks = await _openai_seconds(live, 1.5)
    assert fast < FASTER * normal, (fast, normal)
    assert slow > SLOWER * normal, (slow, normal)
    assert fast < sdk < normal and chunks > 1, "speed=1.5 through the SDK streams, between 1.0 and 2.0"


async def test_openai_speeds_outside_the_voice_range_are_clamped(live: RunningServer) -> None:
    """OpenAI allows 0.25..4; the voice renders SPEED_RANGE well, so 4.0 speaks at its top rate."""
    top, _ = await _openai_seconds(live, SPEED_RANGE[1])
    beyond, _ = await _openai_seconds(live, 4.0)
    assert beyond == pytest.approx(top, rel=0.2), (beyond, top)


async def test_openai_bad_speeds_get_openais_error_shape(live: RunningServer) -> None:
    client = openai.AsyncOpenAI(base_url=live.http_url + "/v1", api_key="unused", max_retries=0)
    for speed in (0.1, 9.0, "fast", True):
        with pytest.raises(openai.BadRequestError) as info:
            await client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, speed=speed)  # type: ignore[arg-type]
        body = info.value.body
        assert info.value.status_code == 400 and body["type"] == "invalid_request_error", body
        assert body["param"] == "speed" and body["message"], body
    await client.close()


async def test_stream_start_takes_a_speed_and_refuses_bad_ones(live: RunningServer) -> None:
    async with raw_connection(live.ws_url) as conn:
        *_, normal = await conn.speak("n", TEXT, pace=False)
        *_, fast = await conn.speak("f", TEXT, pace=False, speed=2.0)
        assert fast["audio_ms"] < FASTER * normal["audio_ms"], (fast, normal)
        for i, speed in enumerate(["fast", True, 0.1, 5, SPEED_RANGE[0] / 2]):
            await conn.send(json.dumps({"type": "start", "context_id": f"bad{i}", "text": "Hi.", "speed": speed}))
            err = await conn.expect(P.MsgType.ERROR, context_id=f"bad{i}")
            assert err["code"] == P.ErrorCode.BAD_REQUEST and "speed" in err["message"], err
        await conn.ping_pong()  # the connection goes on


async def test_the_client_opens_a_context_at_a_rate(live: RunningServer) -> None:
    async with TTSClient(live.ws_url) as client:
        lengths = []
        for speed in (None, 2.0):
            ctx = await client.open(pace=False, speed=speed, text=TEXT)
            await ctx.end()
            lengths.append(sum([item.duration_s async for item in ctx if isinstance(item, AudioFrame)]))
    assert lengths[1] < FASTER * lengths[0], lengths


def test_rows_of_different_rates_in_one_decoder_batch_do_not_mix(engine: PiperEngine) -> None:
    """The decoder never sees the rate: windows of a 2.0 and a 1.0 segment decoded in one call
    (the GPU path's equal spans, forced here) equal each decoded alone."""
    fast = engine.prepare(TEXT, speed=2.0)
    normal = engine.prepare(TEXT)
    assert fast is not None and normal is not None and fast.frames < normal.frames
    windows = [Window(fast, 10, 60), Window(normal, 10, 60), Window(normal, 100, 160)]
    alone = [engine.decode([w])[0] for w in windows]
    saved = engine.equal_spans
    engine.equal_spans = True
    try:
        together = engine.decode(windows)
    finally:
        engine.equal_spans = saved
    for a, b in zip(alone, together):
        np.testing.assert_allclose(a, b, atol=1e-5)


async def test_a_fast_context_beside_a_normal_one_keeps_both_lengths(engine: PiperEngine) -> None:
    """Two contexts on one connection, one at 2.0, computed in the same batches (max_jobs 4):
    each lasts as long as it does alone."""
    options = PiperSchedulerOptions(capacity=NO_ADMISSION_LIMIT, max_jobs=4, max_tick_frames=2000)
    async with running_server(engine, options=options) as srv, raw_connection(srv.ws_url) as conn:
        *_, normal = await conn.speak("n0", TEXT, pace=False)
        *_, fast = await conn.speak("f0", TEXT, pace=False, speed=2.0)
        for ctx, speed in (("n1", None), ("f1", 2.0)):
            await conn.send(P.start(ctx, text=TEXT, pace=False, speed=speed))
            await conn.send(P.end(ctx))
        done = {}
        while len(done) < 2:
            msg = await conn.expect(P.MsgType.DONE, timeout=30)
            done[msg["context_id"]] = msg["audio_ms"]
    assert done["n1"] == pytest.approx(normal["audio_ms"], rel=0.2), (done, normal)
    assert done["f1"] == pytest.approx(fast["audio_ms"], rel=0.2), (done, fast)
    assert done["f1"] < FASTER * done["n1"], done


async def _cartesia_seconds(srv: RunningServer, **extra) -> float:
    request = {
        "context_id": "c",
        "transcript": TEXT,
        "continue": False,
        "voice": {"mode": "id", "id": "any"},
        "output_format": {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000},
    } | extra
    samples = 0
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(srv.http_url.replace("http", "ws") + "/tts/websocket") as ws:
            await ws.send_json(request)
            async with asyncio.timeout(30):
                while (msg := await ws.receive_json())["type"] == "chunk":
                    samples += len(base64.b64decode(msg["data"])) // 2
    assert msg["type"] == "done", msg
    return samples / 24000


async def test_cartesia_speed_controls(live: RunningServer) -> None:
    normal, fast, slowest = await asyncio.gather(  # paced like Cartesia: side by side, not one after another
        _cartesia_seconds(live),
        _cartesia_seconds(live, generation_config={"speed": 2.0}),
        _cartesia_seconds(live, voice={"mode": "id", "id": "any", "__experimental_controls": {"speed": "slowest"}}),
    )
    assert fast < FASTER * normal and slowest > SLOWER * normal, (fast, normal, slowest)
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(live.http_url.replace("http", "ws") + "/tts/websocket") as ws:
            await ws.send_json({"context_id": "x", "transcript": "Hi.", "generation_config": {"speed": "fast"}})
            err = await ws.receive_json(timeout=10)
            assert err["type"] == "error" and err["status_code"] == 400 and "speed" in err["error"], err


async def _eleven_seconds(srv: RunningServer, settings: dict) -> float:
    url = srv.http_url.replace("http", "ws") + "/v1/text-to-speech/v/multi-stream-input?output_format=pcm_24000"
    samples = 0
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        await ws.send_json({"text": TEXT, "context_id": "e", "voice_settings": settings, "flush": True})
        await ws.send_json({"context_id": "e", "close_context": True})
        async with asyncio.timeout(30):
            while not (msg := await ws.receive_json()).get("isFinal"):
                assert "error" not in msg, msg
                samples += len(base64.b64decode(msg["audio"])) // 2
    return samples / 24000


async def test_elevenlabs_voice_settings_speed(live: RunningServer) -> None:
    normal, fast = await asyncio.gather(
        _eleven_seconds(live, {"stability": 0.5}), _eleven_seconds(live, {"speed": 2.0})
    )
    assert fast < FASTER * normal, (fast, normal)
