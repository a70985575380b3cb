"""``POST /v1/audio/speech`` and ``GET /v1/models`` through the real ``openai`` SDK, on a real server.

The SDK is pointed at the local server by ``base_url`` only; what it reads back (streamed bytes,
its own error classes built from our error bodies) is what an OpenAI user gets.
"""

from __future__ import annotations

import asyncio
import io
import time

import aiohttp
import numpy as np
import openai
import pytest

from support.tts_helpers import API_KEY, RunningServer, running_server, transcribe, wer
from tts_service.compat.voices import VoiceMap
from tts_service.server import ServerConfig

TEXT = "The quick brown fox jumps over the lazy dog."


def _client(srv: RunningServer, key: str = "unused") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=srv.http_url + "/v1", api_key=key, max_retries=0)


async def _speech(srv: RunningServer, **kwargs) -> tuple[bytes, list[float], float]:
    """The whole body, the arrival times of its chunks and the total time, as the SDK streams it."""
    client = _client(srv)
    t0 = time.monotonic()
    times: list[float] = []
    body = bytearray()
    args = {"model": "tts-1", "voice": "alloy", "input": TEXT} | kwargs
    async with client.audio.speech.with_streaming_response.create(**args) as resp:
        assert resp.status_code == 200
        async for chunk in resp.iter_bytes():
            times.append(time.monotonic() - t0)
            body += chunk
    await client.close()
    return bytes(body), times, time.monotonic() - t0


async def test_pcm_streams_24khz_speech(live: RunningServer, whisper) -> None:
    body, times, _ = await _speech(live, response_format="pcm")
    audio = np.frombuffer(body, dtype="<i2").astype(np.float32) / 32768
    assert 1.5 < audio.size / 24000 < 6, "OpenAI's pcm is 24 kHz: the duration of the text at that rate"
    assert len(times) > 1 and times[0] < times[-1], "the body streams in pieces as it is generated"
    heard = await asyncio.to_thread(transcribe, whisper, audio, 24000)
    assert wer(TEXT, heard) <= 0.2, heard


async def test_wav_has_a_streaming_header_at_24khz(live: RunningServer) -> None:
    body, _, _ = await _speech(live, response_format="wav")
    assert body[:4] == b"RIFF" and body[8:12] == b"WAVE"
    assert int.from_bytes(body[24:28], "little") == 24000
    assert len(body) > 44 + 24000  # more than half a second of 16-bit audio


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac"])
async def test_encoded_formats_decode_to_the_same_speech(live: RunningServer, fmt: str) -> None:
    import av

    body, _, _ = await _speech(live, response_format=fmt)
    with av.open(io.BytesIO(body)) as container:
        samples = sum(frame.samples / frame.sample_rate for frame in container.decode(audio=0))
    pcm, _, _ = await _speech(live, response_format="pcm")
    assert samples == pytest.approx(len(pcm) / 2 / 24000, rel=0.2)  # durations vary a little per render


async def test_default_format_is_mp3_and_sse_streams_events(live: RunningServer) -> None:
    body, _, _ = await _speech(live)
    assert body[:3] == b"ID3" or body[0] == 0xFF, "OpenAI's default response_format is mp3"
    async with aiohttp.ClientSession() as session:
        args = {"model": "gpt-4o-mini-tts", "voice": "nova", "input": "Hi there.", "response_format": "pcm"}
        async with session.post(live.http_url + "/v1/audio/speech", json=args | {"stream_format": "sse"}) as resp:
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            text = await resp.text()
    events = [line for line in text.splitlines() if line.startswith("data: ")]
    assert '"speech.audio.delta"' in events[0] and '"speech.audio.done"' in events[-1]


async def test_bad_input_gets_openais_error_shape(live: RunningServer) -> None:
    client = _client(live)
    cases = [
        ({"input": ""}, "input"),
        ({"voice": ""}, "voice"),
        ({"response_format": "ogg"}, "response_format"),
        ({"speed": 9.0}, "speed"),
        ({"speed": 0.1}, "speed"),
    ]
    for override, param in cases:
        args = {"model": "tts-1", "voice": "alloy", "input": TEXT} | override
        with pytest.raises(openai.BadRequestError) as info:
            await client.audio.speech.create(**args)
        assert info.value.status_code == 400
        assert info.value.body["type"] == "invalid_request_error" and info.value.body["param"] == param
    async with aiohttp.ClientSession() as session:
        async with session.post(live.http_url + "/v1/audio/speech", data=b"{not json") as resp:
            assert resp.status == 400 and (await resp.json())["error"]["code"] == "invalid_json"
    await client.close()


async def test_models_and_the_key(engine) -> None:
    async with running_server(engine, config=ServerConfig(api_key=API_KEY)) as srv:
        models = await _client(srv, API_KEY).models.list()
        assert "tts-1" in [m.id for m in models.data]
        with pytest.raises(openai.AuthenticationError) as info:
            await _client(srv, "wrong").audio.speech.create(model="tts-1", voice="alloy", input="Hi.")
        assert info.value.body["code"] == "invalid_api_key"
        body, _, _ = await _speech_keyed(srv)
        assert len(body) > 24000


async def _speech_keyed(srv: RunningServer) -> tuple[bytes, list[float], float]:
    client = _client(srv, API_KEY)
    resp = await client.audio.speech.create(model="tts-1", voice="alloy", input="Hello there.", response_format="pcm")
    await client.close()
    return resp.content, [], 0.0


async def test_strict_voice_map_refuses_unknown_ids(engine) -> None:
    voices = VoiceMap({"my-voice": engine.default_voice}, strict=True)
    async with running_server(engine, config=ServerConfig(voice_map=voices)) as srv:
        client = _client(srv)
        ok = await client.audio.speech.create(model="tts-1", voice="my-voice", input="Hi.", response_format="pcm")
        assert len(ok.content) > 4800
        with pytest.raises(openai.BadRequestError) as info:
            await client.audio.speech.create(model="tts-1", voice="nobody", input="Hi.", response_format="pcm")
        assert info.value.body["param"] == "voice" and "nobody" in info.value.body["message"]
        await client.close()


async def test_a_client_that_hangs_up_cancels_the_work(live: RunningServer) -> None:
    long_text = " ".join([TEXT] * 30)
    async with aiohttp.ClientSession() as session:
        args = {"model": "tts-1", "voice": "alloy", "input": long_text, "response_format": "pcm"}
        async with session.post(live.http_url + "/v1/audio/speech", json=args) as resp:
            await resp.content.readexactly(4800)
            assert live.synth.scheduler.active >= 1
    for _ in range(100):
        if live.synth.scheduler.active == 0:
            break
        await asyncio.sleep(0.05)
    assert live.synth.scheduler.active == 0
