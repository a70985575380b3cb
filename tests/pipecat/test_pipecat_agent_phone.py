"""The Pipecat agent on a phone line: a Twilio media-stream client talks to it, then barges in.

Real: Silero VAD, Whisper tiny.en, the streamvox server and voice, Pipecat's FastAPI WebSocket
transport with the Twilio serializer. Fake: only the LLM (an OpenAI-compatible endpoint that
streams a canned reply), as a cloud LLM would be.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
import uuid

import numpy as np
import pytest
import websockets

from support.pipecat_harness import counting_server, fake_llm, first_time, room_server, speech

QUESTION = "What is the capital of France?"
BARGE_IN = "Wait, stop. I would rather take the train, please."
CHUNK = 160  # 20 ms of 8 kHz mu-law, what Twilio sends
MULAW_SILENCE = b"\xff" * CHUNK


def _mulaw_rms(payload: bytes) -> float:
    import audioop  # deprecated in 3.13, fine for a test on 3.11

    return audioop.rms(audioop.ulaw2lin(payload, 2), 2) / 32768.0


@pytest.mark.slow
async def test_phone_call_answers_and_clears_on_barge_in(engine):
    from pipelines.pipecat_agent import AgentConfig

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    async with counting_server(engine) as tts_server, fake_llm() as (llm_url, llm_requests):
        question = await speech(tts_server.ws_url, QUESTION, sample_rate=8000, encoding="mulaw")
        barge_in = await speech(tts_server.ws_url, BARGE_IN, sample_rate=8000, encoding="mulaw")
        config = AgentConfig(tts_url=tts_server.ws_url, llm_base_url=llm_url, llm_model="fake", greeting=None)
        async with room_server(config) as (base, agents):
            url = base.replace("http://", "ws://") + "/ws"
            stream_sid = f"MZ{uuid.uuid4().hex}"
            events: list[tuple[float, dict]] = []
            outgoing: asyncio.Queue[bytes] = asyncio.Queue()
            speech_end = {"t": 0.0}
            async with websockets.connect(url) as ws:
                await ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
                start = {
                    "streamSid": stream_sid,
                    "accountSid": "AC0",
                    "callSid": f"CA{uuid.uuid4().hex}",
                    "tracks": ["inbound"],
                    "customParameters": {},
                    "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
                }
                hello = {"event": "start", "sequenceNumber": "1", "start": start, "streamSid": stream_sid}
                await ws.send(json.dumps(hello))

                async def send_audio() -> None:
                    # Twilio streams the caller continuously in 20 ms packets: silence between words.
                    next_at = time.monotonic()
                    seq = 2
                    pending = b""
                    while True:
                        if not pending and not outgoing.empty():
                            pending = outgoing.get_nowait()
                        chunk, pending = (pending[:CHUNK], pending[CHUNK:]) if pending else (MULAW_SILENCE, b"")
                        chunk = chunk.ljust(CHUNK, b"\xff")
                        if not pending and chunk is not MULAW_SILENCE:
                            speech_end["t"] = time.monotonic()
                        payload = base64.b64encode(chunk).decode()
                        media = {"track": "inbound", "chunk": str(seq), "timestamp": str(seq * 20), "payload": payload}
                        msg = {"event": "media", "sequenceNumber": str(seq), "media": media, "streamSid": stream_sid}
                        await ws.send(json.dumps(msg))
                        seq += 1
                        next_at += 0.02
                        await asyncio.sleep(max(0.0, next_at - time.monotonic()))

                async def receive() -> None:
                    async for raw in ws:
                        events.append((time.monotonic(), json.loads(raw)))

                async def until(pred, timeout: float, what: str) -> float:
                    return await first_time(
                        events, pred, timeout, lambda: f"{what}; events: {[e['event'] for _, e in events]}"
                    )

                def voiced(t: float, ev: dict) -> bool:
                    return ev["event"] == "media" and _mulaw_rms(base64.b64decode(ev["media"]["payload"])) > 0.01

                tasks = [asyncio.create_task(send_audio()), asyncio.create_task(receive())]
                try:
                    await asyncio.sleep(1.0)  # the caller says hello... after a second of line noise
                    outgoing.put_nowait(question)
                    first_audio = await until(voiced, 30, "the agent's answer")
                    await asyncio.sleep(1.5)  # the agent is mid-answer ...
                    barge_at = time.monotonic()
                    outgoing.put_nowait(barge_in)  # ... and the caller talks over it
                    cleared = await until(lambda t, ev: ev["event"] == "clear" and t > barge_at, 10, "clear")
                    await until(lambda t, ev: barge_at < speech_end["t"] < t - 0.3, 10, "the end of the barge-in")
                    # Audio sent before the LLM was asked for the next reply can only be the
                    # interrupted one (with a fast STT and this instant LLM the next reply may
                    # start within 0.3 s of the caller's last word, so no fixed window works).
                    await until(lambda t, ev: any(r["_received_at"] > cleared for r in llm_requests), 30, "a new turn")
                    next_turn = min(r["_received_at"] for r in llm_requests if r["_received_at"] > cleared)
                    stale = [t - cleared for t, ev in events if cleared < t < next_turn and voiced(t, ev)]
                    await until(lambda t, ev: t > next_turn and voiced(t, ev), 30, "the answer to the barge-in")
                finally:
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)

            answer = b"".join(
                base64.b64decode(ev["media"]["payload"]) for t, ev in events if ev["event"] == "media" and t < cleared
            )
            for agent in agents:
                await agent.worker.cancel()

    assert first_audio > 0 and len(answer) / 8000 > 1.0, "less than a second of answer before the barge-in"
    assert stale == [], f"{len(stale)} voiced media packets of the interrupted reply after 'clear'"
    assert cleared - barge_at < 3.0, f"clear came {cleared - barge_at:.2f} s after the caller started talking"
    # Whisper heard the caller: the LLM was asked the question, then the barge-in
    users = [m["content"] for r in llm_requests for m in r["messages"] if m["role"] == "user"]
    assert any("capital" in u.lower() and "france" in u.lower() for u in users), users
    assert len(llm_requests) >= 2
    # one TTS connection for the whole call, one acknowledged cancel
    assert tts_server.ws_connections == 1 + 2  # + the two connections that synthesised the caller's speech
    assert agents[0].tts.stats.connections == 1 and agents[0].tts.stats.cancel_acks >= 1
    print(
        f"clear {1000 * (cleared - barge_at):.0f} ms after the caller's barge-in started "
        f"(VAD onset included); figures: {agents[0].figures.bargeins}"
    )
    assert np.isfinite(first_audio)
