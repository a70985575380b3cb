"""The Piper stage of ``scripts/gpu_check.sh``: its figure (streams at p95 TTFB <= a goal), its
CPU path run for real (server, agents, JSON), and its one-line skip without a CUDA provider.

The GPU run itself cannot happen here (no GPU): the CPU path is the same script and the same
Python entry with ``PIPER_DEVICE=cpu``, so what a GPU session will run is exercised but for the
device.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import onnxruntime
import pytest

from bench import device_load
from bench.load import healthy, max_healthy_streams
from tts_service.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _level(streams: int, **kw) -> dict:
    level = {"streams": streams, "turns": 10, "ttfb_ms_p95": 100.0, "underruns": 0, "refused": 0}
    level |= {"errors": 0, "timeouts": 0, **kw}
    level["healthy"] = healthy(level)
    return level


def test_max_streams_at_goal_on_hand_built_levels() -> None:
    crossing = [_level(1, ttfb_ms_p95=40.0), _level(8, ttfb_ms_p95=120.0), _level(16, ttfb_ms_p95=150.0),
                _level(32, ttfb_ms_p95=180.0), _level(64, ttfb_ms_p95=90.0)]  # fmt: skip
    assert max_healthy_streams(crossing, 150.0) == 16  # the goal itself passes; 64 after 32 failed does not count
    assert max_healthy_streams(crossing) == 64  # the 250 ms health rule: 180 ms is healthy
    assert max_healthy_streams(list(reversed(crossing)), 150.0) == 16  # the list's order does not matter
    middle = [_level(1), _level(8, refused=1, ttfb_ms_p95=50.0), _level(16)]
    assert max_healthy_streams(middle, 150.0) == 1  # fast but refusing is not holding 8 streams
    assert max_healthy_streams([_level(1), _level(8, underruns=0.1), _level(16)], 150.0) == 1
    assert max_healthy_streams([_level(1, ttfb_ms_p95=151.0), _level(2)], 150.0) == 0  # none: 0
    assert max_healthy_streams([_level(1, turns=0, ttfb_ms_p95=None)], 150.0) == 0  # nothing measured
    assert max_healthy_streams([], 150.0) == 0
    assert max_healthy_streams([_level(4, ttfb_ms_p95=300.0)], 400.0) == 4  # a goal looser than the rule


def test_stop_reason_names_what_missed() -> None:
    level = _level(64, ttfb_ms_p95=210.0, refused=3, capacity_streams=40)
    why = device_load.stop_reason(level, 150.0)
    assert "TTFB p95 210 ms > 150 ms" in why and "3 refused" in why and "capacity 40" in why
    assert device_load.stop_reason(_level(8), 150.0) == "healthy"


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider'")
def test_probe_reports_a_session_that_fell_back_to_the_cpu(monkeypatch) -> None:
    """onnxruntime-gpu without its CUDA libraries lists the provider but opens CPU sessions."""
    if device_load.cuda_problem() is None:
        pytest.skip("this onnxruntime opens CUDA sessions")
    monkeypatch.setattr(
        onnxruntime, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"]
    )
    problem = device_load.cuda_problem()
    assert problem is not None and "fell back to CPUExecutionProvider" in problem


def _figure_by_hand(levels: list[dict], goal_ms: float) -> int:
    """The figure again, by the rule read plainly off the levels' raw fields (in level order)."""
    best = 0
    for lv in sorted(levels, key=lambda lv: lv["streams"]):
        fast = lv["turns"] > 0 and lv["ttfb_ms_p95"] is not None and lv["ttfb_ms_p95"] <= goal_ms
        if not (fast and lv["underruns"] == 0 and lv["refused"] == lv["errors"] == lv["timeouts"] == 0):
            break
        best = lv["streams"]
    return best


