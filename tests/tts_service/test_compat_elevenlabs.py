"""``/v1/text-to-speech/{voice_id}/multi-stream-input`` on the wire, from a raw WebSocket.

Pipecat's and LiveKit's ElevenLabs services are tested in tests/pipecat and tests/livekit; here:
the two meanings of ``close_context`` (after the closing flush: the rest of the audio, then
``isFinal``; in mid-reply: a cancel, nothing more of it), formats, alignment, errors, the key.
"""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import aiohttp
import pytest

from support.tts_helpers import API_KEY, RunningServer, running_server
from tts_service.compat.elevenlabs import alignment
from tts_service.compat.voices import VoiceMap
from tts_service.server import ServerConfig
from tts_service.session import Word

LONG = "Let me walk you through the three options we have for your trip next week, one by one. " * 3


def _url(srv: RunningServer, voice: str = "21m00Tcm4TlvDq8ikWAM", fmt: str = "pcm_16000") -> str:
    base = srv.http_url.replace("http://", "ws://")
    return f"{base}/v1/text-to-speech/{voice}/multi-stream-input?model_id=eleven_flash_v2_5&output_format={fmt}"


async def _until_final(ws, context_id: str) -> list[dict[str, Any]]:
    got = []
    async for msg in ws:
        data = json.loads(msg.data)
        got.append(data)
        if data.get("contextId") == context_id and data.get("isFinal"):
            return got
    raise AssertionError(f"closed before isFinal of {context_id}: {got[-3:]}")


def _audio(got: list[dict[str, Any]], context_id: str) -> bytes:
    return b"".join(base64.b64decode(m["audio"]) for m in got if m.get("contextId") == context_id and m.get("audio"))


async def test_flush_then_close_context_speaks_to_the_end(live: RunningServer) -> None:
    async with aiohttp.ClientSession() as http, http.ws_connect(_url(live)) as ws:
        await ws.send_json({"text": " ", "context_id": "a", "voice_settings": {"stability": 0.5}})
        await ws.send_json({"text": "The quick brown fox ", "context_id": "a"})
        await ws.send_json({"text": ""})  # a keep-alive: no reply, no effect
        await ws.send_json({"text": "jumps over the lazy dog.", "context_id": "a"})
        await ws.send_json({"context_id": "a", "flush": True})
        await ws.send_json({"context_id": "a", "close_context": True})
        got = await _until_final(ws, "a")
    assert 1.5 < len(_audio(got, "a")) / 2 / 16000 < 6, "the whole text, not cut by close_context"
    chars = "".join(c for m in got if m.get("alignment") for c in m["alignment"]["chars"])
    assert chars.split() == ["The", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog."]


async def test_close_context_mid_reply_cancels_it(live: RunningServer) -> None:
    async with aiohttp.ClientSession() as http, http.ws_connect(_url(live)) as ws:
        await ws.send_json({"text": LONG, "context_id": "old"})
        async for msg in ws:
            if json.loads(msg.data).get("audio"):
                break
        await ws.send_json({"context_id": "old", "close_context": True})
        await ws.send_json({"text": "Of course.", "context_id": "new", "flush": True})
        await ws.send_json({"context_id": "new", "close_context": True})
        got = await _until_final(ws, "new")
    final_old = next(i for i, m in enumerate(got) if m.get("contextId") == "old" and m.get("isFinal"))
    first_new = next(i for i, m in enumerate(got) if m.get("contextId") == "new")
    assert final_old < first_new
    assert [m for m in got[final_old + 1 :] if m.get("contextId") == "old"] == []
    assert len(_audio(got, "new")) / 2 / 16000 > 0.4


async def test_mp3_and_ulaw_formats(live: RunningServer) -> None:
    import av

    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(_url(live, fmt="mp3_22050_32")) as ws:
            await ws.send_json({"text": "Hello there, how are you?", "context_id": "m", "flush": True})
            await ws.send_json({"context_id": "m", "close_context": True})
            mp3 = _audio(await _until_final(ws, "m"), "m")
        async with http.ws_connect(_url(live, fmt="ulaw_8000")) as ws:
            await ws.send_json({"text": "Hello there, how are you?", "context_id": "u", "flush": True})
            await ws.send_json({"context_id": "u", "close_context": True})
            ulaw = _audio(await _until_final(ws, "u"), "u")
    with av.open(io.BytesIO(mp3)) as container:
        seconds = sum(f.samples / f.sample_rate for f in container.decode(audio=0))
    assert seconds == pytest.approx(len(ulaw) / 8000, rel=0.25)
    assert 0.8 < seconds < 4


def test_alignment_lets_a_client_rebuild_the_word_times() -> None:
    """Pipecat's reading: times restart per message, the clock advances by the message's span."""
    batches = [[Word("Hello", 0.05, 0.4), Word("there,", 0.45, 0.8)], [Word("friend.", 1.1, 1.6)]]
    clock = cumulative = 0.0
    rebuilt = []
    for words in batches:
        align, clock = alignment(words, clock)
        text, starts = "".join(align["chars"]), align["charStartTimesMs"]
        offset = 0
        for token in text.split(" ")[:-1]:
            rebuilt.append((token, cumulative + starts[offset] / 1000))
            offset += len(token) + 1
        cumulative += (starts[-1] + align["charDurationsMs"][-1]) / 1000
    assert [w for w, _ in rebuilt] == ["Hello", "there,", "friend."]
    assert [t for _, t in rebuilt] == pytest.approx([0.05, 0.45, 1.1], abs=0.002)
    assert cumulative == pytest.approx(clock) == pytest.approx(1.6, abs=0.002)


async def test_errors_the_key_and_a_connection_that_goes_on(engine) -> None:
    voices = VoiceMap({"known": engine.default_voice}, strict=True)
    async with running_server(engine, config=ServerConfig(api_key=API_KEY, voice_map=voices)) as srv:
        key = {"xi-api-key": API_KEY}
        async with aiohttp.ClientSession() as http:
            for url, headers, status in [
                (_url(srv, voice="known"), {"xi-api-key": "wrong"}, 401),
                (_url(srv, voice="known", fmt="opus_48000_64"), key, 400),
                (_url(srv, voice="known", fmt="pcm_12345"), key, 400),
                (_url(srv, voice="nobody"), key, 400),
            ]:
                with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                    await http.ws_connect(url, headers=headers)
                assert info.value.status == status, url
            async with http.ws_connect(_url(srv, voice="known"), headers=key) as ws:
                await ws.send_str("{not json")
                await ws.send_json({"text": 5, "context_id": "x"})
                for _ in range(2):
                    reply = json.loads((await ws.receive()).data)
                    assert reply["error"] == "invalid_request" and reply["message"]
                await ws.send_json({"text": "Hi.", "context_id": "ok", "flush": True})
                await ws.send_json({"context_id": "ok", "close_context": True})
                assert _audio(await _until_final(ws, "ok"), "ok")
                await ws.send_json({"close_socket": True})
                assert (await ws.receive()).type == aiohttp.WSMsgType.CLOSE
