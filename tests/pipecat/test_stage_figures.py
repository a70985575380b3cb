"""The server's stage figures (``pipelines.pipecat_figures``): origins found in the input audio,
stages in order, one message per turn and per barge-in with the TTS ack.

Real Pipecat frames and the real observer; the frames are handed to it with the pipeline-clock
times a pipeline would stamp, so the figures can be checked to the millisecond.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    InputAudioRawFrame,
    InterruptionFrame,
    LLMTextFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    UserStoppedSpeakingFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)

from pipelines.pipecat_figures import StageFigures, describe

RATE = 16000


def _input(loud: bool) -> InputAudioRawFrame:
    pcm = (np.full(320, 3000 if loud else 0, dtype="<i2")).tobytes()  # 20 ms, -21 dBFS or silence
    return InputAudioRawFrame(audio=pcm, sample_rate=RATE, num_channels=1)


class _Stats:
    def __init__(self) -> None:
        self.cancel_acks = 0
        self.cancel_ack_latency_s: list[float] = []


async def _feed(fig: StageFigures, frames: list[tuple[float, object]], source=None) -> None:
    for t, frame in frames:
        await fig._on_frame(frame, t, source)


def _speech(t0: float, t1: float) -> list[tuple[float, object]]:
    """Input frames every 20 ms from t0 to t1 (s), loud inside [t0 + 0.5, t1 - 0.5]."""
    out = []
    t = t0
    while t < t1:
        out.append((t, _input(t0 + 0.5 <= t <= t1 - 0.5)))
        t = round(t + 0.02, 3)
    return out


async def test_a_turn_is_timed_from_the_speech_end_in_the_audio() -> None:
    tts = SimpleNamespace(name="tts", stats=_Stats())
    sent: list[dict] = []

    async def send(msg: dict) -> None:
        sent.append(msg)

    fig = StageFigures(tts=tts, send=send)
    await _feed(fig, _speech(0.0, 2.5))  # loud 0.5 .. 2.0 s
    await _feed(
        fig,
        [
            (2.3, VADUserStoppedSpeakingFrame(stop_secs=0.2)),  # the VAD says so 300 ms after the speech
            (2.45, TranscriptionFrame(text="hi", user_id="u", timestamp="", result={"decoded_early": True})),
            (2.5, UserStoppedSpeakingFrame()),
            (2.9, LLMTextFrame(text="Hello")),
            (2.95, LLMTextFrame(text=" there")),
        ],
    )
    await _feed(fig, [(3.1, TTSAudioRawFrame(audio=b"\0\0" * 160, sample_rate=RATE, num_channels=1))], source=tts)
    await _feed(fig, [(3.12, BotStartedSpeakingFrame())])

    assert len(sent) == 1 and fig.turns == [{k: v for k, v in sent[0].items() if k != "type"}]
    f = sent[0]
    assert f["kind"] == "turn" and f["origin"] == "audio"
    # the last loud frame starts at 2.0 s (t0 + 0.5 .. t1 - 0.5, 20 ms steps)
    assert f["vad_stop"] == 300.0 and f["stt_final"] == 450.0 and f["end_of_turn"] == 500.0
    assert f["llm_first_token"] == 900.0 and f["tts_first_audio"] == 1100.0 and f["transport_first_audio"] == 1120.0
    assert "VAD stop +300" in describe(f) and "in the audio received" in describe(f)
    assert f["stt_early"] is True and "decoded before the VAD's stop" in describe(f)


async def test_a_barge_in_is_timed_from_the_onset_and_carries_the_ack() -> None:
    tts = SimpleNamespace(name="tts", stats=_Stats())
    fig = StageFigures(tts=tts)
    await _feed(fig, [(0.0, BotStartedSpeakingFrame())])  # the bot talks; no caller turn: no turn figure
    await _feed(fig, _speech(0.0, 2.0))  # the caller's speech is loud from 0.5 s
    await _feed(fig, [(0.85, VADUserStartedSpeakingFrame(start_secs=0.2)), (0.86, InterruptionFrame())])
    await _feed(fig, [(0.9, BotStoppedSpeakingFrame())])
    tts.stats.cancel_acks, tts.stats.cancel_ack_latency_s = 1, [0.004]  # the ack comes in
    for task in list(fig._tasks):
        await task
    assert fig.turns == []
    (b,) = fig.bargeins
    assert b["origin"] == "audio" and b["vad_start"] == 350.0 and b["interruption"] == 360.0
    assert b["bot_stopped"] == 400.0 and b["cancel_ack"] == 4.0


async def test_without_speech_in_the_input_the_vad_presumption_is_the_origin() -> None:
    fig = StageFigures(tts=None)
    await _feed(fig, [(t / 50, _input(False)) for t in range(100)])
    await _feed(fig, [(2.0, VADUserStoppedSpeakingFrame(stop_secs=0.2)), (2.1, UserStoppedSpeakingFrame())])
    await _feed(fig, [(2.6, BotStartedSpeakingFrame())])
    (f,) = fig.turns
    assert f["origin"] == "vad" and f["vad_stop"] == 200.0 and f["transport_first_audio"] == 800.0
    assert f["llm_first_token"] is None and "as the VAD presumes" in describe(f)
    assert f["stt_early"] is None and "decoded before" not in describe(f)  # no transcript: nothing to say
