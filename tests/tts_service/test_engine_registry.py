"""The engine registry: a third engine from its own package (tests/tts_service/toy_engine/) is
served by the real server, touching no file of tts_service; an unknown name is one CLI line."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.tts_service.toy_engine.engine import SAMPLE_RATE, tone_seconds
from tts_service import engines
from tts_service.cli import build_parser
from tts_service.client import TTSClient
from tts_service.localproc import ChildServer, ServerThread

ROOT = Path(__file__).resolve().parents[2]
TOY = "tests.tts_service.toy_engine.serve"
TEXT = "Hello there. This tone is the toy engine's own voice."


def _pitch(pcm: bytes, rate: int) -> float:
    """The strongest frequency of 16-bit PCM."""
    x = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return float(np.argmax(spectrum) * rate / len(x))


async def _speak(url: str, text: str, **open_kw) -> tuple[bytes, int]:
    async with TTSClient(url) as client:
        ctx = await client.open(pace=False, **open_kw)
        await ctx.send_text(text)
        await ctx.end()
        pcm = bytearray()
        async for item in ctx:
            if getattr(item, "pcm", None) is not None:
                pcm += item.pcm
        return bytes(pcm), ctx.sample_rate


def _check_tone(pcm: bytes, rate: int, pitch: float) -> None:
    assert rate == SAMPLE_RATE
    # every character of every segment became 10 ms of tone (spaces between segments are cut)
    audio_s = len(pcm) / 2 / rate
    assert tone_seconds(TEXT) - 0.05 <= audio_s <= tone_seconds(TEXT) + 0.01
    assert _pitch(pcm, rate) == pytest.approx(pitch, abs=5)


@pytest.fixture
def toy_registered():
    engines.register("toy", TOY)
    yield
    engines.unregister("toy")


async def test_a_registered_engine_is_built_from_the_cli_options_and_served(toy_registered):
    assert "toy" in engines.names()
    args = build_parser().parse_args(["serve", "--engine", "toy", "--toy-pitch", "300"])
    synth = engines.build(args.engine, args)
    assert sorted(synth.engine.voices) == ["low", "tone"]
    with ServerThread(synth.engine, engine_name="toy") as server:
        pcm, rate = await _speak(server.url, TEXT, voice="low")
    _check_tone(pcm, rate, 150)


async def test_a_toy_engine_from_an_entry_point_serves_a_stream_from_python_m_tts_service(tmp_path):
    """A fresh process finds the engine through a ``streamvox.engines`` entry point (an installed
    distribution's metadata, written here by hand) and serves it on the real WebSocket."""
    dist = tmp_path / "streamvox_toy-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: streamvox-toy\nVersion: 0\n", encoding="utf-8")
    (dist / "entry_points.txt").write_text(f"[streamvox.engines]\ntoy = {TOY}\n", encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    server = ChildServer.tts(extra=["--engine", "toy", "--toy-pitch", "330"], env=env)
    await asyncio.to_thread(server.start, 120.0)
    try:
        pcm, rate = await _speak(server.ws_url, TEXT)
    finally:
        await asyncio.to_thread(server.stop)
    _check_tone(pcm, rate, 330)


def test_an_unknown_engine_is_one_line_that_lists_the_known_ones():
    proc = subprocess.run(
        [sys.executable, "-m", "tts_service", "--engine", "nope"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["streamvox: unknown engine 'nope'; known engines: piper, orpheus"]


def test_the_cli_imports_no_model_library_for_its_options():
    """Every ``serve`` parser adds every engine's options: that must not import torch."""
    code = "import sys; from tts_service.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr


def test_an_unknown_name_from_the_registry_names_the_known_ones():
    with pytest.raises(engines.UnknownEngine, match="known engines: piper, orpheus"):
        engines.entry("nope")
    with pytest.raises(ValueError, match="already"):
        engines.register("piper", TOY)
