"""The WebRTC uplink: aiortc's real audio receiver, with our buffer, hands each packet on as soon as
it is in order, gives a lost one up, never falls behind after one; video keeps aiortc's buffer.

Real: aiortc's receiver, its jitter buffer (the comparison), its Opus encoder and decoder.
"""

from __future__ import annotations

import fractions

import aiortc.rtcrtpreceiver as receiver
import numpy as np
import pytest
from aiortc.codecs.opus import OpusEncoder
from aiortc.jitterbuffer import JitterBuffer, JitterFrame
from aiortc.rtcrtpparameters import RTCRtpCodecParameters
from aiortc.rtp import RtpPacket
from av import AudioFrame

from agent import webrtc_uplink
from agent.webrtc_uplink import AudioReorderBuffer, FrameBatch

OPUS = RTCRtpCodecParameters(mimeType="audio/opus", clockRate=48000, channels=2, payloadType=111)


@pytest.fixture
def restore_aiortc():
    """aiortc's own classes during the test (the demo room, built by earlier tests in this process,
    may have installed ours already), and whatever was there afterwards."""
    before = receiver.JitterBuffer, receiver.get_decoder
    webrtc_uplink.release_audio_sooner("aiortc")
    yield
    receiver.JitterBuffer, receiver.get_decoder = before


def _packet(seq: int, payload: bytes = b"x") -> RtpPacket:
    packet = RtpPacket(payload_type=111, sequence_number=seq & 0xFFFF, timestamp=(960 * seq) & 0xFFFFFFFF)
    packet._data = payload  # the receiver's depayloaded data, as it sets it before add()
    return packet


