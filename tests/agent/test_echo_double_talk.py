"""Double talk: a caller on loudspeakers speaks over the bot, and their words survive the canceller.

Real parts: the bundled Piper voice for the bot, WebRTC's AEC3, espeak-ng for the caller (another
voice than the bot's; skipped where espeak-ng is missing, ``make test`` installs it) and Whisper
tiny.en, which reads the result as the agent's STT would. The bounds are generous; the figures
per stage and echo level are in docs/BENCHMARKS.md (``scripts/echo_bench.py``).
"""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import soxr

from agent.runtime.echo import EchoCanceller
from support.echo_path import EchoPath, Room, erle_windows, through_canceller, to_int16
from support.wer import wer

SR = 16000
CALLER = "Wait, can you tell me the capital of Italy?"


@pytest.fixture(scope="module")
def caller() -> np.ndarray:
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (make test installs it)")
    wav = subprocess.run(["espeak-ng", "-v", "en-gb+m3", "-s", "160", "--stdout", CALLER], capture_output=True).stdout
    audio = np.frombuffer(wav[44:], np.int16).astype(np.float32) / 32768.0
    return soxr.resample(audio, 22050, SR).astype(np.float32)


@pytest.fixture(scope="module")
def whisper():
    from pipelines.stt import default_model_path, shared_whisper

    return shared_whisper(default_model_path())


@pytest.mark.parametrize("gain_db", [-6, 0])
def test_the_callers_words_survive_double_talk(bot_voices, caller, whisper, gain_db) -> None:
    """The caller talks over the bot 3 s into its speech (the bot keeps talking: the worst case).

    Through the canceller with its double-talk pass the words must be read, over the bot's four
    renders, about as well as from the raw microphone (the echo under the caller is what the raw
    read has to fight; the canceller must not add a loss of its own), and once the caller stops the
    echo must still be kept from the VAD and the STT. The pass is off by default (docs/BENCHMARKS.md
    says why), so it is asked for. One render in four still loses most of the words with it
    (issue 18 keeps that open): the bound is on the mean.
    """
    from pipelines.stt import transcribe

    raw, clean, heard = [], [], []
    for bot_voice in bot_voices:
        path = EchoPath(sample_rate=SR, delay_ms=200, gain_db=gain_db, room=Room(rt60_s=0.3, seed=3))
        path.push(bot_voice, at_sample=0)
        n = (len(bot_voice) + SR) // 320 * 320
        echo = path.pull(n)
        noise = np.random.default_rng(0).standard_normal(n).astype(np.float32) * 1e-3
        voice = np.zeros(n, np.float32)
        k = int(3.0 * SR)
        voice[k : k + len(caller)] = caller[: n - k]
        mic = echo + voice + noise

        canceller = EchoCanceller(double_talk=True)  # off by default: the LiveKit worker's test (BENCHMARKS)
        out = through_canceller(canceller, to_int16(mic), to_int16(bot_voice), rate=SR).astype(np.float32) / 32768
        seg = slice(k - SR // 4, k + len(caller) + SR // 4)
        heard.append(transcribe(whisper, out[seg]))
        raw.append(wer(CALLER, transcribe(whisper, mic[seg])))
        clean.append(wer(CALLER, heard[-1]))

        after = slice(k + len(caller) + SR // 4, len(out))
        windows = erle_windows(mic[after], out[after], echo[after], rate=SR)
        assert len(windows) >= 5
        # the echo is still removed once the caller has stopped (the bench's figure is higher); the
        # raw microphone's own windows read 0 dB here, so this can fail
        assert np.median([e for _t, e in windows]) >= 20.0, (windows, canceller.stats)
    wer_raw, wer_clean = float(np.mean(raw)), float(np.mean(clean))
    print(f"double talk {gain_db:+} dB: WER raw {raw} (mean {wer_raw:.2f}), cleaned {clean} (mean {wer_clean:.2f})")
    # generous: the canceller may lose two or three words in nine more than the raw microphone on
    # the mean, never most of them (without the pass the mean reads 0.8-0.9 at both levels: this
    # can fail)
    assert wer_clean <= min(wer_raw, 0.5) + 0.3, (heard, raw, clean)
