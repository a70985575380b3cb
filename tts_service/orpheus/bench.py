"""``streamvox bench engine``: how many real-time streams one device holds with the Orpheus engine.

Builds the engine (checkpoints or ``--random-weights``), warms it up (CUDA graphs on a GPU),
then for each concurrency level N of the sweep: N streams arrive spread over ``--ramp-s``, each
speaks one sentence of ``--tokens`` audio tokens, unpaced (as fast as the engine goes), through
the same scheduler and engine tick the server uses - only the sockets are missing. Per level:

* decode steps/s while all N streams decode together (one token per stream per step),
* tokens/s per stream (each stream's tokens over its own generation time; min and median),
* TTFB p50/p95: text in -> first decoded audio out, including prefill and queueing,
* whether every stream kept >= 82.03 tokens/s x 1.1 (real time with 10% headroom).

"max real-time streams" is the largest N where every stream did. Output: a table and JSON.
Run standalone as ``python -m tts_service.orpheus.bench`` (same options).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .config import REALTIME_TOKENS_PER_S, Sampling
from .serve import OrpheusSetupError, add_model_args

SENTENCES = (
    "The quick brown fox jumps over the lazy dog near the quiet river bank.",
    "Streaming speech starts playing long before the whole sentence is ready.",
    "Please hold on while I look up the details of your order for you.",
    "Every stream gets its own slot in the cache and its own position.",
)
DEFAULT_SWEEP = (1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192, 224, 256)
HEADROOM = 1.1


def add_engine_bench_parser(bench_sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``engine`` under the ``streamvox bench`` subcommands."""
    p = bench_sub.add_parser("engine", help="concurrency sweep of an LLM-backbone engine on one device (Orpheus)")
    _add_args(p)
    p.set_defaults(func=run)
    return p


def _add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--engine", choices=["orpheus"], default="orpheus")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    add_model_args(p, voice=False)
    p.add_argument("--max-streams", type=int, default=256, help="largest concurrency level of the sweep")
    p.add_argument(
        "--sweep",
        default=None,
        help=f"comma-separated levels (default {','.join(map(str, DEFAULT_SWEEP))} up to --max-streams)",
    )
    p.add_argument("--tokens", type=int, default=420, help="audio tokens per stream (420 = 60 frames = 5.1 s)")
    p.add_argument("--ramp-s", type=float, default=0.5, help="arrivals spread over this many seconds")
    p.add_argument("--level-timeout", type=float, default=60.0, help="give up a level after this many seconds")
    p.add_argument("--greedy", action="store_true", help="greedy decoding instead of Orpheus' sampling settings")
    p.add_argument(
        "--no-early-stop", action="store_true", help="run every level even after one fell far below real time"
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--json", default="out/bench_engine.json", help="where to write the results")


@dataclass
class _Track:
    arrive: float
    first_token: float | None = None
    last_token: float | None = None
    tokens: int = 0
    ttfb: float | None = None
    finished: str | None = None


@dataclass
class _Level:
    streams: int
    ticks: list[tuple[float, int, float, float, float]] = field(default_factory=list)  # (wall, rows, pre, step, codec)
    tracks: dict[int, _Track] = field(default_factory=dict)
    timed_out: bool = False


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, round(q / 100 * (len(v) - 1))))]


def run_level(engine, n: int, *, tokens: int, ramp_s: float, sampling: Sampling, timeout_s: float) -> dict:
    """N streams through the real scheduler and engine ticks; returns this level's figures."""
    from .scheduler import OrpheusOptions, OrpheusScheduler

    engine.opt.max_new_tokens = tokens
    sched = OrpheusScheduler(
        slots=engine.max_slots,
        tokenize=engine.prompt_ids,
        options=OrpheusOptions(sampling=sampling, capacity=1000.0, max_held_s=1e9, prefill_tokens=4096),
        max_prompt=engine.max_prompt,
    )
    level = _Level(n)
    arrivals = [i * ramp_s / n for i in range(n)]
    t0 = time.monotonic()
    nxt = 0
    while True:
        now = time.monotonic()
        while nxt < n and arrivals[nxt] <= now - t0:
            sid = nxt + 1
            sched.add(sid, voice=engine.default_voice, pace=False, now=now)
            sched.push_text(sid, SENTENCES[nxt % len(SENTENCES)], now)
            sched.end(sid, now)
            level.tracks[sid] = _Track(arrive=now)
            nxt += 1
        plan = sched.schedule(now)
        if plan is not None:
            res = engine.tick(plan)
            done_at = time.monotonic()
            sched.update(plan, res, done_at)
            level.ticks.append((done_at - now, len(plan.decode), res.prefill_s, res.step_s, res.codec_s))
            for ev in res.events.values():
                tr = level.tracks.get(ev.sid)
                if tr is not None and ev.tokens:
                    tr.tokens += ev.tokens
                    tr.first_token = tr.first_token or done_at
                    tr.last_token = done_at
        elif nxt < n:
            time.sleep(max(0.0, min(0.002, t0 + arrivals[nxt] - time.monotonic())))
        for out in sched.release(time.monotonic()):
            tr = level.tracks.get(out.sid)
            if out.ttfb_s is not None and tr is not None:
                tr.ttfb = out.ttfb_s
            if out.kind in ("done", "error") and tr is not None:
                tr.finished = out.kind if out.kind == "done" else f"error: {out.message}"
                sched.discard(out.sid)
        if nxt == n and all(t.finished for t in level.tracks.values()):
            break
        if time.monotonic() - t0 > timeout_s:
            level.timed_out = True
            break
    for sid in list(level.tracks):
        sched.cancel(sid)
    # Give every slot back to the engine (a timed-out level leaves some claimed).
    for slot in range(engine.max_slots):
        engine.release(slot)
    return _summarise(level, tokens)


