"""Servers under test: spawn them as processes (so CPU is accounted per process), scrape /metrics."""

from __future__ import annotations

import contextlib
import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from tts_service.localproc import ChildServer, free_port, tts_server_args

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


def server_args(name: str, port: int) -> list[str]:
    """``python`` arguments for the server called ``name`` on ``port``."""
    if name == STREAMING:
        return tts_server_args(port)
    return ["-m", "bench.baseline", "--port", str(port)]


@contextlib.contextmanager
def spawned(*names: str, timeout: float = 180.0) -> Iterator[dict[str, Target]]:
    """Run servers as child processes on free loopback ports (loading in parallel) for the block."""
    children: dict[str, ChildServer] = {}
    try:
        for name in names:
            port = free_port()
            children[name] = ChildServer(server_args(name, port), what=f"the {name} server", port=port).spawn()
        targets = {}
        for name, child in children.items():
            child.wait(timeout)
            targets[name] = Target(name, child.ws_url, DESCRIPTIONS[name])
        yield targets
    finally:
        for child in children.values():
            child.stop()


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


def capacity_streams(base: str) -> int | None:
    """What the server's ``/readyz`` says it can hold (None for a server without one)."""
    try:
        with urllib.request.urlopen(f"{base}/readyz", timeout=5) as resp:
            body = json.loads(resp.read())
    except urllib.error.HTTPError as exc:  # 503 while refusing: the body still says
        try:
            body = json.loads(exc.read())
        except ValueError:
            return None
    except (OSError, ValueError):
        return None
    value = body.get("capacity_streams") if isinstance(body, dict) else None
    return value if isinstance(value, int) else None


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
