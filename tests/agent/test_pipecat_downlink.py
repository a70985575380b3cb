"""The WebRTC downlink: Pipecat's real ``RawAudioTrack`` paced by the wall clock, written to the way
Pipecat's output transport writes (await each write, then other work before the next), sends gaps
of silence inside the agent's audio; written one chunk ahead it sends none. An interruption leaves
nothing queued; audio senders encode on the loop.

Real: Pipecat's ``RawAudioTrack`` (its 10 ms pacing and its silence), aiortc's ``RTCPeerConnection``.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from aiortc import RTCPeerConnection
from aiortc.mediastreams import AudioStreamTrack
from pipecat.transports.smallwebrtc.transport import RawAudioTrack

from agent import pipecat_downlink
from agent.pipecat_downlink import DownlinkStats, _EncodeInline, drop_queued, stats

RATE = 16000
CHUNK = np.full(RATE * 40 // 1000, 1000, np.int16).tobytes()  # 40 ms, as Pipecat's output writes


@pytest.fixture
def mode():
    """Install a mode for the test; the default (what the demo room installs) afterwards."""
    yield pipecat_downlink.install
    pipecat_downlink.install()


async def _play(track: RawAudioTrack, chunks: int, busy_s: float) -> DownlinkStats:
    """A writer as Pipecat's output transport (await the write, then ``busy_s`` of other awaits before
    the next: pushing the frame on, the next frame's handling) and aiortc's sender pulling 10 ms."""

    written = asyncio.Event()

    async def writer() -> None:
        for _ in range(chunks):
            await track.add_audio_bytes(CHUNK)
            await asyncio.sleep(busy_s)
        written.set()

    async def sender() -> None:
        while not (written.is_set() and not track._chunk_queue):
            await track.recv()
        for _ in range(10):  # and silence after the audio
            await track.recv()

    await asyncio.wait_for(asyncio.gather(writer(), sender()), 30)
    return stats(track)


async def test_pipecats_pacing_sends_gaps_inside_the_audio_and_one_chunk_ahead_sends_none(mode) -> None:
    mode("pipecat")
    before = await _play(RawAudioTrack(RATE), chunks=40, busy_s=0.015)
    mode("even")
    after = await _play(RawAudioTrack(RATE), chunks=40, busy_s=0.015)
    # every chunk's end waited for the writer's 15 ms: about one gap per chunk before
    assert before.gaps >= 20, str(before)
    assert after.gaps <= 2, str(after)
    assert before.audio_pieces == after.audio_pieces == 160  # all the audio went out, either way


def test_the_gap_count_takes_only_short_silence_between_audio() -> None:
    st = DownlinkStats()
    for audio in [False] * 20 + [True] * 5 + [False] * 2 + [True] * 3 + [False] * 40 + [True] + [False] * 3:
        st.sent(audio)
    # the call's leading silence, a 400 ms pause and the trailing silence are not gaps
    assert (st.gaps, st.gap_pieces, st.audio_pieces) == (1, 2, 9)
    assert str(st) == "1 gaps of silence inside the agent's audio (20 ms) in 0.1 s of it"


async def test_an_interruption_leaves_nothing_queued_and_a_waiting_writer_goes_on(mode) -> None:
    mode("even")
    track = RawAudioTrack(RATE)
    await track.add_audio_bytes(CHUNK)  # plays now: the writer is not held
    waiting = asyncio.ensure_future(track.add_audio_bytes(CHUNK))  # held until the first is sent
    await asyncio.sleep(0)
    assert not waiting.done() and len(track._chunk_queue) == 8
    drop_queued(track)
    await asyncio.wait_for(waiting, 1.0)  # the writer goes on to whatever comes next
    frame = await track.recv()
    assert not np.frombuffer(bytes(frame.planes[0]), np.int16).any(), "silence after the interruption"
    assert stats(track).audio_pieces == 0 and stats(track).dropped == 8


async def test_a_cancelled_writer_drops_what_it_wrote_ahead(mode) -> None:
    mode("even")
    track = RawAudioTrack(RATE)
    await track.add_audio_bytes(CHUNK)
    waiting = asyncio.ensure_future(track.add_audio_bytes(CHUNK))
    await asyncio.sleep(0)
    waiting.cancel()  # Pipecat's write timeout, or the call's end
    await asyncio.sleep(0)
    assert not track._chunk_queue


async def test_audio_senders_encode_on_the_loop(mode) -> None:
    mode("even")
    pc = RTCPeerConnection()
    try:
        pc.addTrack(AudioStreamTrack())
        (sender,) = pc.getSenders()
        assert isinstance(sender._RTCRtpSender__loop, _EncodeInline)
        done = sender._RTCRtpSender__loop.run_in_executor(None, lambda a, b: a + b, 2, 3)
        assert done.done() and await done == 5
        failed = sender._RTCRtpSender__loop.run_in_executor(None, lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            await failed
    finally:
        await pc.close()
    mode("pipecat")
    pc = RTCPeerConnection()
    try:
        pc.addTrack(AudioStreamTrack())
        assert not isinstance(pc.getSenders()[0]._RTCRtpSender__loop, _EncodeInline)
    finally:
        await pc.close()


def test_a_bad_mode_fails_in_one_line(monkeypatch) -> None:
    monkeypatch.setenv(pipecat_downlink.ENV, "fast")
    with pytest.raises(ValueError, match="STREAMVOX_WEBRTC_DOWNLINK='fast'"):
        pipecat_downlink.downlink_mode()
