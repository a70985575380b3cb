"""SileroVAD on real speech (our own voice, resampled), silence and noise.

The onset check is what barge-in timing rests on: the event must say when the caller *started*,
not when the VAD made up its mind.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.runtime import vad as vad_mod
from agent.runtime.vad import ENV_MODEL_PATH, SileroVAD, VADEvent, VADParams, find_model_path

PAD_S = 1.0


def _padded(audio: np.ndarray, sr: int, before: float = PAD_S, after: float = PAD_S) -> np.ndarray:
    return np.concatenate([np.zeros(int(before * sr), np.float32), audio, np.zeros(int(after * sr), np.float32)])


def _feed_in_chunks(vad: SileroVAD, signal: np.ndarray, sizes: list[int]) -> list[VADEvent]:
    events: list[VADEvent] = []
    pos, k = 0, 0
    while pos < signal.size:
        n = sizes[k % len(sizes)]
        events += vad.feed(signal[pos : pos + n])
        pos += n
        k += 1
    return events


@pytest.mark.parametrize("sr", [16000, 8000])
def test_speech_start_onset_and_end(speech, sr):
    signal = _padded(speech.at(sr), sr)
    true_start, true_end = (PAD_S + t for t in speech.bounds())
    vad = SileroVAD(VADParams(sample_rate=sr))
    events = _feed_in_chunks(vad, signal, [320])  # 20 ms transport frames

    assert [e.kind for e in events] == ["speech_start", "speech_end"]
    start, end = events
    onset_err_ms = 1000 * (start.onset_s - true_start)
    end_err_ms = 1000 * (end.onset_s - true_end)
    print(
        f"\n[vad {sr} Hz] speech at {true_start:.3f}-{true_end:.3f} s; start onset {start.onset_s:.3f} s "
        f"(error {onset_err_ms:+.0f} ms, decided {1000 * start.delay_s:.0f} ms later); "
        f"end onset {end.onset_s:.3f} s (error {end_err_ms:+.0f} ms, decided {1000 * end.delay_s:.0f} ms later)"
    )
    assert abs(onset_err_ms) <= 100
    # declared once min_speech_ms of speech was seen, not before, and not much later
    assert 0.2 <= start.delay_s <= 0.2 + 2 * vad.params.window_s
    assert start.decided_s < end.onset_s
    # Silero's probability decays over a few windows after the last phoneme (more slowly at
    # 8 kHz); the end is not latency-critical, the start is
    assert -100 <= end_err_ms <= 250
    assert end.delay_s >= 0.3
    assert not vad.speaking


@pytest.mark.parametrize("sr", [16000, 8000])
def test_silence_does_not_fire(sr):
    vad = SileroVAD(VADParams(sample_rate=sr))
    assert vad.feed(np.zeros(5 * sr, np.float32)) == []
    assert not vad.speaking
    assert vad.last_prob < 0.1


@pytest.mark.parametrize("sr", [16000, 8000])
@pytest.mark.parametrize("rms", [0.02, 0.035, 0.05])
def test_white_noise_does_not_fire(sr, rms):
    noise = np.random.default_rng(1234).normal(0.0, rms, 10 * sr).astype(np.float32)
    vad = SileroVAD(VADParams(sample_rate=sr))
    assert vad.feed(noise) == []


@pytest.mark.parametrize("offset_s", [0.0, 1.0, 2.0])
def test_burst_shorter_than_min_speech_does_not_fire(speech, offset_s):
    sr = 16000
    audio = speech.at(sr)
    true_start, _ = speech.bounds()
    begin = int((true_start + offset_s) * sr)

    def burst(ms: float) -> np.ndarray:
        b = audio[begin : begin + int(ms * sr / 1000)].copy()
        ramp = np.linspace(0.0, 1.0, sr // 100, dtype=np.float32)  # 10 ms fades: no clicks
        b[: ramp.size] *= ramp
        b[-ramp.size :] *= ramp[::-1]
        return _padded(b, sr)

    vad = SileroVAD(VADParams(sample_rate=sr, min_speech_ms=200))
    assert vad.feed(burst(120)) == []
    # control: the same place in the sentence, long enough, does fire
    vad.reset()
    assert [e.kind for e in vad.feed(burst(400))] == ["speech_start", "speech_end"]


def test_streaming_equals_offline_seeded(speech):
    sr = 16000
    signal = _padded(speech.at(sr), sr, after=0.5)
    whole = SileroVAD(VADParams(sample_rate=sr))
    expected = whole.feed(signal)
    assert [e.kind for e in expected] == ["speech_start", "speech_end"]
    rng = np.random.default_rng(7)
    for _ in range(3):
        sizes = rng.integers(1, 3000, size=50).tolist()
        vad = SileroVAD(VADParams(sample_rate=sr))
        assert _feed_in_chunks(vad, signal, sizes) == expected
        assert vad.last_prob == whole.last_prob
        assert vad.time_s == whole.time_s


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(min_value=1, max_value=2500), min_size=1, max_size=40))
def test_streaming_equals_offline_hypothesis(speech, sizes):
    sr = 8000
    signal = _padded(speech.at(sr)[: 2 * sr], sr, before=0.5, after=0.5)
    expected = SileroVAD(VADParams(sample_rate=sr)).feed(signal)
    assert expected, "the excerpt must contain speech for this test to mean anything"
    assert _feed_in_chunks(SileroVAD(VADParams(sample_rate=sr)), signal, sizes) == expected


def test_int16_bytes_and_float_inputs_agree(speech):
    sr = 16000
    signal = _padded(speech.at(sr), sr)
    as_int16 = np.round(signal * 32767).astype(np.int16)
    from_float = SileroVAD(VADParams(sample_rate=sr)).feed(as_int16.astype(np.float32) / 32768.0)
    from_array = SileroVAD(VADParams(sample_rate=sr)).feed(as_int16)
    from_bytes = SileroVAD(VADParams(sample_rate=sr)).feed(as_int16.tobytes())
    assert from_float == from_array == from_bytes
    assert len(from_array) == 2


def test_reset_restarts_stream_time(speech):
    sr = 16000
    signal = _padded(speech.at(sr), sr)
    vad = SileroVAD(VADParams(sample_rate=sr))
    first = vad.feed(signal)
    vad.feed(np.zeros(1000, np.float32))  # leaves a partial window behind
    vad.reset()
    assert vad.time_s == 0.0 and not vad.speaking
    assert vad.feed(signal) == first


def test_min_speech_zero_fires_on_first_speech_window(speech):
    sr = 16000
    signal = _padded(speech.at(sr), sr)
    events = SileroVAD(VADParams(sample_rate=sr, min_speech_ms=0)).feed(signal)
    assert events[0].kind == "speech_start"
    assert events[0].delay_s == pytest.approx(0.032)


def test_params_validation():
    with pytest.raises(ValueError, match="16000 or 8000"):
        VADParams(sample_rate=44100)
    with pytest.raises(ValueError, match="threshold"):
        VADParams(threshold=1.5)
    assert VADParams(threshold=0.6).neg_threshold == pytest.approx(0.45)
    assert VADParams(threshold=0.6, neg_threshold=0.2).neg_threshold == 0.2
    with pytest.raises(ValueError, match="neg_threshold"):
        VADParams(threshold=0.5, neg_threshold=0.7)
    with pytest.raises(TypeError):
        SileroVAD(VADParams()).feed(np.zeros(512, np.int32))


def test_model_lookup_order(monkeypatch, tmp_path):
    bundled = find_model_path()
    assert bundled.name == "silero_vad.onnx"

    monkeypatch.setenv(ENV_MODEL_PATH, str(bundled))
    assert find_model_path() == bundled
    monkeypatch.setenv(ENV_MODEL_PATH, str(tmp_path / "missing.onnx"))
    with pytest.raises(FileNotFoundError, match=ENV_MODEL_PATH):
        find_model_path()
    # an explicit path wins over the environment
    assert find_model_path(bundled) == bundled
    with pytest.raises(FileNotFoundError, match="model_path"):
        find_model_path(tmp_path / "nope.onnx")

    monkeypatch.delenv(ENV_MODEL_PATH)
    monkeypatch.setattr(vad_mod, "_BUNDLED_MODELS", (("streamvox_no_such_pkg", ("x.onnx",)),))
    with pytest.raises(FileNotFoundError) as info:
        find_model_path()
    for hint in (ENV_MODEL_PATH, "silero-vad", "pipecat-ai", "livekit-plugins-silero"):
        assert hint in str(info.value)


def test_model_io_is_checked(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "not_silero",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    path = tmp_path / "fake.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    with pytest.raises(ValueError, match="not a Silero VAD"):
        SileroVAD(model_path=path)


def test_loading_the_model_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys; from agent.runtime.vad import SileroVAD; SileroVAD(); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_onsets_report_the_first_speech_window_and_dropped_candidates(speech):
    """With report_onsets, speech yields onset then speech_start at the same onset; a cough-length
    burst of speech yields onset then onset_dropped; without it, neither is reported."""
    sr = 16000
    signal = _padded(speech.at(sr), sr, after=0.5)
    plain = SileroVAD(VADParams(sample_rate=sr)).feed(signal)
    vad = SileroVAD(VADParams(sample_rate=sr), report_onsets=True)
    events = _feed_in_chunks(vad, signal, [512])
    assert [e for e in events if e.kind in ("speech_start", "speech_end")] == plain
    first = events[0]
    assert first.kind == "onset" and first.onset_s == plain[0].onset_s
    assert first.decided_s == pytest.approx(first.onset_s + vad.params.window_s)
    # streaming == offline holds for the new events too
    assert _feed_in_chunks(SileroVAD(VADParams(sample_rate=sr), report_onsets=True), signal, [777, 5]) == events
    start, _ = speech.bounds()
    short = speech.at(sr)[int(start * sr) : int((start + 0.1) * sr)]
    kinds = [e.kind for e in SileroVAD(VADParams(sample_rate=sr), report_onsets=True).feed(_padded(short, sr))]
    assert kinds == ["onset", "onset_dropped"]
    assert SileroVAD(VADParams(sample_rate=sr)).feed(_padded(short, sr)) == []
