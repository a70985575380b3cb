"""The Piper engine on one device, swept with ``bench load``'s agents, and the figure a GPU is
bought on: the most streams it holds at TTFB p95 within a goal (150 ms by default).

``scripts/gpu_check.sh`` runs it with ``--device cuda``. Why an entry of its own and not
``streamvox bench load``: the GPU machine is lent for minutes and the check runs once, so this

* says in one line why it is skipped when onnxruntime cannot open a CUDA session (exit 0: the
  rest of the check goes on), instead of failing in the server's start-up;
* writes its JSON after every level, starts no level its time budget cannot finish, and stops
  once two levels in a row missed the goal (no higher level can count, see
  :func:`~bench.load.max_healthy_streams`; the one after a first miss tells a
  one-level spike from the limit); terminated by its stage's ``timeout``, it still stops the
  server and prints the figure of the levels done;
* measures its own agents' CPU: they run in this one process, on the same machine's CPUs as the
  server, and can bound the figure before the GPU does.

The levels, their figures and the health rule are ``bench load``'s (:mod:`bench.load`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import sys
import time
from collections.abc import Sequence

from . import load as L
from . import report
from .servers import load_average, machine

DEFAULT_GOAL_MS = 150.0
CLIENT_BOUND_PCT = 80.0  # of one core: above it the agents' event loop may be what is slow
MISSES_TO_STOP = 2  # levels in a row that miss the goal before the sweep stops
_FINISH_S = 6.0  # a level's turns run on after its talking time: at most about one turn (1-6 s)


def cuda_problem() -> str | None:
    """Why onnxruntime cannot run a session on CUDA here (None: it can).

    ``get_available_providers()`` lists what the wheel was built with; a missing CUDA or cuDNN
    library shows only when a session opens, and onnxruntime then falls back to the CPU with a
    log line. So open a one-node session and see which provider it got.
    """
    try:
        import onnxruntime as ort
    except ImportError:
        return "onnxruntime is not installed"
    providers = ort.get_available_providers()
    if "CUDAExecutionProvider" not in providers:
        return (
            f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (it offers {', '.join(providers)}): "
            "pip install onnxruntime-gpu (in place of onnxruntime)"
        )
    try:
        from onnx import TensorProto, helper

        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
        graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [x], [y])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8
        opts = ort.SessionOptions()
        opts.log_severity_level = 4  # the fallback's own error lines would read as a crash
        session = ort.InferenceSession(
            model.SerializeToString(), opts, providers=["CUDAExecutionProvider", "CPUExecutionProvider"]
        )
    except Exception as exc:  # any failure to open the probe is the reason to report
        return f"a CUDA session of onnxruntime {ort.__version__} did not open: {exc}"
    if session.get_providers()[0] != "CUDAExecutionProvider":
        return (
            f"onnxruntime {ort.__version__} lists CUDAExecutionProvider but a session fell back to "
            f"{session.get_providers()[0]}: the CUDA 12 / cuDNN 9 libraries it needs are not on the loader's "
            "path (from pip's nvidia-* wheels they load only after onnxruntime.preload_dlls() or import torch)"
        )
    return None


def goal_label(device: str, goal_ms: float) -> str:
    """What the figure is called in the output: per GPU on CUDA, per machine on the CPU."""
    where = "per GPU" if device == "cuda" else "on this CPU"
    return f"streams {where} at p95 TTFB ≤ {goal_ms:g} ms"


def stop_reason(level: dict, goal_ms: float) -> str:
    """Which part of the rule a level missed, in words (for the line that says what bounds it)."""
    why = []
    p95 = level.get("ttfb_ms_p95")
    if p95 is None or p95 > goal_ms:
        why.append(f"TTFB p95 {report.fmt(p95, 'ms')} > {goal_ms:g} ms")
    if level.get("refused"):
        why.append(
            f"{level['refused']} refused 'overloaded' (the server's admission; /readyz capacity "
            f"{report.fmt(level.get('capacity_streams'))})"
        )
    if level.get("underruns"):
        why.append(f"{level['underruns']:.2f} underruns per stream")
    failed = level.get("errors", 0) + level.get("timeouts", 0)
    if failed:
        why.append(f"{failed} turns failed ({level.get('error_codes') or 'timeouts'})")
    if not level.get("turns"):
        why.append("no turn completed")
    return ", ".join(why) or "healthy"


def level_estimate_s(streams: int, opts: L.LoadOptions, finish_s: float) -> float:
    """How long a level takes: the agents' stagger, the talking time, the last turns, the pause."""
    stagger = min(2.0, 0.125 * (streams - 1)) if opts.stagger_s is None else opts.stagger_s
    return stagger + opts.seconds + finish_s + opts.settle_s


