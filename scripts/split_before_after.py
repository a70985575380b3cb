"""Same-run comparison of the two Piper splits on this machine (issue 12): first audio and steady cost.

Before: split before the flow (``/Add_output_0`` z_p + mask), flow + decoder in every window with
28 frames of context a side, windows 6, 12, 24, 48, 64. After: split at the decoder input
(``/Mul_7_output_0``), flow in the front part, decoder-only windows (11 a side, spans >= 65),
windows 54, 64, 96. Both splits are extracted into a temporary directory; the settings are run
interleaved, so a neighbour's load falls on both alike.

    python scripts/split_before_after.py [--repeats 9]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import onnxruntime as ort
from onnx.utils import extract_model

from tts_service.piper.engine import HOP, PiperEngine, Window
from tts_service.piper.voices import DURATIONS, FRONT_INPUTS, default_voice_path

Z_P, MASK = "/Add_output_0", "/Cast_2_output_0"
FIRST = ["Sure,", "Let me check that for you.", "The clinic opens at eight thirty"]
REPLY = "I found three flights to Denver tomorrow morning, and the earliest one leaves at seven fifteen."


def session(path: Path, threads: int) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    engine = PiperEngine()
    engine.load_voice(default_voice_path(), progress=lambda *_: None)
    model = str(default_voice_path())
    with tempfile.TemporaryDirectory() as tmp:
        old_front, old_back = Path(tmp, "front.onnx"), Path(tmp, "back.onnx")
        extract_model(model, str(old_front), FRONT_INPUTS, [Z_P, MASK, DURATIONS])
        extract_model(model, str(old_back), [Z_P, MASK], ["output"])
        of, ob = session(old_front, 2), session(old_back, 2)

        def old_window(z_p, mask, start, end, ctx=28):
            lo, hi = max(0, start - ctx), min(z_p.shape[2], end + ctx)
            return ob.run(None, {Z_P: z_p[:, :, lo:hi], MASK: mask[:, :, lo:hi]})[0]

        def old_first(text):
            z_p, mask, _ = of.run([Z_P, MASK, DURATIONS], engine.front_feed(text))
            old_window(z_p, mask, 0, 6)

        def new_first(text):
            p = engine.prepare(text)
            engine.decode([Window(p, 0, min(p.frames, engine.free_frames()))])

        def old_reply():
            z_p, mask, _ = of.run([Z_P, MASK, DURATIONS], engine.front_feed(REPLY))
            start = 0
            for size in (6, 12, 24, 48, *[64] * 99):
                if start >= z_p.shape[2]:
                    return z_p.shape[2]
                old_window(z_p, mask, start, min(z_p.shape[2], start + size))
                start += size

        def new_reply():
            p = engine.prepare(REPLY)
            start = 0
            for size in (54, 64, *[96] * 99):
                if start >= p.frames:
                    return p.frames
                engine.decode([Window(p, start, min(p.frames, start + size))])
                start += size

        timings: dict[str, list[float]] = {}
        cpu: dict[str, float] = {}
        frames = new_reply()
        jobs = {f"first audio, old: {t!r}": (lambda t=t: old_first(t)) for t in FIRST}
        jobs |= {f"first audio, new: {t!r}": (lambda t=t: new_first(t)) for t in FIRST}
        jobs |= {"5 s reply, old": old_reply, "5 s reply, new": new_reply}
        print(f"load average {os.getloadavg()[0]:.2f}")
        for _ in range(args.repeats):
            for name, job in jobs.items():
                c0, t0 = time.process_time(), time.perf_counter()
                job()
                timings.setdefault(name, []).append(time.perf_counter() - t0)
                cpu[name] = cpu.get(name, 0.0) + time.process_time() - c0
        audio_s = frames * HOP / engine.sample_rate
        for name, ts in timings.items():
            ms = 1000 * statistics.median(ts)
            extra = ""
            if "reply" in name:
                extra = f", {ms / 1000 / audio_s:.4f} wall s and {cpu[name] / len(ts) / audio_s:.4f} CPU s per audio s"
            print(f"  {name}: {ms:.1f} ms{extra}")
        print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