def _script(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, Path]:
    out_dir = tmp_path / "gpu_check"
    run = subprocess.run(
        ["bash", str(SCRIPT)],
        cwd=ROOT,
        env={**os.environ, "ENGINES": "piper", "OUT_DIR": str(out_dir), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return run, out_dir


@pytest.mark.timeout(150)
def test_cpu_path_prints_the_figure_and_writes_json(tmp_path) -> None:
    run, out_dir = _script(tmp_path, DEVICE="cpu", PIPER_STREAMS="1,2", PIPER_SECONDS="3", PIPER_WARMUP_S="1")
    assert run.returncode == 0, run.stdout + run.stderr
    found = re.findall(r"^streams on this CPU at p95 TTFB ≤ 150 ms: (\d+)$", run.stdout, re.M)
    assert len(found) == 1, run.stdout
    doc = json.loads((out_dir / "bench_load_piper_cpu.json").read_text())
    assert doc["bench"] == "load" and doc["engine"] == "piper" and doc["device"] == "cpu"
    assert doc["ttfb_goal_ms"] == 150.0 and doc["skipped"] is None and doc["stopped"]
    levels = doc["levels"]
    assert [lv["streams"] for lv in levels] == [1, 2]  # the sweep stops after two misses in a row
    assert doc["warmup"]["streams"] == 2 and doc["warmup"]["turns"] >= 1  # run, and not counted
    expected = _figure_by_hand(levels, 150.0)
    assert int(found[0]) == doc["max_streams_at_goal"] == expected
    for lv in levels:
        assert lv["turns"] >= 1 and isinstance(lv["client_cpu_pct"], int) and lv["cpu_pct"] is not None
    bound = re.search(
        r"^bounded by: .*one Python process.* on this machine's \d+ CPUs, beside the server", run.stdout, re.M
    )
    assert bound, run.stdout


def test_cuda_stage_without_a_provider_skips_in_one_line(tmp_path) -> None:
    if device_load.cuda_problem() is None:
        pytest.skip("this onnxruntime opens CUDA sessions: the stage would run")
    run, out_dir = _script(tmp_path, DEVICE="cuda")
    assert run.returncode == 0, run.stdout + run.stderr  # a skipped stage is not a failed check
    skipped = [ln for ln in run.stdout.splitlines() if "skipped" in ln]
    assert len(skipped) == 1 and skipped[0].startswith("piper on cuda: skipped - ")
    assert "pip install onnxruntime-gpu" in skipped[0]
    assert "at p95 TTFB" not in run.stdout  # no figure for a stage that did not run
    doc = json.loads((out_dir / "bench_load_piper_cuda.json").read_text())
    assert doc["skipped"] and doc["levels"] == [] and doc["max_streams_at_goal"] == 0


@pytest.mark.timeout(120)
def test_bench_load_ttfb_goal_option(tmp_path, capsys) -> None:
    """``streamvox bench load --ttfb-goal-ms``: the same figure for any server, in its output and JSON."""
    out = tmp_path / "load.json"
    rc = cli_main(["bench", "load", "--streams", "1,2", "--seconds", "2", "--ttfb-goal-ms", "150", "--json", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["ttfb_goal_ms"] == 150.0 and [lv["streams"] for lv in doc["levels"]] == [1, 2]
    assert doc["max_streams_at_goal"] == _figure_by_hand(doc["levels"], 150.0)
    printed = re.findall(r"^streamvox: max streams at TTFB p95 ≤ 150 ms: (\d+)$", capsys.readouterr().out, re.M)
    assert printed == [str(doc["max_streams_at_goal"])]


async def test_sweep_stops_after_two_misses_in_a_row_and_at_the_budget(monkeypatch) -> None:
    """The stop rules, on hand-built levels (the GPU's misses cannot be produced on this CPU)."""
    p95 = {1: 40.0, 8: 400.0, 16: 90.0, 32: 200.0, 64: 300.0, 128: 50.0}

    wall = {"s": 1.0}

    async def measure(_url, streams, _opts):
        figures = {"wall_s": wall["s"], "ttfb_ms_p50": 1.0, "capacity_streams": 9, "cpu_pct": 50.0}
        return _level(streams, ttfb_ms_p95=p95[streams], client_cpu_pct=3, **figures)

    monkeypatch.setattr(device_load, "_measure", measure)
    opts = device_load.L.LoadOptions(levels=tuple(p95), seconds=0.01, stagger_s=0.0, settle_s=0.0)
    run = device_load.Sweep("cuda", 150.0, opts, {})
    saved: list[int] = []
    await device_load.sweep("ws://x", run, 600.0, time.monotonic(), lambda: saved.append(len(run.levels)), print)
    assert [lv["streams"] for lv in run.levels] == [1, 8, 16, 32, 64]  # 8 alone missed: 16 still ran
    assert saved == [1, 2, 3, 4, 5] and "2 levels in a row" in run.stopped
    assert run.figure == 1  # 16 after 8 missed does not count
    assert device_load.bounds(run, 16).startswith("8 streams missed the goal: TTFB p95 400 ms > 150 ms")

    short = device_load.Sweep("cuda", 150.0, opts, {})
    wall["s"] = 100.0  # a level took far longer than estimated: the next estimate learns it
    await device_load.sweep("ws://x", short, 60.0, time.monotonic(), lambda: None, print)
    assert [lv["streams"] for lv in short.levels] == [1] and short.stopped.startswith("the time budget")