def _feed(buffer, order) -> tuple[list[list[int]], list[int]]:
    """Add packets in ``order``; per add, the sequence numbers released, and the count held after."""
    released, held = [], []
    for seq in order:
        _, frame = buffer.add(_packet(seq))
        parts = [] if frame is None else getattr(frame, "parts", [frame])
        released.append([(p.timestamp // 960) for p in parts])
        held.append(sum(map(len, released)))
    arrived = list(range(1, len(order) + 1))
    return released, [a - r for a, r in zip(arrived, held, strict=True)]


def _audio_buffer():
    # the receiver's own construction of its buffer, through the module global it reads
    rx = receiver.RTCRtpReceiver("audio", transport=_FakeDtls())
    return rx._RTCRtpReceiver__jitter_buffer


class _FakeDtls:
    """The receiver's constructor only registers itself with its DTLS transport's state."""

    state = "new"

    def _register_rtp_receiver(self, *_a, **_k) -> None: ...


def test_each_packet_goes_out_as_it_arrives_where_aiortc_holds_four():
    released, held = _feed(AudioReorderBuffer(), range(6))
    assert released == [[0], [1], [2], [3], [4], [5]] and set(held) == {0}
    released, held = _feed(JitterBuffer(capacity=16, prefetch=4), range(6))
    assert released == [[], [], [], [], [0], [1]]  # what the receiver asks for: frame 0 once 4 more are in


def test_a_late_packet_releases_what_waited_behind_it_at_once():
    released, held = _feed(AudioReorderBuffer(), [0, 1, 3, 2, 4, 5])
    assert released == [[0], [1], [], [2, 3], [4], [5]]
    assert held[-1] == 0  # nothing left behind: aiortc keeps one packet more from here on


def test_a_lost_packet_is_given_up_and_the_buffer_does_not_fall_behind():
    order = [s for s in range(200) if s != 50]
    buf = AudioReorderBuffer()
    released, held = _feed(buf, order)
    assert [s for r in released for s in r] == order  # in order, everything that came
    assert max(held) == webrtc_uplink.PATIENCE and held[-1] == 0 and buf.given_up == 1
    # aiortc's own (the prefetch the receiver asks for, and the 1 packet of our earlier setting)
    # ends up ~15 packets (0.3 s) behind for as long as the call lasts
    for prefetch in (4, 1):
        _, aiortc_held = _feed(JitterBuffer(capacity=16, prefetch=prefetch), order)
        assert aiortc_held[-1] >= 14, (prefetch, aiortc_held[-1])


def test_a_packet_after_it_was_given_up_is_dropped_and_order_is_kept():
    buf = AudioReorderBuffer()
    released, _ = _feed(buf, [0, 2, 3, 4, 1, 5])
    assert released == [[0], [], [], [2, 3, 4], [], [5]] and buf.late == 1 and buf.given_up == 1


def test_sequence_numbers_wrap_and_a_restarted_stream_starts_over():
    released, held = _feed(AudioReorderBuffer(), [65534, 65535, 0, 2, 1, 3])
    assert [s % 65536 for r in released for s in r] == [65534, 65535, 0, 1, 2, 3] and held[-1] == 0
    buf = AudioReorderBuffer()
    released, _ = _feed(buf, [5000, 5001, 100, 101])
    assert released == [[5000], [5001], [100], [101]]


def test_a_batch_moves_all_its_parts_with_the_receivers_timestamp_mapping():
    batch = FrameBatch([JitterFrame(b"a", 4294966336), JitterFrame(b"b", 0)])  # RTP wraps
    batch.timestamp = 960
    assert [p.timestamp for p in batch.parts] == [960, 1920] and batch.timestamp == 960


def test_the_real_receiver_gets_ours_for_audio_and_aiortcs_for_video(restore_aiortc):
    try:
        stock = _audio_buffer()
    except Exception as exc:  # aiortc's constructor changed: the setting must be re-checked by hand
        pytest.fail(f"aiortc's RTCRtpReceiver could not be built here: {exc!r}")
    assert stock._prefetch == 4  # what the setting exists for
    assert webrtc_uplink.release_audio_sooner("prompt") == "prompt"
    webrtc_uplink.release_audio_sooner("prompt")  # twice: still wraps aiortc's own, once
    assert isinstance(_audio_buffer(), AudioReorderBuffer)
    video = receiver.JitterBuffer(capacity=512, is_video=True)
    assert type(video).__module__ == "aiortc.jitterbuffer" and video._is_video
    assert webrtc_uplink.release_audio_sooner("aiortc") == "aiortc"
    assert type(_audio_buffer()).__module__ == "aiortc.jitterbuffer"


def test_the_wrapped_opus_decoder_decodes_every_part_of_a_batch(restore_aiortc):
    webrtc_uplink.release_audio_sooner("prompt")
    decoder = receiver.get_decoder(OPUS)  # the module global the receiver's decoder thread calls
    packets = _opus_packets(10)
    buf = AudioReorderBuffer()
    frames = []
    for seq in [0, 1, 3, 4, 2, 5, 6, 7, 8, 9]:  # 2 late: 2, 3 and 4 come out together
        _, encoded = buf.add(_packet(seq, packets[seq]))
        if encoded is not None:
            frames += decoder.decode(encoded)
    assert len(frames) == 10 and [f.pts for f in frames] == [960 * i for i in range(10)]
    pcm = np.concatenate([f.to_ndarray().reshape(-1, 2)[:, 0] for f in frames[2:]]).astype(np.float32) / 32768
    assert np.sqrt(np.mean(pcm**2)) > 0.1  # the tone came through: real audio, not silence


def test_an_empty_packet_is_not_handed_to_the_decoder(restore_aiortc):
    webrtc_uplink.release_audio_sooner("prompt")
    decoder = receiver.get_decoder(OPUS)
    packets = _opus_packets(4)
    buf = AudioReorderBuffer()
    frames = []
    for seq, payload in enumerate([packets[0], b"", packets[1], packets[2]]):  # padding in the middle
        _, encoded = buf.add(_packet(seq, payload))
        if encoded is not None:
            frames += decoder.decode(encoded)
    assert len(frames) == 3  # aiortc's own Opus decoder, given the empty one, fails every packet after it


def test_a_bad_packet_in_a_batch_does_not_cost_the_others(restore_aiortc, caplog):
    webrtc_uplink.release_audio_sooner("prompt")
    decoder = receiver.get_decoder(OPUS)
    good = _opus_packets(2)
    batch = FrameBatch([JitterFrame(good[0], 0), JitterFrame(b"\xff\xff\xff\xff", 960), JitterFrame(good[1], 1920)])
    assert len(decoder.decode(batch)) == 2
    assert "failed to decode" in caplog.text


def _opus_packets(n: int) -> list[bytes]:
    """``n`` real Opus packets of a 440 Hz tone, 20 ms each, from aiortc's own encoder."""
    encoder, packets = OpusEncoder(), []
    tone = (0.3 * 32767 * np.sin(2 * np.pi * 440 * np.arange(960 * n) / 48000)).astype("<i2")
    for i in range(n):
        frame = AudioFrame.from_ndarray(tone[None, 960 * i : 960 * (i + 1)], format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = 48000, 960 * i, fractions.Fraction(1, 48000)
        payloads, _ = encoder.encode(frame)
        packets += payloads
    return packets


def test_the_environment_picks_the_buffer(monkeypatch):
    monkeypatch.setenv(webrtc_uplink.ENV, "aiortc")
    assert webrtc_uplink.uplink_mode() == "aiortc"
    monkeypatch.delenv(webrtc_uplink.ENV)
    assert webrtc_uplink.uplink_mode() == "prompt"
    monkeypatch.setenv(webrtc_uplink.ENV, "fast")
    with pytest.raises(ValueError, match=webrtc_uplink.ENV):
        webrtc_uplink.uplink_mode()
