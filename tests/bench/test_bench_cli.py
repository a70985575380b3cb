"""``streamvox bench`` reaches the bench through an entry point: the server's CLI never imports it."""

from __future__ import annotations

import tomllib
from pathlib import Path

from bench import BenchError
from bench import cli as bench_cli
from tts_service.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_registers_the_bench_and_ships_it():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    commands = project["project"]["entry-points"]["streamvox.commands"]
    assert commands["bench"] == "bench.cli:add_bench_parser"
    assert "bench*" in project["tool"]["setuptools"]["packages"]["find"]["include"]


def test_streamvox_bench_is_the_bench_cli():
    """The installed entry point (``pip install -e .`` after a pyproject change) gives the
    subcommand, and its commands are the bench's own, guarded for BenchError."""
    args = build_parser().parse_args(["bench", "markdown", "a.json"])
    assert args.func.__wrapped__ is bench_cli.markdown_cmd


def test_a_bench_error_is_one_line_and_status_2(capsys):
    def fails(args) -> int:
        raise BenchError("--streams 'x': give comma-separated integers like 1,2,4,8")

    assert bench_cli._guarded(fails)(None) == 2
    assert capsys.readouterr().err == "streamvox: --streams 'x': give comma-separated integers like 1,2,4,8\n"


def test_without_the_bench_package_the_command_says_why(monkeypatch, capsys):
    """A server-only install (the Docker image ships no bench): ``streamvox bench`` answers in one
    line with the reason and the fix, status 2, instead of argparse's "invalid choice"."""
    import sys

    from tts_service.cli import main

    for name in [m for m in sys.modules if m == "bench" or m.startswith("bench.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "bench", None)  # importing it now fails, as where it is absent
    assert main(["bench", "load", "--streams", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("streamvox: streamvox bench is not available in this installation (bench")
    assert "pip install -e '.[dev]'" in err and "\n" not in err
    assert build_parser().parse_args(["serve", "--port", "1"]).port == 1  # the other commands are untouched
