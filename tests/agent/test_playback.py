"""Playback sinks: the simulated real-time device and the WAV file sink.

The property barge-in depends on: after ``flush()`` not one more sample is played.
"""

from __future__ import annotations

import wave

import numpy as np
import pytest

from agent.runtime.jitter import AdaptiveJitterBuffer
from agent.runtime.playback import ArraySink, PlaybackSink, WavFileSink

SR = 16000


def pcm(ms: float, value: int = 1000) -> bytes:
    return np.full(int(SR * ms / 1000), value, np.int16).tobytes()


def test_sinks_implement_the_protocol(tmp_path):
    assert isinstance(ArraySink(SR), PlaybackSink)
    with WavFileSink(tmp_path / "x.wav", SR) as sink:
        assert isinstance(sink, PlaybackSink)


def test_array_sink_plays_in_real_time_and_flush_silences_at_once():
    sink = ArraySink(SR)
    ramp = (np.arange(1, 1 + SR // 10) % 30000 + 1).astype(np.int16)  # 100 ms, no zeros
    sink.write(ramp.tobytes())
    assert sink.queued_ms == 100
    sink.advance(30)
    assert sink.queued_ms == pytest.approx(70)
    assert np.array_equal(sink.played_audio(), ramp[: SR * 30 // 1000])

    flushed_at = sink.now
    assert sink.flush() == 70
    assert sink.queued_ms == 0
    sink.advance(500)
    assert sink.played_after(flushed_at) == 0
    assert sink.played_audio().size == SR * 30 // 1000
    assert sink.flushes == [(flushed_at, 70)]


def test_array_sink_idles_when_dry_and_restarts_on_write():
    sink = ArraySink(SR)
    sink.write(pcm(20, 5))
    sink.advance(50)  # 20 ms played, then 30 ms of idling
    sink.write(pcm(20, 6))  # starts at t=50 ms, not at 20 ms
    sink.advance(10)
    assert [(round(s.start_s, 3), int(s.samples[0]), s.samples.size) for s in sink.played] == [
        (0.0, 5, 320),
        (0.05, 6, 160),
    ]
    assert sink.played[0].end_s(SR) == pytest.approx(0.02)
    assert sink.played_after(0.055) == 80


def test_array_sink_follows_an_injected_clock():
    now = [10.0]
    sink = ArraySink(SR, clock=lambda: now[0])
    sink.write(pcm(40))
    now[0] = 10.025
    assert sink.queued_ms == pytest.approx(15)
    with pytest.raises(RuntimeError, match="manual clock"):
        sink.advance(10)


def test_array_sink_stereo_and_validation():
    sink = ArraySink(SR, channels=2)
    sink.write(np.ones(2 * 160, np.int16).tobytes())  # 10 ms of stereo
    assert sink.queued_ms == pytest.approx(10)
    sink.advance(5)
    assert sink.played_audio().size == 160
    with pytest.raises(ValueError, match="whole"):
        sink.write(b"\x00\x00")


def test_jitter_buffer_into_sink_no_stale_audio_after_barge_in():
    """TTS frames -> jitter buffer -> device; at barge-in both are flushed and the device stays
    silent, although frames of the old reply were still queued in both."""
    jb = AdaptiveJitterBuffer(sample_rate=SR, initial_ms=40, clock=lambda: 0.0)
    sink = ArraySink(SR)
    block = SR * 20 // 1000
    for step in range(50):  # 1 s: the server is 200 ms ahead, the device keeps ~40 ms queued
        t = step * 0.02
        jb.push(pcm(20, 1000 + step), now=t)
        for _ in range(3 if step == 10 else 1 if step > 10 else 0):
            samples, _ = jb.pull(block, now=t)
            sink.write(samples.tobytes())
        sink.advance(20)
    sink.advance(7)  # the caller starts mid-frame
    assert jb.depth_ms > 0 and sink.queued_ms > 0
    barge_in = sink.now
    dropped_sink = sink.flush()
    dropped_jitter = jb.flush()
    for step in range(20):  # the device keeps pulling; nothing must come out
        samples, underrun = jb.pull(block, now=barge_in + step * 0.02)
        assert not samples.any() and not underrun
        sink.advance(20)
    assert sink.played_after(barge_in) == 0
    assert dropped_sink > 0 and dropped_jitter > 0
    print(
        f"\n[playback] barge-in dropped {dropped_sink} ms in the sink and {dropped_jitter:.0f} ms in the jitter buffer"
    )


def test_wav_file_sink_writes_a_wav(tmp_path):
    path = tmp_path / "out.wav"
    frames = [pcm(20, v) for v in (1, 2, 3)]
    with WavFileSink(path, SR) as sink:
        for f in frames:
            sink.write(f)
        assert sink.flush() == 0 and sink.queued_ms == 0
        assert sink.duration_ms == pytest.approx(60)
    with wave.open(str(path), "rb") as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (SR, 1, 2)
        assert wav.readframes(wav.getnframes()) == b"".join(frames)
    with pytest.raises(RuntimeError, match="closed"):
        sink.write(frames[0])
