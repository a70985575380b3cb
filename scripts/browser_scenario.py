"""The browser scenario N times each way: figures at the page, the server's stages beside them.

The demo (``python -m pipelines.pipecat_agent``, started once) and headless Chromium with the
browser test's fake-microphone file (``support.browser.harness``: silence; speech over the
greeting; silence; a question), ``--runs`` sessions with headphones (echo cancellation off) and
``--runs`` with the browser's echo cancellation on (and, with ``--modes ...,agent-cancels``, on
loudspeakers with the raw microphone, the agent cancelling alone: the page's default from 12-07). Each
session gives one barge-in (over the greeting) and two replies (to the barge-in, to the question).
Printed and written as JSON:

* at the page: voice-to-voice (end of the caller's speech -> first bot audio), barge-in yield
  (onset -> bot 20 dB quieter) and silence (onset -> bot audio gone), median and p95;
* the server's stages of the same turns (median), from the figures it sent the page.

    .venv/bin/python scripts/browser_scenario.py --runs 5 --json out/browser_scenario.json

With ``--echo-db`` the page sends the microphone plus the agent's own voice, as a loudspeaker in a
small room gives it back (``support/browser/echo_path.js``: ``--echo-delay-ms`` later, drifting
``--echo-drift`` ms/s, after the browser's own processing), each level its own set of sessions,
cut at ``--session-s``; each session counts its **self-interruptions** (the agent stopping or
answering with the caller's file silent, ``Session.self_interruptions``)::

    .venv/bin/python scripts/browser_scenario.py --runs 3 --echo-db=-6,0 --echo-delay-ms 200

``LLM_BASE_URL`` / ``TTS_URL`` in the environment are passed to the demo (a real LLM, a remote
TTS server), as with ``make demo``. ``--lead-s`` and ``--greeting`` move the barge-in later into a
longer greeting (the echo-cancellation comparison in docs/BENCHMARKS.md)::

    .venv/bin/python scripts/browser_scenario.py --runs 3 --lead-s 7 --greeting "$(cat long.txt)"
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # support.browser.harness

from bench.stats import median, percentile, rnd
from support.browser import harness as H  # the test's scenario, not a copy of it

TURN_STAGES = ("vad_stop", "stt_final", "end_of_turn", "llm_first_token", "tts_first_audio", "transport_first_audio")
BARGE_STAGES = ("vad_start", "interruption", "bot_stopped", "cancel_ack")


def _stats(values: list[float | None]) -> dict[str, float | int | None]:
    values = [v for v in values if v is not None]
    return {"median": rnd(median(values)), "p95": rnd(percentile(values, 95)), "n": len(values)}


def _stage_medians(servers: list[dict], keys: tuple[str, ...]) -> dict[str, float | None]:
    out = {k: rnd(median([s[k] for s in servers if s.get(k) is not None])) for k in keys}
    if keys is TURN_STAGES:
        out["tts_ttfb"] = rnd(median([s["tts_ttfb"] for s in servers if s.get("tts_ttfb") is not None]))
    return out


def summarise(sessions: list[dict]) -> dict:
    """One mode's figures from its sessions' ``Session.figures()``."""
    turns = [t for s in sessions for t in s["turns"]]
    measured = [s["barge_in"] for s in sessions if s["barge_in"]]
    # the caller's onset fell in the agent's pause (silence 0 by luck): counted, not in the medians
    in_pause = [b for b in measured if b.get("in_pause")]
    barges = [b for b in measured if b.get("silence_ms") is not None and not b.get("in_pause")]
    files = [s["from_file"] for s in sessions]
    file_v2v = [f[k] for f in files for k in ("barge_in_reply_v2v_ms", "answer_v2v_ms") if f[k] is not None]
    answers = [s["answer"] for s in sessions if s["answer"]]
    selfs = [s["self_interruptions"] for s in sessions if s.get("self_interruptions")]
    return {
        "sessions": len(sessions),
        "echo": sessions[0].get("echo_path") if sessions else None,
        "self_interruptions": {
            "per_run": [x["count"] for x in selfs],
            "total": sum(x["count"] for x in selfs),
            "stops": sum(len(x["stops"]) for x in selfs),
            "answers": sum(len(x["answers"]) for x in selfs),
            "session_s": [x["session_s"] for x in selfs],
            "per_30_s": rnd(
                median([30 * x["count"] / x["session_s"] for x in selfs if x["session_s"]]) if selfs else None
            ),
        },
        "voice_to_voice_ms": _stats([t["v2v_ms"] for t in turns]),
        # the reply to the question alone (the other reply answers speech that trails off, "..., please.")
        "answer_voice_to_voice_ms": _stats([a["v2v_ms"] for a in answers]),
        "answer_server_stages_ms": _stage_medians([a["server"] for a in answers if a.get("server")], TURN_STAGES),
        "voice_to_voice_server_stages_ms": _stage_medians([t["server"] for t in turns if t.get("server")], TURN_STAGES),
        "barge_in_yield_ms": _stats([b["yield_ms"] for b in barges]),
        "barge_in_silence_ms": _stats([b["silence_ms"] for b in barges]),
        "barge_in_server_stages_ms": _stage_medians([b["server"] for b in barges if b.get("server")], BARGE_STAGES),
        "browser_jitter_buffer_ms": _stats([b.get("jitter_buffer_ms") for b in barges]),
        # every second of every session: how long the browser held the agent's audio before playing it
        "browser_jitter_buffer_all_ms": _stats([x["ms"] for s in sessions for x in s.get("jitter_series") or []]),
        "barge_ins_missed": len(sessions) - len(measured),
        "barge_ins_kept_talking": len(measured) - len(barges) - len(in_pause),
        "barge_ins_in_a_pause": len(in_pause),
        # timed from the mic file's own speech instead of the page's (processed) mic signal
        "voice_to_voice_from_file_ms": _stats(file_v2v),
        "barge_in_silence_from_file_ms": _stats([f["barge_in_silence_ms"] for f in files if f["barge_in_silence_ms"]]),
    }


def _line(name: str, st: dict) -> str:
    return f"  {name:<26} median {st['median']!s:>7} ms   p95 {st['p95']!s:>7} ms   (n={st['n']})"


def report(mode: str, s: dict) -> str:
    si = s.get("self_interruptions") or {}
    selfs = (
        f"  self-interruptions (caller silent): {si['total']} in all ({si['stops']} stops,"
        f" {si['answers']} answers); per run {si['per_run']} over {si['session_s']} s; median per 30 s {si['per_30_s']}"
        if si
        else "  self-interruptions: not counted in this run"
    )
    stages = ", ".join(f"{k} {v}" for k, v in s["voice_to_voice_server_stages_ms"].items())
    bstages = ", ".join(f"{k} {v}" for k, v in s["barge_in_server_stages_ms"].items())
    return "\n".join(
        [
            f"{mode}: {s['sessions']} sessions; at the page {s['barge_ins_missed']} without a barge-in measured,"
            f" {s['barge_ins_kept_talking']} where the agent kept talking,"
            f" {s.get('barge_ins_in_a_pause', 0)} with the onset in the agent's pause (not in the medians)",
            selfs,
            _line("voice-to-voice at page", s["voice_to_voice_ms"]),
            f"    server stages (median ms after the caller's speech end): {stages}",
            _line("  of which the question's", s["answer_voice_to_voice_ms"]),
            "    server stages: " + ", ".join(f"{k} {v}" for k, v in s["answer_server_stages_ms"].items()),
            _line("barge-in yield at page", s["barge_in_yield_ms"]),
            _line("barge-in silence at page", s["barge_in_silence_ms"]),
            f"    server stages (median ms after the caller's speech onset): {bstages}",
            _line("browser jitter buffer", s["browser_jitter_buffer_ms"]) + "  (at the barge-in's onset)",
            _line("  ... over the session", s["browser_jitter_buffer_all_ms"]) + "  (each second's)",
            "  timed from the microphone file's speech instead of the page's mic signal:",
            _line("voice-to-voice", s["voice_to_voice_from_file_ms"]),
            _line("barge-in silence", s["barge_in_silence_from_file_ms"]),
        ]
    )


def _echo(level: str, args: argparse.Namespace) -> H.EchoPath | None:
    """One ``--echo-db`` level (``none``: no echo) with the other echo flags."""
    level = level.strip()
    if level.lower() == "none":
        return None
    try:
        db = float(level)
    except ValueError:
        raise ValueError(f"{level!r} is not a level in dB (nor 'none')") from None
    return H.EchoPath(
        db=db,
        delay_ms=args.echo_delay_ms,
        drift_ms_per_s=args.echo_drift,
        room_seed=args.room_seed,
        rt60_s=args.room_rt60,
    )


# the page's echo modes by name: headphones (raw microphone, nobody cancels), loudspeakers with the
# browser's echo cancellation (the agent cleans what it lets through), loudspeakers with the raw
# microphone and the agent cancelling alone (the page's default); the value is the page's loudspeakers setting
MODES = {"headphones": "browser", "echo-cancellation": "browser", "agent-cancels": "agent"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="sessions per mode (default 5)")
    parser.add_argument("--modes", default="headphones,echo-cancellation", help="comma-separated, in this order")
    parser.add_argument("--json", type=Path, default=H.OUT / "scenario.json")
    parser.add_argument("--verbose", action="store_true", help="the demo agent's DEBUG log (Pipecat's frames)")
    parser.add_argument(
        "--lead-s", type=float, default=H.LEAD_S, help=f"the barge-in starts this long after the mic opens ({H.LEAD_S})"
    )
    parser.add_argument("--greeting", help="the agent's greeting (AGENT_GREETING; default: the demo's)")
    parser.add_argument("--summarise", type=Path, metavar="JSON", help="only print the summary of an earlier run")
    echo = parser.add_argument_group("echo path (the agent's voice back into the microphone)")
    echo.add_argument(
        "--echo-db",
        default="none",
        help="echo levels against the agent's track, comma-separated dB, 'none' for no echo; each its own"
        " sessions (e.g. --echo-db=none,-6,0; default none)",
    )
    echo.add_argument("--echo-delay-ms", type=float, default=200.0, help="the echo's delay (default 200)")
    echo.add_argument("--echo-drift", type=float, default=0.0, help="the delay's drift, ms per second (default 0)")
    echo.add_argument("--room-seed", type=int, default=1, help="the synthetic room's seed (default 1)")
    echo.add_argument("--room-rt60", type=float, default=0.3, help="the room's RT60, seconds (default 0.3)")
    echo.add_argument(
        "--session-s",
        type=float,
        help=f"cut each session here (mic time); default {H.ECHO_SESSION_S:g} s with an echo, else at the answer",
    )
    args = parser.parse_args(argv)
    if args.summarise:
        saved = json.loads(args.summarise.read_text())["sessions"]
        for mode, sessions in saved.items():
            print(report(mode, summarise(sessions)) + "\n")
        return 0
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = set(modes) - set(MODES)
    if unknown or args.runs < 1:
        parser.error(f"--modes takes {', '.join(MODES)} (not {sorted(unknown)}); --runs >= 1")
    if not 0.5 <= args.lead_s <= 60:
        parser.error("--lead-s takes 0.5 to 60 seconds")
    if args.greeting is not None and not args.greeting.strip():
        parser.error("--greeting takes a text (leave it out for the demo's own)")
    try:
        echoes = [_echo(level, args) for level in args.echo_db.split(",") if level.strip()]
    except ValueError as exc:
        parser.error(f"--echo-db / --echo-delay-ms / --echo-drift / --room-*: {exc}")
    if not echoes:
        parser.error("--echo-db takes levels in dB and/or 'none'")
    if args.session_s is not None and not 5 <= args.session_s <= 300:
        parser.error("--session-s takes 5 to 300 seconds")
    paths = H.chromium_paths()
    if isinstance(paths, str):
        print(f"browser_scenario: {paths}", file=sys.stderr)
        return 2
    plan = H.make_mic_wav(H.OUT / "mic.wav", lead_s=args.lead_s)
    results: dict[str, dict] = {}
    raw: dict[str, list] = {}
    t0 = time.monotonic()
    env = dict(os.environ, AGENT_GREETING=args.greeting) if args.greeting else None
    with H.Demo(env=env, verbose=args.verbose) as demo:
        for mode, echo in ((m, e) for m in modes for e in echoes):
            name = mode if echo is None else f"{mode}, {echo.describe()}"
            session_s = args.session_s if args.session_s is not None or echo is None else H.ECHO_SESSION_S
            raw[name] = []
            for i in range(args.runs):
                s = H.run_session(
                    demo.base,
                    plan,
                    headphones=mode == "headphones",
                    loudspeakers=MODES[mode],
                    browser=paths[0],
                    driver_path=paths[1],
                    echo=echo,
                    session_s=session_s,
                )
                if s.page.get("state") != "connected":
                    print(f"{name} run {i + 1}: the page failed: {s.page.get('error')}", file=sys.stderr)
                    continue
                raw[name].append(
                    dict(
                        s.figures(),
                        echo_path=echo and asdict(echo),
                        transcript=s.page["transcript"],
                        jitter_series=s.page.get("jitterSeries"),
                    )
                )
                print(f"{name} run {i + 1}/{args.runs}: {json.dumps(raw[name][-1], default=str)}", flush=True)
            results[name] = summarise(raw[name])
    print(f"\n{sum(len(v) for v in raw.values())} sessions in {time.monotonic() - t0:.0f} s\n")
    for mode, s in results.items():
        print(report(mode, s) + "\n")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"summary": results, "sessions": raw}, indent=1, default=str))
    print(f"written: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
