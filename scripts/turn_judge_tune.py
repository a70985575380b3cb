"""Choosing ``TurnJudge``'s waits and thresholds on the caller corpus, and checking them on voices held out.

    .venv/bin/python scripts/turn_judge_tune.py --json out/turn_judge_tune.json   # ~4 min, three paths

Why: the judge (``pipelines/turn_judge.py``, the demo's end of turn) turns the transcript's cue and
SmolLM2's probability that the caller's sentence ends (``pipelines/text_turn.py``) into a silence to
wait. Its defaults must come from a measurement, and a rule chosen on a corpus should be scored on
callers it was not chosen on. Each corpus turn goes once per path (``--paths``) through the real
Silero VAD and Whisper (``scripts/end_of_turn.py``'s ``drive_judged``, on its simulated clock) with
SmolLM2 reading the words at every VAD stop; the recorded signals are then replayed under every
rule of a grid (the decisions, early cuts and delays as ``end_of_turn.py`` counts them, with the
measured STT and model times), so a grid of hundreds of rules costs one pass of the audio.

Printed: the judge's defaults, the best rule of the grid with at most ``--max-cuts`` of the
mid-thought pauses cut on every path (by the complete turns' delay p50 + p95), and the same choice
made on half of the voices and scored on the other half, both ways.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # end_of_turn
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # pipelines, support

import end_of_turn as E  # the corpus, the drive and the tables: one implementation

from pipelines.turn_judge import TurnJudge

GRID = {
    "continuing_s": [1.2, 1.5, 1.8],
    "between_s": [0.4, 0.6, 0.8],
    "likely_s": [0.2],
    "unlikely_s": [1.2, 1.5, 1.8],
    "text_likely": [0.3, 0.5, 0.7],
    "text_unlikely": [0.02, 0.05, 0.1],
    "doubt_words": [None, 10],
    "doubt_logprob": [None, -0.8],
    "rescue_acoustic": [None, 0.8, 0.9],
}


async def record(paths: list[str], stop_secs: float, long_asks: int = 0) -> dict[str, list[tuple[E.Turn, list[dict]]]]:
    """Each path's turns with the signals at each VAD start and stop: the transcript so far, smart-turn's
    probability, the words' probability (SmolLM2) and how sure Whisper was of the segment's words.
    ``long_asks``: that many of ``support.callers.long_asks`` (complete turns) as a set of their own
    per path, ``"<path> long asks"``."""
    import pipecat.audio.turn.smart_turn.base_smart_turn as base_smart_turn
    from pipecat.audio.turn.smart_turn.base_smart_turn import SmartTurnParams
    from pipecat.audio.turn.smart_turn.local_smart_turn_v3 import LocalSmartTurnAnalyzerV3

    from pipelines.stt import default_model_path, shared_whisper, transcribe
    from pipelines.text_turn import shared_text_turn

    model = shared_whisper(default_model_path())
    words = shared_text_turn(progress=lambda line: print(line, file=sys.stderr))
    clock = E.SimClock()
    base_smart_turn.time = clock
    smart = LocalSmartTurnAnalyzerV3(params=SmartTurnParams(stop_secs=3.0))  # its verdict only: no timeout
    smart.set_sample_rate(E.RATE)
    sets = [(path, path, None) for path in paths]
    sets += [(f"{path} long asks", path, long_asks) for path in paths if long_asks]
    out: dict[str, list[tuple[E.Turn, list[dict]]]] = {}
    for name, path, asks in sets:
        t0 = time.perf_counter()
        turns = E.corpus_turns(None, path) if asks is None else E.long_ask_turns(asks, path)
        recorded = []
        for turn in turns:
            events: list[dict] = []
            heard: dict[str, float] = {}

            def hear(audio, heard=heard) -> str:
                heard.clear()
                return transcribe(model, audio, info=heard)

            def read_words(text: str, _p, _c, events=events, heard=heard) -> float:
                t1 = time.perf_counter()
                events[-1]["words"] = words.p_end(text)
                events[-1]["words_s"] = time.perf_counter() - t1
                events[-1]["logprob"] = heard.get("text_logprob")
                return 60.0  # never decide: every pause is recorded, the rules are replayed after

            await E.drive_judged(turn, stop_secs, smart, read_words, hear, clock, events)
            recorded.append((turn, events))
        out[name] = recorded
        print(f"  {name}: {len(turns)} turns recorded in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    await smart.cleanup()
    return out


def replay(turn: E.Turn, events: list[dict], judge: TurnJudge, *, cue_alone: bool = False) -> E.Outcome:
    """The decisions ``judge`` makes on one recorded turn: at each VAD stop a wait (at least the STT's
    and the model's time), withdrawn by the next VAD start that comes before it. ``cue_alone``: as if
    the text model's read came too late every time (a loaded machine past the agent's deadline for
    it): the transcript's cue decides, as soon as the transcript is in."""
    decisions: list[float] = []
    pending: float | None = None
    for ev in events:
        if ev["kind"] == "start":
            if pending is not None and pending <= ev["t"]:
                decisions.append(pending)
            pending = None
        else:
            words, words_s = (None, 0.0) if cue_alone else (ev.get("words"), ev.get("words_s", 0.0))
            wait = judge.wait_s(ev["text"], ev["acoustic"], words, ev.get("logprob"))
            pending = ev["t"] + max(wait, ev["stt_s"] + words_s)
    if pending is not None:
        decisions.append(pending)
    return E._outcome(turn, decisions, [])


