"""The demo room over WebRTC: an aiortc client stands in for the browser, hears the greeting, talks over it.

Real: the room's signalling (``/start``, ``/sessions/{id}/api/offer``), Pipecat's SmallWebRTC
transport (Opus over loopback), Silero VAD, Whisper, the streamvox server and voice. Fake: the LLM.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time

import aiohttp
import pytest

from agent.webrtc_uplink import PATIENCE, AudioReorderBuffer
from support.pipecat_harness import (
    RATE,
    VOICED,
    counting_server,
    fake_llm,
    first_time,
    room_server,
    silenced_at,
    speech,
    voiced_runs,
    webrtc_call,
)

BARGE_IN = "Wait, stop. I would rather take the train, please."


@pytest.mark.slow
@pytest.mark.parametrize("loss_every", [0, 50], ids=["no-loss", "2pct-uplink-loss"])
async def test_browser_hears_the_greeting_and_silences_it_by_talking(engine, loss_every):
    from pipelines.pipecat_agent import AgentConfig

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    async with counting_server(engine) as tts_server, fake_llm() as (llm_url, requests):
        barge_in = await speech(tts_server.ws_url, BARGE_IN)
        config = AgentConfig(tts_url=tts_server.ws_url, llm_base_url=llm_url, llm_model="fake")
        async with room_server(config) as (base, agents), aiohttp.ClientSession() as http:
            async with http.get(f"{base}/client/") as page:
                assert page.status == 200, "no prebuilt page"
            async with webrtc_call(http, base, loss_every=loss_every) as call:
                heard, mic, uplink = call.heard, call.mic, call.uplink  # heard: every 20 ms the browser received

                greeting_at = await first_time(heard, lambda t, rms: rms > VOICED, 30, "the greeting")
                await asyncio.sleep(1.2)  # the greeting is ~5 s long: talk over it
                barge_at = time.monotonic()
                mic.say(barge_in)
                await asyncio.sleep(len(barge_in) / 2 / RATE + 0.3)
                spoken_end = mic.speech_ended_at
                # the agent's receivers (live until the connection closes), for the lossy case
                buffers = _live_reorder_buffers()

    # the greeting was heard, and it stopped while the user was still talking
    voiced_before = [t for t, rms in heard if greeting_at <= t < barge_at and rms > VOICED]
    assert len(voiced_before) > 20, "less than 0.4 s of greeting audio"
    went_quiet = silenced_at([(t, rms) for t, rms in heard if t >= barge_at], barge_at)
    assert went_quiet - barge_at < 2.0, f"the agent kept talking {went_quiet - barge_at:.2f} s into the barge-in"
    # The barge-in has pauses ("Wait, stop. I would rather ..."), so the agent may take a turn and
    # answer within one. Audio heard before it asked the LLM again can only be the stale greeting;
    # an answer that started in a pause yields when the caller goes on.
    next_turn = min((r["_received_at"] for r in requests if r["_received_at"] > went_quiet), default=spoken_end)
    stale = [round(t - barge_at, 2) for t, rms in heard if went_quiet < t < min(next_turn, spoken_end) and rms > VOICED]
    assert stale == [], f"the greeting came back after it was silenced, at {stale} s into the barge-in"
    answers = voiced_runs([(t, rms) for t, rms in heard if next_turn <= t < spoken_end])
    assert all(end - start < 1.0 for start, end in answers), f"an answer talked over the caller: {answers}"
    # the loss happened: one packet in loss_every of the ~6 s the client sent (a loaded machine sends
    # fewer in that time: 4 at four test workers on two cores), so at least 3
    assert uplink.dropped >= (3 if loss_every else 0), uplink.dropped
    if loss_every:  # it gave the lost packets up and did not fall behind (aiortc's holds ~15 from the first)
        seen = [(b.given_up, b.waiting) for b in buffers]
        assert any(given_up >= 3 and waiting <= PATIENCE for given_up, waiting in seen), seen
    tts = agents[0].tts
    assert tts.stats.cancels >= 1 and tts.stats.cancel_acks >= 1 and tts.stats.connections == 1
    print(f"browser: agent silent {went_quiet - barge_at:.2f} s after the user started talking (VAD included)")


def _live_reorder_buffers() -> list[AudioReorderBuffer]:
    found = []
    for obj in gc.get_objects():
        try:
            if isinstance(obj, AudioReorderBuffer):
                found.append(obj)
        except ReferenceError:  # a dead weak proxy
            continue
    return found


@pytest.mark.slow
async def test_a_page_on_loudspeakers_gets_the_agents_echo_canceller(engine):
    """STREAMVOX_ECHO_CANCEL=auto (the default): the page says in ``/start`` which echo mode it is in:
    on loudspeakers it asks the browser for echo cancellation ("browser-aec") or sends the raw
    microphone for the agent to cancel ("agent-aec", its default); with headphones the raw microphone
    ("raw-mic"). The two loudspeaker calls get the agent's canceller (a browser whose canceller lets
    the echo through made the agent interrupt itself ~16 times in 30 s), the headphones call and a
    client that says nothing do not."""
    from pipelines.pipecat_agent import AgentConfig
    from pipelines.room_limits import RoomLimits

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    async with counting_server(engine) as tts_server, fake_llm() as (llm_url, _requests):
        # four calls one after the other: a closed call's line may not be free yet when the next starts
        room = RoomLimits(max_calls=4)
        config = AgentConfig(tts_url=tts_server.ws_url, llm_base_url=llm_url, llm_model="fake", room=room)
        assert config.echo_cancel == "auto"
        async with room_server(config) as (base, agents), aiohttp.ClientSession() as http:
            for n, mode in enumerate(("browser-aec", "agent-aec", "raw-mic", None)):
                async with webrtc_call(http, base, echo_mode=mode):
                    deadline = time.monotonic() + 20
                    while len(agents) <= n and time.monotonic() < deadline:
                        await asyncio.sleep(0.05)
                    assert len(agents) > n, f"no agent for the {mode} call"
                    assert (agents[n].echo is not None) == (mode in ("browser-aec", "agent-aec")), mode