@dataclasses.dataclass(slots=True)
class Sweep:
    """The run's state, written as the JSON document after every level."""

    device: str
    goal_ms: float
    opts: L.LoadOptions
    server: dict
    levels: list[dict] = dataclasses.field(default_factory=list)
    warmup: dict | None = None
    current: int | None = None  # the level running now
    stopped: str = ""
    skipped: str = ""

    @property
    def figure(self) -> int:
        return L.max_healthy_streams(self.levels, self.goal_ms)

    def document(self, info: dict) -> dict:
        opt = dataclasses.asdict(self.opts)
        opt.pop("turns")
        body = {
            "engine": "piper",
            "device": self.device,
            "levels": self.levels,
            "warmup": self.warmup,
            "max_healthy_streams": L.max_healthy_streams(self.levels),
            "ttfb_goal_ms": self.goal_ms,
            "max_streams_at_goal": self.figure,
            "stopped": self.stopped,
            "skipped": self.skipped or None,
            "clients": "the agents run in one Python process (one event loop) on the same machine as the server",
        }
        options = {**opt, "ttfb_healthy_ms": L.TTFB_HEALTHY_MS}
        return report.document("load", machine=info, options=options, server=self.server, body=body, baseline=None)


async def _measure(url: str, streams: int, opts: L.LoadOptions) -> dict:
    """One level of ``bench load``, with the CPU its agents (this process) used, in % of a core."""
    cpu0, wall0 = time.process_time(), time.monotonic()
    level = await L.run_level(url, streams, opts, lambda _msg: None)
    wall = time.monotonic() - wall0
    level["client_cpu_pct"] = round(100 * (time.process_time() - cpu0) / wall) if wall > 0 else None
    return level


def _line(level: dict) -> str:
    return (
        f"{report.level_line(level)}; TTFB p50 {report.fmt(level['ttfb_ms_p50'], 'ms')}, "
        f"/readyz capacity {report.fmt(level['capacity_streams'])}, client CPU {level['client_cpu_pct']} %"
    )


async def sweep(url: str, run: Sweep, budget_s: float, t0: float, save, say, warmup_s: float = 0.0) -> None:
    """An unrecorded warm-up, then the levels in order until two in a row miss the goal (the
    limit is passed: no higher level can count) or the budget cannot hold the next one.

    A level after the first miss does not change the figure, but on a one-shot GPU run it tells
    a warm-up spike at one level from a real limit. The warm-up (a few streams) lets the device
    meet its first shapes (kernel and algorithm choices) before anything is counted.
    """
    if warmup_s > 0:
        streams = min(4, run.opts.levels[-1])
        run.warmup = await _measure(url, streams, dataclasses.replace(run.opts, seconds=warmup_s))
        say(f"  warm-up, not counted: {_line(run.warmup).lstrip()}")
        await asyncio.sleep(run.opts.settle_s)
    finish_s, misses = _FINISH_S, []
    for streams in run.opts.levels:
        left = budget_s - (time.monotonic() - t0)
        need = level_estimate_s(streams, run.opts, finish_s)
        if need > left:
            run.stopped = f"the time budget: {streams} streams would need ~{need:.0f} s, {left:.0f} s left"
            return
        run.current = streams
        level = await _measure(url, streams, run.opts)
        run.current = None
        run.levels.append(level)
        save()
        say(f"  {_line(level)}")
        finish_s = max(finish_s, level["wall_s"] - level_estimate_s(streams, run.opts, 0.0))
        await asyncio.sleep(run.opts.settle_s)
        misses = [] if L.healthy(level, run.goal_ms) else [*misses, level]
        if len(misses) == MISSES_TO_STOP:
            run.stopped = f"{MISSES_TO_STOP} levels in a row missed the goal"
            return
    run.stopped = f"every level asked ran (up to {run.opts.levels[-1]})"


