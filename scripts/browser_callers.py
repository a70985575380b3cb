"""Voice-to-voice at the page for callers the agent never heard: the caller corpus in a real browser.

    .venv/bin/python scripts/browser_callers.py --json out/browser_callers.json     # ~6 min

The browser scenario (``scripts/browser_scenario.py``) speaks with the agent's own voice, two fixed
sentences: a flattering caller. Here each caller voice of the corpus (``support/callers.py``) that
is not the agent's timbre gets one session in headless Chromium against the demo
(``python -m pipelines.pipecat_agent``, started once, as ``make demo`` runs it): the greeting plays
out, then the voice's *complete* turns follow one by one, each with time for the agent's reply.
Per reply the page measures voice-to-voice (end of the caller's speech -> the agent's first audio,
from the audio energies); the server's stages of the same turn are beside it. Printed per voice and
over all, median and p95; ``--headphones 0`` runs the page in its echo-cancellation mode instead.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # support.*

from bench.stats import median, percentile
from pipelines.pipecat_figures import TURN_STAGES
from support.browser import harness as H  # the browser test's page driver, not a copy of it
from support.callers import VOICES, corpus

GREETING_S = 9.0  # the demo's greeting is ~6 s after Connect: the first caller turn comes after it
REPLY_S = 15.0  # after each turn: the agent's reply (SmolLM2 rambles: ~10 s at times) and a breath
STAGES = tuple(TURN_STAGES)  # the server's figures per turn, in the order the agent reports them


def mic_for(voice: str, path: Path, limit: int) -> tuple[H.MicPlan, list[dict]]:
    """The microphone file for one voice: silence over the greeting, then its complete turns, each
    followed by ``REPLY_S`` of silence. Returns the plan and each turn's (id, text, start, end) in the file."""
    import soxr

    turns = [u for u in corpus(voice) if u.label == "complete"][:limit]
    if not turns:
        raise SystemExit(f"browser_callers: the corpus has no complete turn for {voice}")
    parts = [np.zeros(int(GREETING_S * H.MIC_RATE), np.float32)]
    placed = []
    for u in turns:
        speech = u.audio()[int(u.speech_start_s * u.sample_rate) : int(u.speech_end_s * u.sample_rate)]
        speech = soxr.resample(speech, u.sample_rate, H.MIC_RATE).astype(np.float32)
        start = sum(len(p) for p in parts) / H.MIC_RATE
        parts += [speech, np.zeros(int(REPLY_S * H.MIC_RATE), np.float32)]
        placed.append({"id": u.id, "text": u.text, "start": start, "end": start + len(speech) / H.MIC_RATE})
    parts.append(np.zeros(int(H.TAIL_S * H.MIC_RATE), np.float32))
    H._write_wav(path, np.clip(np.concatenate(parts), -1.0, 1.0))
    return H.MicPlan(path, (placed[0]["start"], placed[0]["end"]), (placed[-1]["start"], placed[-1]["end"])), placed


def replies(session: H.Session, placed: list[dict]) -> list[dict]:
    """Each caller turn with the page's reply to it: the turn record whose speech end is that turn's end."""
    out = []
    ends = [(session.mic_t(r["speechEnd"]), r) for r in session.records("turn")]
    for turn in placed:
        match = next((r for t, r in ends if turn["end"] - 0.5 <= t <= turn["end"] + 1.0), None)
        out.append({**turn, "v2v_ms": match and match["v2v_ms"], "server": match and match.get("server")})
    return out


def summary(rows: list[dict]) -> dict:
    v2v = [r["v2v_ms"] for r in rows if r["v2v_ms"] is not None]
    servers = [r["server"] for r in rows if r["server"]]
    stages = {k: median([s[k] for s in servers if s.get(k) is not None]) for k in STAGES}
    return {
        "replies": len(v2v),
        "turns": len(rows),
        "v2v_ms_median": median(v2v),  # as scripts/browser_scenario.py: interpolated percentiles
        "v2v_ms_p95": percentile(v2v, 95),
        "stages_ms_median": stages,
    }


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--voices", help="comma-separated voice ids (default: every voice not the agent's timbre)")
    parser.add_argument("--turns", type=int, default=4, help="complete turns per voice (default 4)")
    parser.add_argument("--headphones", type=int, choices=(0, 1), default=1, help="the page's mode (default 1)")
    parser.add_argument("--json", type=Path, default=H.OUT / "callers.json")
    args = parser.parse_args(argv)
    known = [v.id for v in VOICES if not v.agent_timbre]
    voices = args.voices.split(",") if args.voices else known
    if unknown := [v for v in voices if v not in {x.id for x in VOICES}]:
        parser.error(f"unknown voice(s) {unknown}; voices: {', '.join(v.id for v in VOICES)}")
    if not 1 <= args.turns <= 10:
        parser.error("--turns takes 1 to 10")
    paths = H.chromium_paths()
    if isinstance(paths, str):
        print(f"browser_callers: {paths}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    per_voice: dict[str, list[dict]] = {}
    sessions: dict[str, dict] = {}  # what the page heard and measured, for a turn without a reply
    with H.Demo() as demo:
        for i, voice in enumerate(voices):
            plan, placed = mic_for(voice, H.OUT / f"callers-{voice}.wav", args.turns)
            timeout = plan.question[1] + 40.0
            s = H.run_session(
                demo.base,
                plan,
                headphones=bool(args.headphones),
                browser=paths[0],
                driver_path=paths[1],
                timeout_s=timeout,
            )
            if s.page.get("state") != "connected":
                print(f"{voice}: the page failed: {s.page.get('error')}", file=sys.stderr)
                continue
            per_voice[voice] = rows = replies(s, placed)
            sessions[voice] = {
                "transcript": s.page.get("transcript"),
                "page_turns": [(round(s.mic_t(r["speechEnd"]), 2), r["v2v_ms"]) for r in s.records("turn")],
            }
            got = ", ".join(f"{_ms(r['v2v_ms'])}" for r in rows)
            print(f"[{i + 1}/{len(voices)}] {voice}: voice-to-voice ms {got}", flush=True)
    every = [r for rows in per_voice.values() for r in rows]
    print(f"\n{len(per_voice)} sessions in {time.monotonic() - t0:.0f} s, headphones={args.headphones}\n")
    stages = ", ".join(STAGES)
    print(f"| caller voice | replies / turns | voice-to-voice p50 | p95 | server stages p50 ({stages}) |")
    print("|---|---:|---:|---:|---|")
    for name, rows in [*per_voice.items(), ("**all**", every)]:
        s = summary(rows)
        st = ", ".join(_ms(s["stages_ms_median"][k]) for k in STAGES)
        print(f"| {name} | {s['replies']} / {s['turns']} | {_ms(s['v2v_ms_median'])} | {_ms(s['v2v_ms_p95'])} | {st} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    doc = {"headphones": args.headphones, "summary": summary(every), "voices": per_voice, "sessions": sessions}
    args.json.write_text(json.dumps(doc, indent=1, default=str))
    print(f"\nwritten: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
