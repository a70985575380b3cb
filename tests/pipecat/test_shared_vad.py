"""Pipecat's Silero VAD on the process's one session (pipelines.pipecat_vad): each call's analyzer is
made without loading a model, scores audio as Pipecat's own does, and keeps its own state."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import soundfile as sf
from pipecat.audio.vad.silero import SileroVADAnalyzer

from pipelines.pipecat_vad import SharedSileroVAD

SPEECH = Path(__file__).resolve().parent.parent / "pipelines" / "data" / "please-through-browser-opus.wav"


def _windows(rate: int = 16000) -> list[bytes]:
    x, sr = sf.read(SPEECH, dtype="int16")
    assert sr == rate
    pcm = np.concatenate([np.zeros(rate // 2, np.int16), x, np.zeros(rate // 2, np.int16)]).tobytes()
    return [pcm[i : i + 1024] for i in range(0, len(pcm) - 1023, 1024)]  # 512 samples each


def test_analyzers_share_one_session_and_score_as_pipecats_own() -> None:
    SharedSileroVAD(sample_rate=16000)  # the shared session loaded once (preload does it in the demo)
    t0 = time.perf_counter()
    first, second = SharedSileroVAD(sample_rate=16000), SharedSileroVAD(sample_rate=16000)
    made_s = time.perf_counter() - t0
    assert first._model.session is second._model.session
    assert made_s < 0.05, f"making two analyzers took {made_s:.3f} s: a model was loaded"  # ~0.1 ms; a load is 50+

    own = SileroVADAnalyzer(sample_rate=16000)
    assert own._model.session is not first._model.session
    for vad in (own, first, second):
        vad.set_sample_rate(16000)  # what the pipeline's start does
    windows = _windows()
    reference = [float(np.asarray(own.voice_confidence(w)).item()) for w in windows]
    assert max(reference) > 0.9 and min(reference) < 0.1  # speech and silence: a test that can fail
    # interleaved, window by window: a state shared between the two would change both sequences
    a, b = [], []
    for w in windows:
        a.append(float(np.asarray(first.voice_confidence(w)).item()))
        b.append(float(np.asarray(second.voice_confidence(w)).item()))
    assert a == reference and b == reference
