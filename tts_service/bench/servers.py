"""Servers under test: spawn them as processes (so CPU is accounted per process), scrape /metrics."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from .. import protocol as P
from ..localproc import free_port, wait_ready

STREAMING = "streaming"
BASELINE = "baseline"
DESCRIPTIONS = {
    STREAMING: "streamvox: incremental text, windowed vocoder, paced frames (the server under test)",
    BASELINE: "batch baseline: piper-tts PiperVoice.synthesize renders the whole utterance, then every frame "
    "is sent at once (like piper's own HTTP server); same voice, same machine, same protocol",
}


@dataclass(frozen=True, slots=True)
class Target:
    """A server to measure: its WebSocket URL, the matching HTTP base, and what it is."""

    name: str
    ws_url: str
    description: str

    @property
    def http_base(self) -> str:
        return http_base(self.ws_url)


def http_base(ws_url: str) -> str:
    """``ws://h:p/v1/stream`` -> ``http://h:p`` (``wss`` -> ``https``)."""
    parts = urlsplit(ws_url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, "", "", ""))


def server_command(name: str, port: int) -> list[str]:
    if name == STREAMING:
        return [sys.executable, "-m", "tts_service", "--port", str(port), "--log-level", "WARNING"]
    return [sys.executable, "-m", "tts_service.bench.baseline", "--port", str(port)]


class _Child:
    """One server process with its output in a temporary log (shown only if it fails to start)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile(prefix=f"streamvox-bench-{name}-", suffix=".log", delete=False)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            server_command(name, self.port), stdout=self.log, stderr=subprocess.STDOUT, env=env
        )

    def wait(self, timeout: float) -> Target:
        wait_ready(f"http://127.0.0.1:{self.port}", self.proc, timeout, self.log.name)
        return Target(self.name, f"ws://127.0.0.1:{self.port}{P.WS_PATH}", DESCRIPTIONS[self.name])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self.log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)


@contextlib.contextmanager
def spawned(*names: str, timeout: float = 180.0) -> Iterator[dict[str, Target]]:
    """Run servers as child processes on free loopback ports (loading in parallel) for the block."""
    children: list[_Child] = []
    try:
        for name in names:
            children.append(_Child(name))
        yield {c.name: c.wait(timeout) for c in children}
    finally:
        for c in children:
            c.stop()


_CPU_RE = re.compile(r"^process_cpu_seconds_total(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$", re.M)


def parse_cpu_seconds(metrics_text: str) -> float | None:
    m = _CPU_RE.search(metrics_text)
    return float(m.group(1)) if m else None


def cpu_seconds(base: str) -> float | None:
    """The server process's CPU seconds from its ``/metrics`` (None if it does not expose them)."""
    try:
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as resp:
            return parse_cpu_seconds(resp.read().decode("utf-8", "replace"))
    except OSError:
        return None


def machine() -> dict[str, object]:
    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cores": os.cpu_count(), "cpu_model": model, "load_avg_1m_at_start": load_average()}


def load_average() -> float | None:
    """The 1-minute load average: other work on the machine shows in every latency figure."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None
