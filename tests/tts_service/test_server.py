"""End to end over a real loopback socket with the real voice: WebSocket protocol v1 and HTTP.

``TTSClient`` is used where its behaviour is what a user gets; a raw WebSocket where the client
would hide what the server does (frames after an ack, errors without a context, ordering).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import re
import struct
import time

import aiohttp
import numpy as np
import pytest

from support.tts_helpers import (
    API_KEY,
    NO_ADMISSION_LIMIT,
    RunningServer,
    eventually,
    pcm,
    raw_connection,
    rms,
    running_server,
    transcribe,
    wer,
)
from tts_service import protocol as P
from tts_service.audio import mulaw_decode, pcm16_to_float
from tts_service.client import AudioFrame, TTSClient, TTSConnectionError, TTSError, TTSOverloaded, WordTimings
from tts_service.piper.engine import PiperEngine
from tts_service.piper.scheduler import PiperSchedulerOptions
from tts_service.protocol import ErrorCode, Limits, MsgType
from tts_service.segmenter import SegmenterOptions
from tts_service.server import ServerConfig

FOX = "The quick brown fox jumps over the lazy dog near the river bank."
SHOP = "The baker sells fresh bread and warm coffee in the little shop by the station."
SHORT = "Thank you for calling, how can I help you today?"
LONG = (
    "Once upon a time, in a quiet village by the sea, there lived an old fisherman and his wife. "
    "Every morning he rowed his little boat out past the rocks, cast his nets into the cold water, "
    "and waited patiently for the tide to turn. His wife mended the torn nets on the porch and "
    "watched the gulls circle above the harbour, hoping for a good catch and a calm evening."
)


async def collect(ctx, timeout: float = 60.0) -> tuple[list[AudioFrame], list[WordTimings]]:
    frames: list[AudioFrame] = []
    words: list[WordTimings] = []
    async with asyncio.timeout(timeout):
        async for item in ctx:
            (frames if isinstance(item, AudioFrame) else words).append(item)
    return frames, words


async def speak(client: TTSClient, text: str, **open_kw) -> tuple[np.ndarray, int, list[AudioFrame], list[WordTimings]]:
    ctx = await client.open(**open_kw)
    await ctx.send_text(text)
    await ctx.end()
    frames, words = await collect(ctx)
    assert ctx.done
    return pcm16_to_float(b"".join(f.pcm for f in frames)), ctx.sample_rate, frames, words


# ---------------------------------------------------------------- speech


@pytest.mark.parametrize(("text", "rate"), [(FOX, None), (SHOP, 16000)])
async def test_streamed_audio_is_speech(live: RunningServer, whisper, text: str, rate: int | None) -> None:
    async with TTSClient(live.ws_url) as client:
        assert client.server_info["sample_rate"] == 22050
        audio, sr, frames, words = await speak(client, text, pace=False, sample_rate=rate)
    assert sr == (rate or 22050)
    assert [f.seq for f in frames] == list(range(len(frames)))
    assert [w.word for wt in words for w in wt.words] == text.split()
    duration = len(audio) / sr
    assert 2.0 < duration < 8.0
    transcript = await asyncio.to_thread(transcribe, whisper, audio, sr)
    assert wer(text, transcript) <= 0.15, transcript


async def test_text_in_two_pieces_is_spoken_in_full(live: RunningServer, whisper) -> None:
    first = "When the long meeting finally ended, my sister walked to the market"
    second = " and bought fresh apples for the whole family."
    async with TTSClient(live.ws_url) as client:
        ctx = await client.open(pace=False)
        await ctx.send_text(first)
        await asyncio.sleep(0.3)
        await ctx.send_text(second)
        await ctx.end()
        frames, _ = await collect(ctx)
    audio = pcm16_to_float(b"".join(f.pcm for f in frames))
    transcript = await asyncio.to_thread(transcribe, whisper, audio, 22050)
    heard = set(re.findall(r"[a-z]+", transcript.lower()))
    assert {"meeting", "sister", "market"} <= heard, transcript
    assert {"apples", "family"} <= heard, transcript
    assert wer(first + second, transcript) <= 0.2, transcript


async def test_first_audio_arrives_fast_and_paced_audio_keeps_up(live: RunningServer) -> None:
    async with TTSClient(live.ws_url) as client:
        t0 = time.monotonic()
        ctx = await client.open()  # paced: real time plus a bounded lead
        await ctx.send_text(SHORT)
        await ctx.end()
        frames, _ = await collect(ctx)
    audio_s = sum(f.duration_s for f in frames)
    assert frames[0].received_at - t0 < 2.0
    elapsed = frames[-1].received_at - t0
    assert elapsed < audio_s + 2.0  # kept up with real time
    assert elapsed > audio_s - 1.5  # ... and did not dump everything at once
    assert ctx.audio_ms == pytest.approx(1000 * audio_s, rel=0.02)


# ---------------------------------------------------------------- cancel


async def test_twenty_cancels_at_random_moments(live: RunningServer) -> None:
    rng = random.Random(20240501)
    cancelled: dict[str, int] = {}  # context id -> stream number
    heard_before_cancel = 0
    async with raw_connection(live.ws_url) as conn:
        for i in range(20):
            cid = f"cancel-{i}"
            await conn.send(P.start(cid, text=LONG, pace=i % 2 == 0))
            started = await conn.expect(MsgType.STARTED, context_id=cid)
            cancelled[cid] = started["stream"]
            await asyncio.sleep(rng.uniform(0.0, 1.5))
            frames_so_far = sum(1 for ev in conn.log if ev.stream == started["stream"])
            heard_before_cancel += frames_so_far > 0
            await conn.send(P.cancel(cid))
            ack = await conn.expect(MsgType.CANCELLED, context_id=cid, timeout=2.0)
            assert isinstance(ack["frames_dropped"], int) and ack["frames_dropped"] >= 0
        # the connection serves a new context normally
        started, frames, _, done = await conn.speak("after", SHORT, pace=False)
        assert frames and done["frames"] == len(frames)
        await conn.ping_pong()
        log = list(conn.log)
    assert heard_before_cancel >= 10  # most cancels hit a stream that was already speaking
    assert len(set(cancelled.values()) | {started["stream"]}) == 21  # stream numbers are never reused
    for cid, stream in cancelled.items():
        ack_at = next(i for i, ev in enumerate(log) if ev.type == MsgType.CANCELLED and ev.msg["context_id"] == cid)
        late = [
            ev
            for ev in log[ack_at + 1 :]
            if ev.stream == stream or (ev.msg is not None and ev.msg.get("context_id") == cid)
        ]
        assert late == [], f"{cid}: {len(late)} messages after the cancel ack"
        assert sum(1 for ev in log if ev.type == MsgType.CANCELLED and ev.msg["context_id"] == cid) == 1


async def test_five_contexts_in_sequence_some_cancelled(live: RunningServer) -> None:
    async with TTSClient(live.ws_url) as client:
        for i in range(5):
            ctx = await client.open(pace=True)
            await ctx.send_text(LONG if i % 2 else SHORT)
            await ctx.end()
            if i % 2:  # contexts 1 and 3: cancel once audio flows
                async with asyncio.timeout(10):
                    first = await anext(aiter(ctx))
                    while not isinstance(first, AudioFrame):
                        first = await anext(aiter(ctx))
                result = await ctx.cancel()
                assert result.acked and result.latency_s < 1.0
                assert [item async for item in ctx] == []  # nothing is yielded after a cancel
                assert not ctx.done
            else:
                frames, words = await collect(ctx)
                assert ctx.done and frames and ctx.frames == len(frames) and words
        assert client.connections == 1 and client.reconnects == 0
        assert await client.ping() < 1.0


async def test_cancel_of_unknown_or_finished_context_is_acked(live: RunningServer) -> None:
    async with raw_connection(live.ws_url) as conn:
        await conn.send(P.cancel("never-started"))
        assert (await conn.expect(MsgType.CANCELLED, context_id="never-started"))["frames_dropped"] == 0
        await conn.speak("finished", "Done already.", pace=False)
        for _ in range(2):  # idempotent
            await conn.send(P.cancel("finished"))
            await conn.expect(MsgType.CANCELLED, context_id="finished")


async def test_context_id_can_be_reused_after_cancel(live: RunningServer) -> None:
    async with raw_connection(live.ws_url) as conn:
        await conn.send(P.start("same", text=LONG, pace=False))
        first = await conn.expect(MsgType.STARTED, context_id="same")
        await conn.send(P.cancel("same"))
        await conn.expect(MsgType.CANCELLED, context_id="same")
        started, frames, _, _ = await conn.speak("same", SHORT, pace=False)
        assert started["stream"] != first["stream"]
        assert frames[0].seq == 0
        assert all(ev.stream != first["stream"] for ev in conn.log[conn.log.index(frames[0]) :])


# ---------------------------------------------------------------- bad input

SMALL_LIMITS = Limits(max_text_chars=200, max_context_chars=300, max_contexts=2)


async def test_every_bad_input_gets_its_error_and_the_connection_survives(engine: PiperEngine) -> None:
    async with (
        running_server(engine, config=ServerConfig(limits=SMALL_LIMITS)) as srv,
        raw_connection(srv.ws_url) as conn,
    ):
        assert conn.ready["max_contexts"] == 2 and conn.ready["protocol"] == 1

        async def bad(data: str | bytes, code: str, context_id: str | None = None) -> dict:
            await conn.send(data)
            err = await conn.expect(MsgType.ERROR)
            assert err["code"] == code, err
            assert err.get("context_id") == context_id, err
            assert err["message"]
            await conn.ping_pong(f"after-{code}-{len(conn.log)}")
            return err

        await bad("{not json", ErrorCode.BAD_REQUEST)
        await bad("[1, 2]", ErrorCode.BAD_REQUEST)
        await bad('{"type": "sing", "context_id": "a"}', ErrorCode.BAD_REQUEST)
        await bad('{"type": "text", "text": "no context id"}', ErrorCode.BAD_REQUEST)
        await bad(P.start("v", voice="nobody"), ErrorCode.UNKNOWN_VOICE, "v")
        await bad(P.start("r", sample_rate=12345), ErrorCode.BAD_REQUEST, "r")
        await bad(P.start("e", encoding="mp3"), ErrorCode.BAD_REQUEST, "e")
        await bad(P.text("t", "x" * 201), ErrorCode.TEXT_TOO_LONG, "t")
        await bad(b"\x00\x01binary", ErrorCode.BAD_REQUEST)
        await bad(P.flush("ghost"), ErrorCode.BAD_REQUEST, "ghost")
        await bad(P.end("ghost"), ErrorCode.BAD_REQUEST, "ghost")
        # per-context limit: 150 + 150 characters fit, one more does not; the context lives on
        await conn.send(P.start("big", pace=True))
        await conn.expect(MsgType.STARTED, context_id="big")
        await conn.send(P.text("big", "word " * 30))
        await conn.send(P.text("big", "word " * 30))
        err = await bad(P.text("big", "x"), ErrorCode.TEXT_TOO_LONG, "big")
        assert err["context_ended"] is False
        await bad(P.start("big"), ErrorCode.BAD_REQUEST, "big")  # already live
        # too many contexts: "big" and one more are live
        await conn.send(P.start("second", pace=True))
        await conn.expect(MsgType.STARTED, context_id="second")
        err = await bad(P.start("third"), ErrorCode.TOO_MANY_CONTEXTS, "third")
        for cid in ("big", "second"):
            await conn.send(P.cancel(cid))
            await conn.expect(MsgType.CANCELLED, context_id=cid)
        # all forgiven: a new context speaks
        _, frames, _, done = await conn.speak("fine", SHORT, pace=False)
        assert frames and done["frames"] == len(frames) and rms(pcm(frames)) > 0.02
        errors = [ev.msg for ev in conn.log if ev.type == MsgType.ERROR]
        assert len(errors) == 14


async def test_non_ascii_text_up_to_the_limit_is_accepted(engine: PiperEngine) -> None:
    """JSON escapes non-ASCII characters (6-12 bytes each): the frame size must allow for it."""
    text = "Привет мир " * 900  # 9,900 characters, about 55 kB of JSON
    assert len(text) <= Limits().max_text_chars
    # a segmenter that never cuts unpunctuated text keeps the worker out of it: only the transport is tested
    options = PiperSchedulerOptions(capacity=NO_ADMISSION_LIMIT, segmenter=SegmenterOptions(max_chars=100_000))
    async with running_server(engine, options=options) as srv, raw_connection(srv.ws_url) as conn:
        await conn.send(P.start("ru", pace=True))
        await conn.expect(MsgType.STARTED, context_id="ru")
        await conn.send(P.text("ru", text))
        await conn.ping_pong()
        await conn.send(P.cancel("ru"))
        await conn.expect(MsgType.CANCELLED, context_id="ru")
        assert not [ev for ev in conn.log if ev.type == MsgType.ERROR]


async def test_client_raises_context_errors_at_once(live: RunningServer) -> None:
    async with TTSClient(live.ws_url, open_timeout_s=3.0) as client:
        t0 = time.monotonic()
        with pytest.raises(TTSError) as info:
            await client.open(voice="nobody")
        assert info.value.code == ErrorCode.UNKNOWN_VOICE
        assert time.monotonic() - t0 < 1.0
        with pytest.raises(TTSError) as info:
            await client.open(sample_rate=12345)
        assert info.value.code == ErrorCode.BAD_REQUEST
        audio, _, _, _ = await speak(client, "Still here.", pace=False)
        assert rms(audio) > 0.02


# ---------------------------------------------------------------- formats


@pytest.mark.parametrize(("rate", "encoding", "width"), [(16000, "pcm_s16le", 2), (8000, "mulaw", 1), (48000, None, 2)])
async def test_output_formats(live: RunningServer, rate: int, encoding: str | None, width: int) -> None:
    async with raw_connection(live.ws_url) as conn:
        started, frames, events, done = await conn.speak("fmt", SHORT, pace=False, sample_rate=rate, encoding=encoding)
    assert started["sample_rate"] == rate and started["encoding"] == (encoding or "pcm_s16le")
    data = b"".join(f.payload for f in frames)
    assert len(data) % width == 0
    seconds = len(data) / width / rate
    assert seconds == pytest.approx(done["audio_ms"] / 1000, rel=0.02)
    samples = mulaw_decode(data) if encoding == "mulaw" else pcm16_to_float(data)
    assert rms(samples) > 0.02
    assert events[0].type == MsgType.WORDS  # words arrive before the first frame of their audio


async def test_words_arrive_before_their_audio(live: RunningServer) -> None:
    text = "First sentence is here. Then a second one follows. And a third one ends it."
    async with raw_connection(live.ws_url) as conn:
        _, _, events, done = await conn.speak("w", text, pace=False)
    audio_s = 0.0
    seen: list[str] = []
    for ev in events:
        if ev.type == "audio":
            audio_s += len(ev.payload) / 2 / 22050
        elif ev.type == MsgType.WORDS:
            items = ev.msg["words"]
            seen += [w["word"] for w in items]
            # no audio of these words was sent before this message
            assert audio_s <= items[0]["start"] + 1e-3, (audio_s, items[0])
            assert all(a["start"] <= b["start"] for a, b in itertools.pairwise(items))
    assert seen == text.split()
    assert events[-1].type == MsgType.DONE
    assert audio_s == pytest.approx(done["audio_ms"] / 1000, abs=0.01)


# ---------------------------------------------------------------- HTTP


async def test_http_streams_a_wav(live: RunningServer, whisper) -> None:
    async with aiohttp.ClientSession() as session:
        t0 = time.monotonic()
        async with session.post(
            live.http_url + P.HTTP_TTS_PATH, json={"text": FOX, "sample_rate": 16000, "pace": True}
        ) as resp:
            assert resp.status == 200
            assert resp.headers["Transfer-Encoding"] == "chunked"
            assert resp.headers["Content-Type"].startswith("audio/wav")
            body = bytearray()
            first_audio_at = None
            async for chunk in resp.content.iter_any():
                body += chunk
                if first_audio_at is None and len(body) > 44:
                    first_audio_at = time.monotonic() - t0
            total = time.monotonic() - t0
    assert body[:4] == b"RIFF" and body[8:12] == b"WAVE" and body[36:40] == b"data"
    channels, rate, _, _, bits = struct.unpack_from("<HIIHH", body, 22)
    assert (channels, rate, bits) == (1, 16000, 16)
    audio = pcm16_to_float(bytes(body[44:]))
    seconds = len(audio) / 16000
    assert first_audio_at is not None and first_audio_at < 2.0
    assert total > seconds - 1.5  # streamed as generated (paced), not rendered first then sent
    transcript = await asyncio.to_thread(transcribe, whisper, audio, 16000)
    assert wer(FOX, transcript) <= 0.15, transcript


@pytest.mark.parametrize(("encoding", "rate", "width"), [("pcm_s16le", None, 2), ("mulaw", 8000, 1)])
async def test_http_raw_encodings(live: RunningServer, encoding: str, rate: int | None, width: int) -> None:
    body = {"text": "Raw audio please.", "encoding": encoding}
    if rate:
        body["sample_rate"] = rate
    async with aiohttp.ClientSession() as session, session.post(live.http_url + P.HTTP_TTS_PATH, json=body) as resp:
        assert resp.status == 200
        assert resp.headers["X-Sample-Rate"] == str(rate or 22050)
        data = await resp.read()
    assert not data.startswith(b"RIFF")
    assert 0.5 < len(data) / width / (rate or 22050) < 4.0


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"this is not json", 400, ErrorCode.BAD_REQUEST),
        (b"[1, 2]", 400, ErrorCode.BAD_REQUEST),
        (b"{}", 400, ErrorCode.BAD_REQUEST),
        (b'{"text": ""}', 400, ErrorCode.BAD_REQUEST),
        (b'{"text": 5}', 400, ErrorCode.BAD_REQUEST),
        (b'{"text": "hi", "encoding": "mp3"}', 400, ErrorCode.BAD_REQUEST),
        (b'{"text": "hi", "encoding": 3}', 400, ErrorCode.BAD_REQUEST),
        (b'{"text": "hi", "sample_rate": 12345}', 400, ErrorCode.BAD_REQUEST),
        (b'{"text": "hi", "sample_rate": "16000"}', 400, ErrorCode.BAD_REQUEST),
        (b'{"text": "hi", "pace": "no"}', 400, ErrorCode.BAD_REQUEST),
        (b'{"text": "hi", "voice": "nobody"}', 404, ErrorCode.UNKNOWN_VOICE),
        (json.dumps({"text": "a" * 100_001}).encode(), 413, ErrorCode.TEXT_TOO_LONG),
    ],
)
async def test_http_bad_bodies(live: RunningServer, body: bytes, status: int, code: str) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(live.http_url + P.HTTP_TTS_PATH, data=body, headers={"Content-Type": "application/json"}) as resp,
    ):
        assert resp.status == status
        reason = await resp.json()
    assert reason["error"]["code"] == code and reason["error"]["message"]


async def test_http_info_endpoints(live: RunningServer) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(live.http_url + "/v1/voices") as resp:
            voices = await resp.json()
        assert voices["default"] in [v["name"] for v in voices["voices"]]
        assert all(v["sample_rate"] == 22050 for v in voices["voices"])
        async with session.get(live.http_url + "/healthz") as resp:
            assert resp.status == 200 and (await resp.json())["status"] == "ok"
        async with session.get(live.http_url + "/readyz") as resp:
            ready = await resp.json()
            assert resp.status == 200, ready
        assert ready["ready"] is True and ready["voices"] == [voices["default"]]
        for key in ("active_streams", "busy_streams", "load", "capacity_streams", "real_time_factor"):
            assert isinstance(ready[key], int | float), key
        assert 0.0 <= ready["load"] <= 1.0 and ready["draining"] is False


async def test_metrics_after_traffic(live: RunningServer) -> None:
    async with raw_connection(live.ws_url) as conn:
        await conn.speak("m1", "Metrics, please.", pace=False)
        await conn.send(P.start("m2", text=LONG))
        await conn.expect(MsgType.STARTED, context_id="m2")
        await conn.send(P.cancel("m2"))
        await conn.expect(MsgType.CANCELLED, context_id="m2")
    async with aiohttp.ClientSession() as session, session.get(live.http_url + "/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()

    def value(name: str) -> float:
        m = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
        assert m, f"{name} missing from /metrics"
        return float(m.group(1))

    assert value("streamvox_ttfb_seconds_count") >= 1
    assert value("streamvox_cancel_ack_seconds_count") >= 1
    assert value("streamvox_audio_seconds_total") > 0
    for name in ("streamvox_active_streams", "streamvox_queue_depth", "streamvox_real_time_factor"):
        value(name)
    assert "streamvox_batch_size_bucket" in text


# ---------------------------------------------------------------- API key


async def test_api_key(keyed: RunningServer) -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as info:
            await session.ws_connect(keyed.ws_url)
        assert info.value.status == 401
        with pytest.raises(aiohttp.WSServerHandshakeError) as info:
            await session.ws_connect(keyed.ws_url, headers={"Authorization": "Bearer wrong"})
        assert info.value.status == 401
        async with session.post(keyed.http_url + P.HTTP_TTS_PATH, json={"text": "hi"}) as resp:
            assert resp.status == 401
            assert "API key" in (await resp.json())["error"]["message"]
            assert API_KEY not in await resp.text()
        async with session.get(keyed.http_url + "/healthz") as resp:  # probes need no key
            assert resp.status == 200
    async with raw_connection(keyed.ws_url, headers={"Authorization": f"Bearer {API_KEY}"}) as conn:
        await conn.ping_pong()
    async with raw_connection(f"{keyed.ws_url}?token={API_KEY}") as conn:
        await conn.ping_pong()
    async with TTSClient(keyed.ws_url, api_key=API_KEY) as client:
        audio, _, _, _ = await speak(client, "Authorised.", pace=False)
        assert rms(audio) > 0.02
    client = TTSClient(keyed.ws_url, connect_attempts=1)
    with pytest.raises(TTSConnectionError, match="401"):
        await client.connect()
    await client.close()


# ---------------------------------------------------------------- lifecycle and admission


async def test_http_client_disconnect_cancels_the_work(engine: PiperEngine) -> None:
    async with running_server(engine) as srv:
        async with (
            aiohttp.ClientSession() as session,
            session.post(srv.http_url + P.HTTP_TTS_PATH, json={"text": LONG, "pace": True}) as resp,
        ):
            assert resp.status == 200
            got = 0
            async with asyncio.timeout(10):
                while got < 44 + 8000:
                    got += len(await resp.content.readany())
            assert srv.synth.scheduler.active == 1
            resp.close()  # hang up mid-stream
        await eventually(lambda: srv.synth.scheduler.active == 0)
        metrics = srv.synth.metrics.render().decode()
        assert 'streamvox_streams_total{status="cancelled"} 1.0' in metrics
        assert srv.synth.scheduler.active == 0


async def test_websocket_disconnect_cancels_its_contexts(engine: PiperEngine) -> None:
    async with running_server(engine) as srv:
        async with raw_connection(srv.ws_url) as conn:
            for cid in ("a", "b"):
                await conn.send(P.start(cid, text=LONG))
            await conn.expect(MsgType.WORDS)  # audio flows
            assert srv.synth.scheduler.active == 2
        await eventually(lambda: srv.synth.scheduler.active == 0)


async def test_admission_refuses_with_overloaded(engine: PiperEngine) -> None:
    options = PiperSchedulerOptions(max_streams=1, capacity=NO_ADMISSION_LIMIT)
    async with running_server(engine, options=options) as srv, TTSClient(srv.ws_url) as client:
        busy = await client.open(pace=True)
        await busy.send_text(LONG)
        with pytest.raises(TTSOverloaded) as info:
            await client.open()
        assert info.value.code == ErrorCode.OVERLOADED
        assert info.value.extra["retry_after_ms"] > 0 and info.value.retry_after_ms > 0
        async with aiohttp.ClientSession() as session:
            async with session.get(srv.http_url + "/readyz") as resp:
                assert resp.status == 503 and (await resp.json())["ready"] is False
            async with session.post(srv.http_url + P.HTTP_TTS_PATH, json={"text": "hi"}) as resp:
                assert resp.status == 503 and int(resp.headers["Retry-After"]) >= 1
                assert (await resp.json())["error"]["code"] == ErrorCode.OVERLOADED
        assert await client.ping() < 1.0  # the connection still works
        assert (await busy.cancel()).acked
        audio, _, _, _ = await speak(client, "Now there is room.", pace=False)
        assert rms(audio) > 0.02
        assert client.connections == 1
