"""``streamvox bench conformance|load``: argument parsing and orchestration.

Without ``--url`` the bench starts streamvox itself (``python -m tts_service`` on a free loopback
port) and stops it afterwards; ``--baseline`` starts the batch baseline the same way (or uses
``--baseline-url``). Servers run as their own processes so their CPU time is theirs alone.
Exit status: 0 when the run completed (conformance: and every test of the server under test
passed), 1 when a conformance test failed, 2 for a problem the user can fix.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import os
import sys
import time
from collections.abc import Callable

from tts_service.protocol import WS_PATH

from . import BenchError

_LOAD_DEFAULT_SECONDS = 15.0
_LOAD_DEFAULT_LEVELS = "1,2,4,8,16"


def _guarded(cmd: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``cmd`` with a :class:`BenchError` printed as one line and exit status 2, as ``streamvox``
    prints its own errors: the server's CLI knows nothing of the bench's error type."""

    @functools.wraps(cmd)
    def run(args: argparse.Namespace) -> int:
        try:
            return cmd(args)
        except BenchError as exc:
            print(f"streamvox: {exc}", file=sys.stderr)
            return 2

    return run


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``bench`` under ``streamvox`` (the ``streamvox.commands`` entry point calls this)."""
    bench = sub.add_parser("bench", help="measure a streaming TTS server (and a batch baseline) with numbers")
    bsub = bench.add_subparsers(dest="bench_command", required=True)
    try:  # the Orpheus engine bench (its import does not pull in torch)
        from tts_service.orpheus.bench import add_engine_bench_parser
    except ImportError:
        pass
    else:
        add_engine_bench_parser(bsub)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--url",
            default=os.environ.get("STREAMVOX_URL"),
            help=f"server under test, ws://HOST:PORT{WS_PATH} (default: start streamvox on a free port)",
        )
        p.add_argument("--baseline", action="store_true", help="also run against the batch baseline, side by side")
        p.add_argument("--baseline-url", default=None, help="a running baseline (default: start one with --baseline)")
        p.add_argument("--json", metavar="FILE", default=None, help="write the results as JSON")
        p.add_argument("--plot", metavar="DIR", default=None, help="write PNG charts into DIR")
        p.add_argument("--prebuffer-ms", type=float, default=80.0, help="simulated player's jitter buffer (ms)")

    c = bsub.add_parser("conformance", help="the five tests that tell streaming from chunked batch")
    common(c)
    c.add_argument("--runs", type=int, default=5, help="runs per figure (default 5)")
    c.add_argument("--transcribe", action="store_true", help="check the input-update audio with Whisper tiny.en")
    c.add_argument("--no-sweep", action="store_true", help="skip the extra lengths (~2.4 s, ~12 s) of the TTFB plot")
    c.set_defaults(func=_guarded(conformance_cmd))

    ld = bsub.add_parser("load", help="concurrency sweep with simulated real-time players")
    common(ld)
    ld.add_argument("--streams", default=_LOAD_DEFAULT_LEVELS, help=f"levels (default {_LOAD_DEFAULT_LEVELS})")
    ld.add_argument(
        "--seconds",
        type=float,
        default=_LOAD_DEFAULT_SECONDS,
        help=f"talking time per level (default {_LOAD_DEFAULT_SECONDS:g})",
    )
    ld.add_argument(
        "--ttfb-goal-ms",
        type=float,
        default=None,
        metavar="MS",
        help="also print the most streams held with TTFB p95 <= MS (the rest of the health rule as is)",
    )
    ld.set_defaults(func=_guarded(load_cmd))

    md = bsub.add_parser("markdown", help="print the results of --json files as markdown tables (for docs)")
    md.add_argument("files", nargs="+", metavar="FILE")
    md.set_defaults(func=_guarded(markdown_cmd))


def _levels(spec: str) -> tuple[int, ...]:
    try:
        levels = tuple(sorted({int(x) for x in spec.split(",") if x.strip()}))
    except ValueError:
        raise BenchError(f"--streams {spec!r}: give comma-separated integers like 1,2,4,8") from None
    if not levels or levels[0] < 1:
        raise BenchError(f"--streams {spec!r}: levels must be >= 1")
    return levels


@contextlib.contextmanager
def _targets(args: argparse.Namespace, console):
    """Yield ``{"streaming": Target, "baseline": Target?}``, spawning what has no URL."""
    from tts_service.localproc import StartError as ServerStartError

    from .servers import BASELINE, DESCRIPTIONS, STREAMING, Target, spawned

    given: dict = {}
    if args.url:
        given[STREAMING] = Target(STREAMING, args.url, DESCRIPTIONS[STREAMING])
    if args.baseline and args.baseline_url:
        given[BASELINE] = Target(BASELINE, args.baseline_url, DESCRIPTIONS[BASELINE])
    missing = [n for n in (STREAMING, BASELINE) if n not in given and (n == STREAMING or args.baseline)]
    if missing:
        console.print(f"starting {' and '.join(missing)} server(s) on free loopback ports (loading the voice) ...")
    try:
        with spawned(*missing) as started:
            yield {**given, **started}
    except ServerStartError as exc:
        raise BenchError(str(exc)) from None


def _run(coro_fn: Callable, status, what: str):
    from .wire import WireError

    try:
        return asyncio.run(coro_fn())
    except WireError as exc:
        raise BenchError(f"{what}: {exc}") from None
    finally:
        status.update("done")


def _measure_each(args: argparse.Namespace, err, label: str, measure: Callable, after: Callable | None = None):
    """Run ``measure(target, progress)`` against streamvox, then the baseline (when asked), each
    server spawned or reached as the options say. Returns (results, {name: (url, description)})."""
    from .servers import BASELINE, STREAMING

    results: dict = {}
    with _targets(args, err) as targets, err.status(f"{label} ...") as status:
        for name in (STREAMING, BASELINE):
            target = targets.get(name)
            if target is None:
                continue
            err.print(f"[bold]{name}[/]: {target.description}\n  at {target.ws_url}")

            def progress(msg: str, _name: str = name) -> None:
                status.update(f"{label}, {_name}: {msg}")

            async def go(_t=target, _p=progress):
                return await measure(_t, _p)

            results[name] = _run(go, status, f"{label} against {target.ws_url}")
            if after is not None:
                after(name, results[name])
        descriptions = {n: (t.ws_url, t.description) for n, t in targets.items()}
    return results, descriptions


def conformance_cmd(args: argparse.Namespace) -> int:
    from . import conformance as C
    from . import report
    from .servers import BASELINE, STREAMING, load_average, machine

    out, err = report.console(), report.console(stderr=True)
    opts = C.ConformanceOptions(
        runs=max(1, args.runs),
        prebuffer_s=args.prebuffer_ms / 1000,
        transcribe=args.transcribe,
        sweep=not args.no_sweep,
    )
    whisper = None
    if args.transcribe:
        err.print("loading Whisper tiny.en for --transcribe ...")
        whisper = C.load_whisper()
    info = machine()
    t0 = time.perf_counter()

    async def measure(target, progress):
        return await C.run_conformance(target.ws_url, opts, progress, whisper)

    def verdicts(name: str, tests: list[dict]) -> None:
        err.print(f"  {name}: " + ", ".join(f"{t['name']} {'PASS' if t['passed'] else 'FAIL'}" for t in tests))

    results, descriptions = _measure_each(args, err, "conformance", measure, verdicts)
    info["load_avg_1m_at_end"] = load_average()
    tests, base = results[STREAMING], results.get(BASELINE)
    out.print(report.conformance_table(tests, base))
    out.print(report.criteria(tests))
    if base is not None:
        out.print(f"[dim]baseline: {descriptions[BASELINE][1]}[/]")
    out.print(
        f"[dim]{time.perf_counter() - t0:.0f} s on {info['cores']} cores ({info['cpu_model']}), "
        f"load average {info['load_avg_1m_at_start']} at start, {info['load_avg_1m_at_end']} at the end[/]"
    )
    if args.json:
        doc = report.document(
            "conformance",
            machine=info,
            options=dataclasses.asdict(opts),
            server={"url": descriptions[STREAMING][0], "description": descriptions[STREAMING][1]},
            body={
                "tests": tests,
                "passed": all(t["passed"] for t in tests),
                "baseline_over_streaming": report.headline_ratios(tests, base) if base else None,
            },
            baseline=None
            if base is None
            else {
                "url": descriptions[BASELINE][0],
                "description": descriptions[BASELINE][1],
                "tests": base,
                "passed": all(t["passed"] for t in base),
            },
        )
        report.write_json(args.json, doc)
        err.print(f"wrote {args.json}")
    if args.plot:
        from .plots import conformance_plots

        for p in conformance_plots(results, args.plot):
            err.print(f"wrote {p}")
    return 0 if all(t["passed"] for t in tests) else 1


def load_cmd(args: argparse.Namespace) -> int:
    from . import load as L
    from . import report
    from .servers import BASELINE, STREAMING, load_average, machine

    out, err = report.console(), report.console(stderr=True)
    opts = L.LoadOptions(levels=_levels(args.streams), seconds=args.seconds, prebuffer_s=args.prebuffer_ms / 1000)
    info = machine()
    t0 = time.perf_counter()

    async def measure(target, progress):
        res = {"levels": []}
        for n in opts.levels:
            lv = await L.run_level(target.ws_url, n, opts, progress)
            res["levels"].append(lv)
            err.print(f"  {report.level_line(lv)}")
            await asyncio.sleep(opts.settle_s)
        res["max_healthy_streams"] = L.max_healthy_streams(res["levels"])
        if args.ttfb_goal_ms is not None:
            res["ttfb_goal_ms"] = args.ttfb_goal_ms
            res["max_streams_at_goal"] = L.max_healthy_streams(res["levels"], args.ttfb_goal_ms)
        return res

    results, descriptions = _measure_each(args, err, "load", measure)
    info["load_avg_1m_at_end"] = load_average()
    main, base = results[STREAMING], results.get(BASELINE)
    out.print(report.load_table("load: streamvox", main["levels"], main["max_healthy_streams"]))
    if base is not None:
        out.print(report.load_table("load: batch baseline", base["levels"], base["max_healthy_streams"]))
        out.print(report.load_comparison(main["levels"], base["levels"]))
        out.print(f"[dim]baseline: {descriptions[BASELINE][1]}[/]")
    for label, res in (("streamvox", main), ("batch baseline", base)):
        if res is not None and "max_streams_at_goal" in res:
            out.print(f"{label}: max streams at TTFB p95 ≤ {res['ttfb_goal_ms']:g} ms: {res['max_streams_at_goal']}")
    out.print(
        f"[dim]healthy = TTFB p95 <= {L.TTFB_HEALTHY_MS:.0f} ms, no underrun after the first frame "
        f"({args.prebuffer_ms:.0f} ms jitter buffer), no refusal; server CPU in % of one core; "
        f"{time.perf_counter() - t0:.0f} s on {info['cores']} cores ({info['cpu_model']}), "
        f"load average {info['load_avg_1m_at_start']} at start, {info['load_avg_1m_at_end']} at the end[/]"
    )
    if args.json:
        opt = dataclasses.asdict(opts)
        opt.pop("turns")
        doc = report.document(
            "load",
            machine=info,
            options={**opt, "ttfb_healthy_ms": L.TTFB_HEALTHY_MS},
            server={"url": descriptions[STREAMING][0], "description": descriptions[STREAMING][1]},
            body=main,  # levels, max_healthy_streams (and the --ttfb-goal-ms figure)
            baseline=None
            if base is None
            else {"url": descriptions[BASELINE][0], "description": descriptions[BASELINE][1], **base},
        )
        report.write_json(args.json, doc)
        err.print(f"wrote {args.json}")
    if args.plot:
        from .plots import load_plots

        series = {STREAMING: main["levels"], **({BASELINE: base["levels"]} if base else {})}
        for p in load_plots(series, args.plot, L.TTFB_HEALTHY_MS):
            err.print(f"wrote {p}")
    return 0


def markdown_cmd(args: argparse.Namespace) -> int:
    import json

    from .report import markdown

    for path in args.files:
        try:
            with open(path, encoding="utf-8") as fh:
                doc = json.load(fh)
        except (OSError, ValueError) as exc:
            raise BenchError(f"cannot read {path}: {exc}") from None
        try:
            print(markdown(doc), end="\n\n")
        except ValueError as exc:
            raise BenchError(f"{path}: {exc}") from None
    return 0
