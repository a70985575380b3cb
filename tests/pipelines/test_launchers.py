"""The demo launchers fail fast and in one line when what they need is not there."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def _run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, timeout=120, env=env or dict(os.environ)
    )


def test_the_pipecat_demo_refuses_a_busy_port_before_starting_anything():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _run(["pipelines.pipecat_agent", "--host", "127.0.0.1", "--port", str(port)])
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in out and "--port" in out
    assert "starting the TTS server" not in out and "Traceback" not in out
    assert "DEBUG" not in out  # the demo logs at INFO unless --verbose


def test_the_livekit_worker_names_the_missing_settings():
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIVEKIT_")}
    proc = _run(["pipelines.livekit_agent", "dev"], env=env)
    assert proc.returncode != 0
    assert "LIVEKIT_URL" in proc.stderr and "Traceback" not in proc.stderr


def test_the_pipecat_demo_names_a_bad_temperature_before_starting_anything():
    proc = _run(["pipelines.pipecat_agent", "--port", "0"], env={**os.environ, "LLM_TEMPERATURE": "hot"})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "LLM_TEMPERATURE must be a number within [0, 2], got 'hot'" in out
    assert "starting the TTS server" not in out and "Traceback" not in out


def test_the_livekit_worker_names_a_bad_setting_before_it_starts():
    env = {**os.environ, "FALSE_INTERRUPTION_TIMEOUT": "soon"}
    proc = _run(["pipelines.livekit_agent", "dev"], env=env)
    assert proc.returncode != 0
    assert "FALSE_INTERRUPTION_TIMEOUT must be a number of seconds >= 0, got 'soon'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_pipecat_demo_names_a_bad_uplink_setting_before_starting_anything():
    proc = _run(["pipelines.pipecat_agent", "--port", "0"], env={**os.environ, "STREAMVOX_WEBRTC_UPLINK": "fast"})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "STREAMVOX_WEBRTC_UPLINK='fast'" in out and "'aiortc'" in out
    assert "starting the TTS server" not in out and "Traceback" not in out
