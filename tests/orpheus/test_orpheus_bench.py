"""The CPU path of ``streamvox bench engine`` and of scripts/gpu_check.sh (tiny random model)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from tts_service.orpheus import bench

ROOT = Path(__file__).resolve().parents[2]


def test_bench_engine_sweeps_and_reports(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = bench.main(
        [
            "--device",
            "cpu",
            "--random-weights",
            "tiny",
            "--max-streams",
            "4",
            "--tokens",
            "28",
            "--max-len",
            "256",
            "--ramp-s",
            "0",
            "--no-early-stop",
            "--threads",
            "1",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    report = json.loads(out.read_text())
    assert [r["streams"] for r in report["levels"]] == [1, 2, 4]
    for r in report["levels"]:
        assert not r["timed_out"] and not r["errors"]
        assert r["peak_concurrency"] == r["streams"]  # all arrive at once
        assert r["decode_steps_per_s"] > 0 and r["tokens_per_s_min"] > 0
        assert r["ttfb_ms_p95"] >= r["ttfb_ms_p50"] > 0
    assert report["warning"].startswith("random weights")
    assert report["required_tokens_per_s"] == 90.23
    assert isinstance(report["max_realtime_streams"], int)
    text = capsys.readouterr().out
    assert "RANDOM WEIGHTS" in text and "max real-time streams" in text and "TTFB p95" in text


def test_registers_as_a_bench_subcommand():
    parser = argparse.ArgumentParser(prog="streamvox")
    bench_sub = parser.add_subparsers(dest="command").add_parser("bench").add_subparsers(dest="bench_command")
    bench.add_engine_bench_parser(bench_sub)
    args = parser.parse_args(["bench", "engine", "--engine", "orpheus", "--random-weights", "3b", "--device", "cuda"])
    assert args.func is bench.run and args.random_weights == "3b" and args.max_streams == 256


def test_gpu_check_script_runs_its_cpu_path(tmp_path):
    env = {
        **os.environ,
        "DEVICE": "cpu",
        "ENGINES": "orpheus",  # the Piper stage's CPU path has its own test (tests/tts_service/test_gpu_check_piper.py)
        "PRESET": "tiny",
        "MAX_STREAMS": "2",
        "TOKENS": "14",
        "OUT_DIR": str(tmp_path),
        "PYTHON": sys.executable,
    }
    proc = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--no-early-stop", "--threads", "1", "--max-len", "256"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "bench_engine_tiny.json").read_text())
    assert [r["streams"] for r in report["levels"]] == [1, 2]
    assert "max real-time streams" in proc.stdout
