"""The demo room over WebRTC: an aiortc client stands in for the browser, hears the greeting, talks over it.

Real: the room's signalling (``/start``, ``/sessions/{id}/api/offer``), Pipecat's SmallWebRTC
transport (Opus over loopback), Silero VAD, Whisper, the streamvox server and voice. Fake: the LLM.
"""

from __future__ import annotations

import asyncio
import fractions
import os
import time

import aiohttp
import numpy as np
import pytest
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription
from av import AudioFrame

from tests.pipecat.harness import counting_server, fake_llm, room_server
from tts_service.client import TTSClient

BARGE_IN = "Wait, stop. I would rather take the train, please."
RATE = 16000
SAMPLES = 320  # 20 ms


class Microphone(MediaStreamTrack):
    """A microphone that plays queued 16 kHz PCM in real time, silence otherwise."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._pending = b""
        self._start: float | None = None
        self._pts = 0
        self.speech_ended_at = 0.0

    def say(self, pcm: bytes) -> None:
        self._pending += pcm

    async def recv(self) -> AudioFrame:
        if self._start is None:
            self._start = time.monotonic()
        self._pts += SAMPLES
        await asyncio.sleep(max(0.0, self._start + self._pts / RATE - time.monotonic()))
        chunk, self._pending = self._pending[: 2 * SAMPLES], self._pending[2 * SAMPLES :]
        if chunk and not self._pending:
            self.speech_ended_at = time.monotonic()
        frame = AudioFrame(format="s16", layout="mono", samples=SAMPLES)
        frame.planes[0].update(chunk.ljust(2 * SAMPLES, b"\0"))
        frame.sample_rate = RATE
        frame.pts = self._pts
        frame.time_base = fractions.Fraction(1, RATE)
        return frame


@pytest.mark.slow
async def test_browser_hears_the_greeting_and_silences_it_by_talking(engine):
    from pipelines.pipecat_agent import AgentConfig

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    async with counting_server(engine) as tts_server, fake_llm() as (llm_url, requests):
        async with TTSClient(tts_server.ws_url) as client:
            ctx = await client.open(text=BARGE_IN, sample_rate=RATE, pace=False)
            await ctx.end()
            barge_in = await ctx.collect()
        config = AgentConfig(tts_url=tts_server.ws_url, llm_base_url=llm_url, llm_model="fake")
        async with room_server(config) as (base, agents), aiohttp.ClientSession() as http:
            async with http.get(f"{base}/client/") as page:
                assert page.status == 200, "no prebuilt page"
            async with http.post(f"{base}/start", json={}) as resp:
                session = (await resp.json())["sessionId"]

            heard: list[tuple[float, float]] = []  # (time, rms) of every 20 ms the browser received
            pc = RTCPeerConnection()
            mic = Microphone()
            pc.addTrack(mic)
            readers: list[asyncio.Task] = []

            @pc.on("track")
            def on_track(track) -> None:
                async def read() -> None:
                    while True:
                        frame = await track.recv()
                        pcm = frame.to_ndarray().astype(np.float32) / 32768.0
                        heard.append((time.monotonic(), float(np.sqrt(np.mean(pcm**2)))))

                readers.append(asyncio.create_task(read()))

            await pc.setLocalDescription(await pc.createOffer())
            offer = {"sdp": pc.localDescription.sdp, "type": pc.localDescription.type}
            async with http.post(f"{base}/sessions/{session}/api/offer", json=offer) as resp:
                answer = await resp.json()
            await pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))

            async def first(pred, timeout: float, what: str) -> float:
                deadline = time.monotonic() + timeout
                while time.monotonic() < deadline:
                    for t, rms in heard:
                        if pred(t, rms):
                            return t
                    await asyncio.sleep(0.02)
                raise AssertionError(f"timed out waiting for {what}")

            try:
                greeting_at = await first(lambda t, rms: rms > 0.01, 30, "the greeting")
                await asyncio.sleep(1.2)  # the greeting is ~5 s long: talk over it
                barge_at = time.monotonic()
                mic.say(barge_in)
                await asyncio.sleep(len(barge_in) / 2 / RATE + 0.3)
                spoken_end = mic.speech_ended_at
            finally:
                for task in readers:
                    task.cancel()
                await pc.close()

    # the greeting was heard, and it stopped while the user was still talking
    voiced_before = [t for t, rms in heard if greeting_at <= t < barge_at and rms > 0.01]
    assert len(voiced_before) > 20, "less than 0.4 s of greeting audio"
    silenced_at = _silenced_at([(t, rms) for t, rms in heard if t >= barge_at], barge_at)
    assert silenced_at - barge_at < 2.0, f"the agent kept talking {silenced_at - barge_at:.2f} s into the barge-in"
    # The barge-in has pauses ("Wait, stop. I would rather ..."), so the agent may take a turn and
    # answer within one. Audio heard before it asked the LLM again can only be the stale greeting;
    # an answer that started in a pause yields when the caller goes on.
    next_turn = min((r["_received_at"] for r in requests if r["_received_at"] > silenced_at), default=spoken_end)
    stale = [round(t - barge_at, 2) for t, rms in heard if silenced_at < t < min(next_turn, spoken_end) and rms > 0.01]
    assert stale == [], f"the greeting came back after it was silenced, at {stale} s into the barge-in"
    answers = _voiced_runs([(t, rms) for t, rms in heard if next_turn <= t < spoken_end])
    assert all(end - start < 1.0 for start, end in answers), f"an answer talked over the caller: {answers}"
    tts = agents[0].tts
    assert tts.stats.cancels >= 1 and tts.stats.cancel_acks >= 1 and tts.stats.connections == 1
    print(f"browser: agent silent {silenced_at - barge_at:.2f} s after the user started talking (VAD included)")


QUIET_S = 0.3  # longer than the dips between the greeting's words


def _silenced_at(heard: list[tuple[float, float]], since: float) -> float:
    """The last voiced 20 ms before the first ``QUIET_S`` of quiet (``since`` when none was voiced)."""
    last_voiced = since
    for t, rms in heard:
        if t - last_voiced >= QUIET_S:
            return last_voiced
        if rms > 0.01:
            last_voiced = t
    return last_voiced


def _voiced_runs(heard: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(start, end) of each stretch of voiced audio, split at ``QUIET_S`` of quiet."""
    runs: list[tuple[float, float]] = []
    for t, rms in heard:
        if rms <= 0.01:
            continue
        if runs and t - runs[-1][1] < QUIET_S:
            runs[-1] = (runs[-1][0], t)
        else:
            runs.append((t, t))
    return runs