def _summarise(level: _Level, tokens: int) -> dict:
    n = level.streams
    full = [t for t in level.ticks if t[1] == n and t[1] > 0]
    peak = max((t[1] for t in level.ticks), default=0)
    # Steps/s at full concurrency; if the streams never all overlapped (short runs, long ramp),
    # at the highest concurrency reached - reported as peak_concurrency.
    busy = (
        full
        or [t for t in level.ticks if t[1] >= max(1, int(0.9 * n))]
        or [t for t in level.ticks if t[1] == peak and peak > 0]
    )
    steps_per_s = len(busy) / sum(t[0] for t in busy) if busy else None
    rates = [
        (t.tokens - 1) / (t.last_token - t.first_token)
        for t in level.tracks.values()
        if t.tokens > 1 and t.last_token and t.first_token and t.last_token > t.first_token
    ]
    ttfbs = [t.ttfb for t in level.tracks.values() if t.ttfb is not None]
    errors = [t.finished for t in level.tracks.values() if t.finished and t.finished != "done"]
    target = REALTIME_TOKENS_PER_S * HEADROOM
    complete = not level.timed_out and not errors and len(rates) == n
    mean = lambda i: 1000 * statistics.fmean(t[i] for t in busy) if busy else None  # noqa: E731
    return {
        "streams": n,
        "decode_steps_per_s": steps_per_s,
        "step_ms": mean(3),
        "tick_ms": 1000 / steps_per_s if steps_per_s else None,
        "prefill_ms_per_tick": mean(2),
        "codec_ms_per_tick": mean(4),
        "tokens_per_s_min": min(rates) if rates else None,
        "tokens_per_s_median": statistics.median(rates) if rates else None,
        "ttfb_ms_p50": 1000 * _pct(ttfbs, 50) if ttfbs else None,
        "ttfb_ms_p95": 1000 * _pct(ttfbs, 95) if ttfbs else None,
        "steady_ticks": len(full),
        "peak_concurrency": peak,
        "tokens_per_stream": tokens,
        "realtime": bool(complete and min(rates) >= target),
        "timed_out": level.timed_out,
        "errors": errors[:3],
    }


