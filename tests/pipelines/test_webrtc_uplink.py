"""The WebRTC uplink setting: aiortc's real audio receiver hands a packet on once the next one is in,
not four packets (80 ms) later; packets stay in order; video receivers keep their own buffer."""

from __future__ import annotations

import aiortc.rtcrtpreceiver as receiver
import pytest
from aiortc.rtp import RtpPacket

from pipelines import webrtc_uplink


@pytest.fixture
def restore_aiortc():
    """aiortc's own buffer class during the test (the demo room, built by earlier tests in this
    process, may have set ours already), and whatever was there afterwards."""
    before = receiver.JitterBuffer
    receiver.JitterBuffer = getattr(before, "_streamvox_base", before)
    yield
    receiver.JitterBuffer = before


def _released(buffer, packets: int, *, order=None) -> list[int]:
    """Feed 20 ms Opus packets (one per frame); the sequence numbers of the frames released."""
    out = []
    for seq in order or range(packets):
        packet = RtpPacket(payload_type=111, sequence_number=seq, timestamp=960 * seq, payload=b"x")
        packet._data = packet.payload  # the receiver's depayloaded data, as it sets it before add()
        _, frame = buffer.add(packet)
        if frame is not None:
            out.append(frame.timestamp // 960)
    return out


def _audio_buffer():
    # the receiver's own construction of its buffer, through the module global it reads
    rx = receiver.RTCRtpReceiver("audio", transport=_FakeDtls())
    return rx._RTCRtpReceiver__jitter_buffer


class _FakeDtls:
    """The receiver's constructor only registers itself with its DTLS transport's state."""

    state = "new"

    def _register_rtp_receiver(self, *_a, **_k) -> None: ...


def test_aiortc_alone_holds_four_packets(restore_aiortc):
    buf = receiver.JitterBuffer(capacity=16, prefetch=webrtc_uplink.AIORTC_PREFETCH)
    assert _released(buf, 6) == [0, 1]  # frame 0 only after packets 1-4 arrived


def test_audio_is_released_after_one_packet_and_in_order(restore_aiortc):
    assert webrtc_uplink.release_audio_sooner(1) == 1
    buf = receiver.JitterBuffer(capacity=16, prefetch=4)  # what RTCRtpReceiver asks for
    assert _released(buf, 6) == [0, 1, 2, 3, 4]
    # a late packet holds the ones after it; then they come out in order (aiortc hands on one
    # frame per packet that arrives, with or without this setting)
    buf = receiver.JitterBuffer(capacity=16, prefetch=4)
    assert _released(buf, 0, order=[0, 1, 3, 4, 2, 5, 6, 7]) == [0, 1, 2, 3, 4]


def test_video_keeps_its_buffer_and_calling_again_only_changes_the_count(restore_aiortc):
    webrtc_uplink.release_audio_sooner(1)
    webrtc_uplink.release_audio_sooner(2)  # not a subclass of a subclass
    assert receiver.JitterBuffer._streamvox_base.__module__ == "aiortc.jitterbuffer"
    audio = receiver.JitterBuffer(capacity=16, prefetch=4)
    assert _released(audio, 4) == [0, 1]
    video = receiver.JitterBuffer(capacity=512, is_video=True)
    assert video._prefetch == 0 and video._is_video


def test_the_real_receiver_builds_the_prompt_buffer(restore_aiortc):
    try:
        before = _audio_buffer()
    except Exception as exc:  # aiortc's constructor changed: the setting must be re-checked by hand
        pytest.fail(f"aiortc's RTCRtpReceiver could not be built here: {exc!r}")
    assert before._prefetch == webrtc_uplink.AIORTC_PREFETCH  # what the setting exists for
    webrtc_uplink.release_audio_sooner(1)
    assert _audio_buffer()._prefetch == 1


def test_the_environment_sets_the_count(monkeypatch):
    monkeypatch.setenv(webrtc_uplink.ENV, "4")
    assert webrtc_uplink.audio_prefetch() == 4
    monkeypatch.delenv(webrtc_uplink.ENV)
    assert webrtc_uplink.audio_prefetch() == webrtc_uplink.DEFAULT_PREFETCH
    for bad in ("two", "0", "99"):
        monkeypatch.setenv(webrtc_uplink.ENV, bad)
        with pytest.raises(ValueError, match=webrtc_uplink.ENV):
            webrtc_uplink.audio_prefetch()
