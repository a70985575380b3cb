"""``/tts/websocket`` on the wire: Cartesia's messages from a raw WebSocket, against a real server.

Pipecat's and LiveKit's Cartesia services are tested in tests/pipecat and tests/livekit; here
are what those clients do not show: the error shapes, the formats, the key, the drain, and the
cancel's ordering (no chunk of a cancelled context after anything of a context started later).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import aiohttp
import numpy as np
import pytest

from support.tts_helpers import API_KEY, RunningServer, running_server
from tts_service.compat.voices import VoiceMap
from tts_service.server import ServerConfig

TEXT = "The quick brown fox jumps over the lazy dog. It was not amused at all, and it said so loudly."


def _request(context_id: str, transcript: str, *, more: bool = False, **extra: Any) -> dict[str, Any]:
    msg = {
        "context_id": context_id,
        "transcript": transcript,
        "continue": more,
        "model_id": "sonic-3.6",
        "voice": {"mode": "id", "id": "a0e99841-438c-4a64-b679-ae501e7d6091"},
        "output_format": {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 16000},
        "add_timestamps": True,
    }
    return msg | extra


def _url(srv: RunningServer) -> str:
    return srv.http_url.replace("http://", "ws://") + "/tts/websocket"


async def _until_done(ws, context_id: str) -> list[dict[str, Any]]:
    got = []
    async for msg in ws:
        data = json.loads(msg.data)
        got.append(data)
        if data["context_id"] == context_id and data.get("done"):
            return got
    raise AssertionError(f"socket closed before {context_id} was done: {got[-3:]}")


async def test_a_context_streams_chunks_timestamps_then_done(live: RunningServer) -> None:
    async with aiohttp.ClientSession() as http, http.ws_connect(_url(live)) as ws:
        await ws.send_json(_request("c1", "The quick brown fox ", more=True))
        await ws.send_json(_request("c1", "jumps over the lazy dog.", more=True))
        await ws.send_json(_request("c1", ""))  # Pipecat's end of input
        got = await _until_done(ws, "c1")
    kinds = [m["type"] for m in got]
    assert kinds[-1] == "done" and kinds.count("done") == 1 and "chunk" in kinds and "timestamps" in kinds
    assert all(m["context_id"] == "c1" for m in got)
    audio = b"".join(base64.b64decode(m["data"]) for m in got if m["type"] == "chunk")
    assert 1.5 < len(audio) / 2 / 16000 < 6
    words = [w for m in got if m["type"] == "timestamps" for w in m["word_timestamps"]["words"]]
    assert [w.strip(".").lower() for w in words] == "the quick brown fox jumps over the lazy dog".split()
    first = kinds.index("timestamps"), kinds.index("chunk")
    assert first[0] < first[1], "timestamps come before the audio that holds those words"


async def test_f32_and_mulaw_formats(live: RunningServer) -> None:
    async with aiohttp.ClientSession() as http, http.ws_connect(_url(live)) as ws:
        fmt = {"container": "raw", "encoding": "pcm_f32le", "sample_rate": 24000}
        await ws.send_json(_request("f", "Hello there.", output_format=fmt))
        got = await _until_done(ws, "f")
        fmt = {"container": "raw", "encoding": "pcm_mulaw", "sample_rate": 8000}
        await ws.send_json(_request("m", "Hello there.", output_format=fmt))
        mulaw = await _until_done(ws, "m")
    f32 = np.frombuffer(b"".join(base64.b64decode(m["data"]) for m in got if m["type"] == "chunk"), dtype="<f4")
    assert 0.4 < f32.size / 24000 < 3 and np.abs(f32).max() <= 1.0 and np.abs(f32).max() > 0.05
    ulaw = b"".join(base64.b64decode(m["data"]) for m in mulaw if m["type"] == "chunk")
    # one byte per sample at 8 kHz (the voice's durations vary a little from render to render)
    assert len(ulaw) / 8000 == pytest.approx(f32.size / 24000, rel=0.25)


async def test_no_chunk_of_a_cancelled_context_after_the_next_one_begins(live: RunningServer) -> None:
    async with aiohttp.ClientSession() as http, http.ws_connect(_url(live)) as ws:
        await ws.send_json(_request("old", TEXT * 3))
        async for msg in ws:  # wait until it speaks
            if json.loads(msg.data)["type"] == "chunk":
                break
        await ws.send_json({"context_id": "old", "cancel": True})
        await ws.send_json(_request("new", "Of course."))
        got = await _until_done(ws, "new")
    first_new = next(i for i, m in enumerate(got) if m["context_id"] == "new")
    assert [m for m in got[first_new:] if m["context_id"] == "old"] == []
    assert not any(m["type"] == "done" and m["context_id"] == "old" for m in got), "a cancelled context is not done"


async def test_bad_messages_get_cartesia_errors_and_the_connection_goes_on(engine) -> None:
    voices = VoiceMap({"known-id": engine.default_voice}, strict=True)
    async with running_server(engine, config=ServerConfig(voice_map=voices)) as srv:
        async with aiohttp.ClientSession() as http, http.ws_connect(_url(srv)) as ws:
            await ws.send_str("not json")
            await ws.send_json({"context_id": "x", "transcript": 5})
            await ws.send_json(_request("y", "Hi.", output_format={"container": "mp3", "encoding": "mp3"}))
            await ws.send_json(
                _request("z", "Hi.", output_format={"container": "raw", "encoding": "pcm_s16le", "sample_rate": 12345})
            )
            await ws.send_json(_request("v", "Hi.", voice={"mode": "id", "id": "unknown-id"}))
            await ws.send_bytes(b"\x00\x01")
            errors = [json.loads((await ws.receive()).data) for _ in range(6)]
            assert all(e["type"] == "error" and e["status_code"] == 400 and e["done"] for e in errors), errors
            assert [e["context_id"] for e in errors[:5]] == ["", "x", "y", "z", "v"]
            assert "unknown-id" in errors[4]["error"]
            await ws.send_json(_request("ok", "Hi.", voice={"mode": "id", "id": "known-id"}))
            assert (await _until_done(ws, "ok"))[-1]["type"] == "done"


async def test_the_key_in_x_api_key_and_the_drain(engine) -> None:
    async with running_server(engine, config=ServerConfig(api_key=API_KEY)) as srv:
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                await http.ws_connect(_url(srv), headers={"X-API-Key": "wrong"})
            assert info.value.status == 401
            async with http.ws_connect(_url(srv), headers={"X-API-Key": API_KEY}) as ws:
                await ws.send_json(_request("k", "Hi."))
                assert (await _until_done(ws, "k"))[-1]["type"] == "done"
            srv.server.start_drain(0.5)
            with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                await http.ws_connect(_url(srv), headers={"X-API-Key": API_KEY})
            assert info.value.status == 503
