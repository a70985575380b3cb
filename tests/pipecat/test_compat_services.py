"""Pipecat's own hosted-TTS services, pointed at a local streamvox by URL only.

``OpenAITTSService(base_url=...)``, ``CartesiaTTSService(url=...)`` and
``ElevenLabsTTSService(url=...)`` run unchanged in ``run_test`` pipelines against the real server
on loopback, with an interruption in the middle of a reply. Asserted exactly: no audio frame of
the interrupted context after the ``InterruptionFrame``, the next reply spoken, and for the
WebSocket services one connection for both replies and the cancel done on the server.
"""

from __future__ import annotations

import numpy as np
from pipecat.frames.frames import ErrorFrame, InterruptionFrame, TTSAudioRawFrame, TTSStoppedFrame
from pipecat.tests.utils import SleepFrame, run_test

from support.pipecat_harness import llm_reply
from support.tts_helpers import eventually
from tests.tts_service.compat_helpers import counted_server

REPLY = "Sure, I can help with that. Your booking is moved to Tuesday afternoon at three."
LONG_REPLY = (
    "Let me walk you through the three options we have for your trip next week. "
    "The first one leaves early in the morning and arrives just before lunch, with one change in the middle. "
    "The second one is a direct connection in the afternoon, which is a little more expensive."
)
NEXT_REPLY = "Of course, the direct one it is."


def _audio(frames, context_id=None) -> list[TTSAudioRawFrame]:
    return [f for f in frames if isinstance(f, TTSAudioRawFrame) and (context_id is None or f.context_id == context_id)]


def _seconds(frames: list[TTSAudioRawFrame]) -> float:
    return sum(len(f.audio) / 2 / f.sample_rate for f in frames)


def _rms(frames: list[TTSAudioRawFrame]) -> float:
    pcm = np.frombuffer(b"".join(f.audio for f in frames), dtype="<i2").astype(np.float32) / 32768
    return float(np.sqrt(np.mean(pcm**2))) if pcm.size else 0.0


async def _interrupted(tts, *, wait_s: float = 1.5):
    """A long reply cut mid-way, then a short one: (frames before the cut, after it, the old context)."""
    frames = [
        *llm_reply(LONG_REPLY),
        SleepFrame(sleep=wait_s),
        InterruptionFrame(),
        SleepFrame(sleep=0.5),
        *llm_reply(NEXT_REPLY),
        SleepFrame(sleep=3.0),
    ]
    down, _ = await run_test(tts, frames_to_send=frames)
    assert not [f for f in down if isinstance(f, ErrorFrame)], [f.error for f in down if isinstance(f, ErrorFrame)]
    cut = next(i for i, f in enumerate(down) if isinstance(f, InterruptionFrame))
    before, after = down[:cut], down[cut + 1 :]
    old = {f.context_id for f in _audio(before)}
    assert len(old) == 1, old
    (old_id,) = old
    assert _audio(after, old_id) == [], "audio of the interrupted context after the InterruptionFrame"
    new = _audio(after)
    assert new and old_id not in {f.context_id for f in new}
    assert _seconds(new) > 1.0 and _rms(new) > 0.01, "the next reply is spoken"
    return before, after, old_id


# ---------------------------------------------------------------- OpenAI


async def test_openai_service_speaks_and_an_interruption_stops_the_request(engine):
    from pipecat.services.openai.tts import OpenAITTSService

    async with counted_server(engine) as srv:
        tts = OpenAITTSService(api_key="unused", base_url=srv.http_url + "/v1", sample_rate=24000)
        down, _ = await run_test(tts, frames_to_send=[*llm_reply(REPLY), SleepFrame(sleep=1.0)])
        audio = _audio(down)
        assert {f.sample_rate for f in audio} == {24000}
        assert 2.0 < _seconds(audio) < 12.0 and _rms(audio) > 0.01
        assert any(isinstance(f, TTSStoppedFrame) for f in down)
        assert srv.requests["/v1/audio/speech"] == 2, "one request per sentence, as against OpenAI"

        tts = OpenAITTSService(api_key="unused", base_url=srv.http_url + "/v1", sample_rate=24000)
        await _interrupted(tts, wait_s=1.0)
        # the interrupted sentence's request was dropped by the client: its work stopped on the server
        await eventually(lambda: srv.srv.synth.scheduler.active == 0, timeout=5.0)


# ---------------------------------------------------------------- Cartesia


async def test_cartesia_service_keeps_one_connection_across_an_interruption(engine):
    from pipecat.services.cartesia.tts import CartesiaTTSService

    async with counted_server(engine) as srv:
        tts = CartesiaTTSService(
            api_key="unused",
            url=srv.ws_base + "/tts/websocket",
            sample_rate=16000,
            settings=CartesiaTTSService.Settings(voice="a0e99841-438c-4a64-b679-ae501e7d6091"),  # a Cartesia id
        )
        before, after, _ = await _interrupted(tts)
        assert {f.sample_rate for f in _audio(before + after)} == {16000}
        assert srv.requests["/tts/websocket"] == 1, "one connection for both replies and the cancel"
        assert srv.cancels_acked == 1, "the interruption cancelled the context on the server"
        words = [f.text for f in after if type(f).__name__ == "TTSTextFrame"]
        assert [w.strip(",.").lower() for w in words] == [w.strip(",.").lower() for w in NEXT_REPLY.split()]


# ---------------------------------------------------------------- ElevenLabs


async def test_elevenlabs_service_keeps_one_connection_across_an_interruption(engine):
    from pipecat.services.elevenlabs.tts import ElevenLabsTTSService

    async with counted_server(engine) as srv:
        tts = ElevenLabsTTSService(
            api_key="unused",
            url=srv.ws_base,
            sample_rate=16000,
            settings=ElevenLabsTTSService.Settings(voice="21m00Tcm4TlvDq8ikWAM"),  # an ElevenLabs voice id
        )
        before, after, _ = await _interrupted(tts)
        assert {f.sample_rate for f in _audio(before + after)} == {16000}
        paths = [p for p in srv.requests if p.endswith("/multi-stream-input")]
        assert paths == ["/v1/text-to-speech/21m00Tcm4TlvDq8ikWAM/multi-stream-input"]
        assert srv.requests[paths[0]] == 1, "one connection for both replies and the cancel"
        assert srv.cancels_acked == 1, "close_context in mid-reply cancelled the context on the server"
        words = [f.text for f in after if type(f).__name__ == "TTSTextFrame"]
        assert [w.strip(",.").lower() for w in words] == [w.strip(",.").lower() for w in NEXT_REPLY.split()]
        assert any(isinstance(f, TTSStoppedFrame) for f in after), "the second reply ended with isFinal"
