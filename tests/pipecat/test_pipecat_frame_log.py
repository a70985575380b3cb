"""``STREAMVOX_FRAME_LOG``: a real phone call through the agent writes its frame timeline, and the
summary reads where each turn's time went.

Real: Silero VAD, Whisper tiny.en, the streamvox server and voice, Pipecat's Twilio transport.
Fake: the LLM (an OpenAI-compatible endpoint streaming a canned reply, word by word).
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from pipelines import pipecat_frame_log as frame_log
from support.pipecat_harness import counting_server, fake_llm, first_time, room_server, speech, twilio_call, voiced

QUESTION = "What is the capital of France?"


@pytest.mark.slow
async def test_a_call_writes_its_timeline_and_the_summary_reads_each_turn(engine, tmp_path, capsys) -> None:
    from pipelines.pipecat_agent import AgentConfig

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path = tmp_path / "frames.jsonl"
    async with counting_server(engine) as tts_server, fake_llm() as (llm_url, requests):
        question = await speech(tts_server.ws_url, QUESTION, sample_rate=8000, encoding="mulaw")
        config = AgentConfig(
            tts_url=tts_server.ws_url, llm_base_url=llm_url, llm_model="fake", greeting=None, frame_log=str(path)
        )
        async with room_server(config) as (base, _agents):
            async with twilio_call(base) as caller:
                await asyncio.sleep(1.0)
                put_at = time.monotonic()
                caller.outgoing.put_nowait(question)
                await first_time(caller.events, lambda t, ev: t > put_at + 1 and voiced(ev), 30, "the answer")
                await asyncio.sleep(0.5)
            await asyncio.sleep(0.5)  # the agent sees the hang-up and closes its log
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len({r["call"] for r in records}) == 1
    kinds = [r["frame"] for r in records]
    assert {"VADUserStoppedSpeakingFrame", "TranscriptionFrame", "LLMTextFrame", "TTSFirstAudio"} <= set(kinds)
    assert kinds.count("TTSFirstAudio") == kinds.count("TTSStartedFrame")  # one per reply, not one per frame
    (turn,) = frame_log.turns(records)
    assert "capital" in turn["text"].lower(), turn
    # in order, after the VAD stop; the tokens before the first audio came one word at a time
    assert 0 < turn["stt"] <= turn["llm_first"] <= turn["first_audio"] <= turn["bot_started"] < 10_000, turn
    assert turn["tokens"] >= 1 and requests, turn

    assert frame_log.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "ms after the VAD stop" in out and "capital" in out.lower()
    assert frame_log.main([str(tmp_path / "none.jsonl")]) == 2
    (tmp_path / "junk.jsonl").write_text("not json\n")
    assert frame_log.main([str(tmp_path / "junk.jsonl")]) == 2
    assert "not a frame log" in capsys.readouterr().out
