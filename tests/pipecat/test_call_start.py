"""What a call's start no longer builds on the event loop: Pipecat's Silero VAD model
(pipelines.pipecat_vad) and the LLM client's TLS context (pipelines.pipecat_llm). Each was a
50-250 ms hold of the loop every other call's audio waited through (pipelines.loop_watch)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from pipecat.audio.vad.silero import SileroVADAnalyzer

from pipelines.pipecat_vad import SharedSileroVAD

SPEECH = Path(__file__).resolve().parent.parent / "pipelines" / "data" / "please-through-browser-opus.wav"


def _windows(rate: int = 16000) -> list[bytes]:
    x, sr = sf.read(SPEECH, dtype="int16")
    assert sr == rate
    pcm = np.concatenate([np.zeros(rate // 2, np.int16), x, np.zeros(rate // 2, np.int16)]).tobytes()
    return [pcm[i : i + 1024] for i in range(0, len(pcm) - 1023, 1024)]  # 512 samples each


def _confidence(vad: SileroVADAnalyzer, window: bytes) -> float:
    return float(np.asarray(vad.voice_confidence(window)).item())


def test_vad_analyzers_share_one_session_and_score_as_pipecats_own() -> None:
    SharedSileroVAD(sample_rate=16000)  # the shared session loaded once (preload does it in the demo)
    t0 = time.perf_counter()
    first, second = SharedSileroVAD(sample_rate=16000), SharedSileroVAD(sample_rate=16000)
    made_s = time.perf_counter() - t0
    assert first._model.session is second._model.session
    assert made_s < 0.05, f"making two analyzers took {made_s:.3f} s: a model was loaded"  # ~0.2 ms; a load 30+

    own = SileroVADAnalyzer(sample_rate=16000)
    assert own._model.session is not first._model.session
    for vad in (own, first, second):
        vad.set_sample_rate(16000)  # what the pipeline's start does
    windows = _windows()
    reference = [_confidence(own, w) for w in windows]
    assert max(reference) > 0.9 and min(reference) < 0.1  # speech and silence: a test that can fail
    # interleaved, window by window: a state shared between the two would change both sequences
    a, b = [], []
    for w in windows:
        a.append(_confidence(first, w))
        b.append(_confidence(second, w))
    assert a == reference and b == reference


async def test_llm_clients_share_one_tls_context_and_still_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    import httpcore2

    from pipelines.pipecat_llm import SharedTLSLLMService, shared_tls_context
    from support.pipecat_harness import fake_llm

    shared_tls_context()
    built = []
    real = httpcore2.default_ssl_context
    monkeypatch.setattr(httpcore2, "default_ssl_context", lambda **kw: built.append(1) or real(**kw))
    async with fake_llm(["Paris is the capital."]) as (url, requests):
        services = [SharedTLSLLMService(base_url=url, api_key="none") for _ in range(3)]
        assert built == [], "a call's LLM client built its own TLS context"
        stream = await services[-1]._client.chat.completions.create(
            model="fake", messages=[{"role": "user", "content": "Capital of France?"}], stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "Paris is the capital." and len(requests) == 1