def bounds(run: Sweep, cores: int | None) -> str:
    """What bounds the figure, from the run's own measurements."""
    if not run.levels:
        return "no level ran"
    above = [lv for lv in run.levels if lv["streams"] > run.figure]
    limit = (
        f"{above[0]['streams']} streams missed the goal: {stop_reason(above[0], run.goal_ms)}"
        if above
        else f"no level tested missed the goal (stopped: {run.stopped})"
    )
    top = run.levels[-1]
    client = top.get("client_cpu_pct")
    note = (
        f"{limit}; the bench's agents run in one Python process (one event loop: at most one core) "
        f"on this machine's {cores} CPUs, beside the server: at {top['streams']} streams they used "
        f"{client} % of a core, the server {report.fmt(top.get('cpu_pct'))} %"
    )
    if client is not None and client >= CLIENT_BOUND_PCT:
        note += " - the agents, not the device, may bound the figure"
    return note


def _sigterm(_signum, _frame) -> None:
    """The stage's ``timeout``: unwind, so that the server stops and the figure is still printed."""
    raise SystemExit(124)


def run_device_load(args: argparse.Namespace, say=print) -> int:
    from tts_service.localproc import ChildServer, StartError

    from .cli import _levels

    t0 = time.monotonic()
    info = machine()
    # a paced turn is 1-6 s of audio: one unfinished after 30 s has failed, and must not hold
    # the level (and the GPU machine's minutes) for bench load's 60 s
    opts = L.LoadOptions(levels=_levels(args.streams), seconds=args.seconds, turn_timeout_s=30.0)
    extra = ["--device", args.device, *args.server_arg]
    run = Sweep(args.device, args.ttfb_goal_ms, opts, {"engine": "piper", "device": args.device, "args": extra})

    def save() -> None:
        if args.json:
            info["load_avg_1m_at_end"] = load_average()
            report.write_json(args.json, run.document(info))

    problem = cuda_problem() if args.device == "cuda" else None
    if problem:
        run.skipped = problem
        save()
        say(f"piper on cuda: skipped - {problem}")
        return 0
    say(f"piper on {args.device}: starting the server (loading the voice) ...")
    signal.signal(signal.SIGTERM, _sigterm)
    server, status = ChildServer.tts(extra=extra), 0
    try:
        server.start(timeout=max(10.0, args.budget_s - (time.monotonic() - t0)))
        run.server["url"] = server.ws_url
        say(f"piper on {args.device}: server ready in {time.monotonic() - t0:.0f} s; levels {list(opts.levels)}")
        asyncio.run(sweep(server.ws_url, run, args.budget_s, t0, save, say, args.warmup_s))
    except StartError as exc:
        run.stopped, status = f"the server did not start: {exc}", 1
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
        during = f"during the {run.current}-stream level" if run.current else "between levels"
        run.stopped = f"terminated (the stage's timeout?) {during}: the figure is from the levels done"
    finally:
        server.stop()
    save()
    say(f"stopped: {run.stopped}")
    say(f"{goal_label(args.device, args.ttfb_goal_ms)}: {run.figure}")
    say(f"bounded by: {bounds(run, info['cores'])}")
    if args.json:
        say(f"wrote {args.json}")
    return status


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.device_load", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    p.add_argument("--streams", default="1,8,16,32,64,128", help="levels, in order (default 1,8,16,32,64,128)")
    p.add_argument("--seconds", type=float, default=10.0, help="talking time per level (default 10)")
    p.add_argument("--ttfb-goal-ms", type=float, default=DEFAULT_GOAL_MS, help="TTFB p95 goal (default 150)")
    p.add_argument("--budget-s", type=float, default=200.0, help="start no level past this many seconds (default 200)")
    p.add_argument(
        "--warmup-s", type=float, default=5.0, help="unrecorded warm-up at 4 streams first (default 5; 0: none)"
    )
    p.add_argument("--json", metavar="FILE", default=None, help="the results, rewritten after every level")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG", help="one more `serve` argument")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from . import BenchError

    args = parser().parse_args(argv)
    try:
        if args.seconds <= 0 or args.ttfb_goal_ms <= 0 or args.budget_s <= 0 or args.warmup_s < 0:
            raise BenchError("--seconds, --ttfb-goal-ms and --budget-s must be > 0, --warmup-s >= 0")
        return run_device_load(args)
    except BenchError as exc:
        print(f"device_load: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