def score(
    recorded, judge: TurnJudge, name: str, stop_secs: float, voices: set[str] | None = None, cue_alone: bool = False
) -> dict:
    rows = {}
    for path, items in recorded.items():
        kept = [(t, ev) for t, ev in items if voices is None or t.voice in voices]
        outcomes = [replay(t, ev, judge, cue_alone=cue_alone) for t, ev in kept]
        rows[path] = E.summarise(name, stop_secs, [t for t, _ in kept], outcomes)
    return rows


def choose(recorded, stop_secs: float, max_cuts: float, voices: set[str] | None = None):
    """The grid's rule with at most ``max_cuts`` of the pauses cut on every path, least delay p50 + p95."""
    best = None
    for values in itertools.product(*GRID.values()):
        judge = replace(TurnJudge(), **dict(zip(GRID, values, strict=True)))
        if judge.text_unlikely > judge.text_likely:
            continue
        rows = score(recorded, judge, "grid", stop_secs, voices)
        if any(r.pauses and r.cut_pauses > max_cuts * r.pauses for r in rows.values()):
            continue
        cost = sum((r.complete_delay_ms_p50 or 0) + (r.complete_delay_ms_p95 or 0) for r in rows.values())
        if best is None or cost < best[0]:
            best = (cost, judge, rows)
    return best


def line(label: str, judge: TurnJudge | None, rows: dict) -> str:
    per_path = "; ".join(
        f"{p} {r.cut_pauses}/{r.pauses} cut, {r.complete_early} complete cut, "
        f"{r.complete_delay_ms_p50 or 0:,.0f} / {r.complete_delay_ms_p95 or 0:,.0f} ms"
        for p, r in rows.items()
    )
    rule = "" if judge is None else " (" + ", ".join(f"{k}={getattr(judge, k)}" for k in GRID) + ")"
    return f"{label}{rule}: {per_path}"


def _variant(spec: str) -> TurnJudge:
    """``TurnJudge()`` with the fields of ``spec`` ("question_ends=1,unlikely_s=1.2") changed."""
    import dataclasses

    fields = {f.name: f for f in dataclasses.fields(TurnJudge)}
    changes: dict[str, object] = {}
    for part in filter(None, spec.split(",")):
        name, _, raw = part.partition("=")
        if name not in fields:
            raise ValueError(f"TurnJudge has no {name!r}; it has {', '.join(fields)}")
        default = getattr(TurnJudge(), name)
        if isinstance(default, bool):
            changes[name] = raw.lower() in ("1", "true", "yes", "on")
        elif raw.lower() == "none":
            changes[name] = None
        else:
            changes[name] = float(raw)
    return replace(TurnJudge(), **changes)


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--paths", default="clean,page,phone", help="comma-separated: clean, page, phone")
    parser.add_argument("--stop-secs", type=float, default=0.2, help="Silero's stop_secs (the demo's 0.2)")
    parser.add_argument("--max-cuts", type=float, default=0.075, help="share of pauses a rule may cut (0.075)")
    parser.add_argument(
        "--long-asks", type=int, default=0, help="also this many long-answer asks per path (complete turns: 60)"
    )
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="NAME=VALUE[,NAME=VALUE]",
        help="score this change of the defaults beside them (e.g. question_ends=1); repeatable",
    )
    parser.add_argument(
        "--cue-alone",
        action="store_true",
        help="also score the defaults as if the text model's read were always too late (the cue alone decides)",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    try:
        variants = [_variant(spec) for spec in args.also]
    except (ValueError, TypeError) as exc:
        parser.error(f"--also: {exc}")
    paths = [p for p in args.paths.split(",") if p]
    if not paths or set(paths) - {"clean", "page", "phone"}:
        parser.error("--paths takes clean, page and phone")
    try:
        recorded = await record(paths, args.stop_secs, args.long_asks)
    except RuntimeError as exc:  # CorpusError: espeak-ng missing
        parser.error(str(exc))
    default = TurnJudge()
    print(line("the judge's defaults", default, score(recorded, default, "default", args.stop_secs)))
    for spec, judge in zip(args.also, variants, strict=True):
        print(line(f"the defaults with {spec}", judge, score(recorded, judge, spec, args.stop_secs)))
    if args.cue_alone:
        rows = score(recorded, default, "cue alone", args.stop_secs, cue_alone=True)
        print(line("the defaults, the text model's read always late (the cue alone)", default, rows))
    chosen = choose(recorded, args.stop_secs, args.max_cuts)
    print(line(f"the grid's best at <= {args.max_cuts:.1%} cut", chosen[1], chosen[2]) if chosen else "no rule fits")
    voices = sorted({t.voice for items in recorded.values() for t, _ in items})
    halves = [set(voices[::2]), set(voices[1::2])]
    held = []
    for train, test in (halves, halves[::-1]):
        pick = choose(recorded, args.stop_secs, args.max_cuts, train)
        if pick is None:
            print(f"chosen on {sorted(train)}: no rule fits")
            continue
        rows = score(recorded, pick[1], "held out", args.stop_secs, test)
        print(line(f"chosen on {sorted(train)}", pick[1], pick[2]))
        print(line(f"  scored on {sorted(test)}", None, rows))
        figures = {p: {k: v for k, v in asdict(r).items() if k != "outcomes"} for p, r in rows.items()}
        held.append({"train": sorted(train), "judge": asdict(pick[1]), "test": figures})
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {"load": os.getloadavg(), "paths": paths, "grid": GRID, "held_out": held}
        doc["chosen"] = asdict(chosen[1]) if chosen else None
        args.json.write_text(json.dumps(doc, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