def verify_graphs(engine, steps: int = 21) -> dict | None:
    """Greedy tokens with the captured CUDA graphs == eager decoding (None when no graphs)."""
    if not engine.graphs:
        return None
    from .scheduler import PrefillJob

    ids = tuple(engine.prompt_ids(SENTENCES[0], None))

    def generate() -> list[dict[int, int]]:
        for slot in (0, 1):
            engine.claim(slot, -1 - slot, len(ids), Sampling.greedy())
        engine.prefill([PrefillJob(s, -1 - s, ids, 0, len(ids) - 1) for s in (0, 1)])
        out = [engine.step([0, 1]) for _ in range(steps)]
        engine.release(0)
        engine.release(1)
        return out

    with_graphs = generate()
    saved, engine._graphs = engine._graphs, {}
    try:
        eager = generate()
    finally:
        engine._graphs = saved
    mismatches = sum(1 for a, b in zip(with_graphs, eager) if a != b)
    return {"steps": steps, "mismatched_steps": mismatches, "equal": mismatches == 0}


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def render_table(levels: list[dict]) -> str:
    head = (
        f"{'streams':>7} {'steps/s':>8} {'step ms':>8} {'tok/s min':>9} {'tok/s med':>9} "
        f"{'TTFB p50':>9} {'TTFB p95':>9} {'prefill':>8} {'codec':>7}  real time"
    )
    lines = [head, "-" * len(head)]
    for r in levels:
        lines.append(
            f"{r['streams']:>7} {_fmt(r['decode_steps_per_s'], '8.1f')} {_fmt(r['step_ms'], '8.2f')} "
            f"{_fmt(r['tokens_per_s_min'], '9.1f')} {_fmt(r['tokens_per_s_median'], '9.1f')} "
            f"{_fmt(r['ttfb_ms_p50'], '7.0f')}ms {_fmt(r['ttfb_ms_p95'], '7.0f')}ms "
            f"{_fmt(r['prefill_ms_per_tick'], '6.2f')}ms {_fmt(r['codec_ms_per_tick'], '5.2f')}ms  "
            + ("yes" if r["realtime"] else ("TIMEOUT" if r["timed_out"] else "no"))
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    import torch

    from .serve import engine_from_args

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.sweep:
        sweep = sorted({int(x) for x in args.sweep.split(",")})
    else:
        sweep = sorted({s for s in DEFAULT_SWEEP if s < args.max_streams} | {args.max_streams})
    t_start = time.perf_counter()
    try:
        engine = engine_from_args(args, max_slots=max(sweep))
    except OrpheusSetupError as exc:
        print(f"streamvox bench engine: {exc}", file=sys.stderr)
        return 2
    build_s = time.perf_counter() - t_start
    graphs = verify_graphs(engine)
    if graphs is not None:
        print(
            f"CUDA graphs vs eager, greedy: {'identical' if graphs['equal'] else 'DIFFERENT'} "
            f"over {graphs['steps']} steps"
        )
    sampling = Sampling.greedy() if args.greedy else Sampling()
    target = REALTIME_TOKENS_PER_S * HEADROOM
    cuda = engine.device.type == "cuda"
    meta = {
        "engine": "orpheus",
        "random_weights": args.random_weights,
        "model_path": args.model_path,
        "device": torch.cuda.get_device_name(engine.device) if cuda else platform.processor() or "cpu",
        "torch": torch.__version__,
        "dtype": str(engine.model.tok_embeddings.weight.dtype).replace("torch.", ""),
        "params_b": round(engine.model.cfg.n_params() / 1e9, 3),
        "max_slots": engine.max_slots,
        "max_len": engine.max_len,
        "kv_cache_gib": round(engine.kv_cache_bytes() / 2**30, 2),
        "cuda_graphs": engine.graphs,
        "graphs_match_eager": graphs,
        "warmup_step_ms": {str(k): round(v * 1000, 3) for k, v in engine.step_times.items()},
        "build_and_warmup_s": round(build_s, 1),
        "codec_context": {"left": engine.codec.left, "right": engine.codec.right, "chunks": engine.codec.chunks},
        "tokens_per_stream": args.tokens,
        "ramp_s": args.ramp_s,
        "realtime_tokens_per_s": round(REALTIME_TOKENS_PER_S, 2),
        "required_tokens_per_s": round(target, 2),
    }
    if args.random_weights:
        meta["warning"] = "random weights: timings are real, the audio is noise"
    # One short unreported level first: first-time costs (allocator, kernels per shape) stay out.
    run_level(engine, min(4, max(sweep)), tokens=70, ramp_s=0.0, sampling=sampling, timeout_s=args.level_timeout)
    levels: list[dict] = []
    for n in sweep:
        r = run_level(
            engine, n, tokens=args.tokens, ramp_s=args.ramp_s, sampling=sampling, timeout_s=args.level_timeout
        )
        levels.append(r)
        print(
            f"  {n:>4} streams: {_fmt(r['decode_steps_per_s'], '.1f')} steps/s, "
            f"min {_fmt(r['tokens_per_s_min'], '.1f')} tok/s per stream, "
            f"TTFB p95 {_fmt(r['ttfb_ms_p95'], '.0f')} ms",
            flush=True,
        )
        report = _report(meta, levels, engine, t_start)
        _write(args.json, report)  # after every level: a run cut short keeps what it measured
        if r["timed_out"] or (not args.no_early_stop and (r["tokens_per_s_min"] or 0) < 0.5 * target):
            print(f"  stopping the sweep: {n} streams are far below real time")
            break
    report = _report(meta, levels, engine, t_start)
    print()
    print(render_table(levels))
    best, p95 = report["max_realtime_streams"], report["ttfb_ms_p95_at_max"]
    print(
        f"\nmax real-time streams (each >= {target:.1f} tokens/s): {best}" + (f", TTFB p95 {p95:.0f} ms" if p95 else "")
    )
    if args.json:
        _write(args.json, report)
        print(f"wrote {args.json}")
    return 0


def _report(meta: dict, levels: list[dict], engine, t_start: float) -> dict:
    import torch

    ok = [r["streams"] for r in levels if r["realtime"]]
    best = max(ok) if ok else 0
    at_best = next((r for r in levels if r["streams"] == best), None)
    cuda = engine.device.type == "cuda"
    return {
        **meta,
        "max_realtime_streams": best,
        "ttfb_ms_p95_at_max": at_best["ttfb_ms_p95"] if at_best else None,
        "peak_gpu_memory_gib": round(torch.cuda.max_memory_allocated(engine.device) / 2**30, 2) if cuda else None,
        "levels": levels,
        "total_s": round(time.perf_counter() - t_start, 1),
    }


def _write(path: str | None, report: dict) -> None:
    if path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(report, indent=2))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tts_service.orpheus.bench", description=__doc__.splitlines()[0])
    _add_args(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
