"""Child servers on free loopback ports: the demo, the bench, the barge-in simulation and the
agent launcher all start a real server process and wait until it answers, the same way."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request


class StartError(Exception):
    """A child server exited or did not become ready; the message carries its last output."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(
    base: str,
    proc: subprocess.Popen | None = None,
    timeout: float = 180.0,
    log: str = "",
    *,
    path: str = "/readyz",
    what: str = "the server",
) -> None:
    """Poll ``base + path`` until it answers 200; fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise StartError(f"{what} exited with status {proc.returncode}{_tail(log)}")
        try:
            with urllib.request.urlopen(f"{base}{path}", timeout=2) as resp:  # loopback only
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise StartError(f"{what} at {base} did not become ready within {timeout:.0f} s{_tail(log)}")


def _tail(path: str) -> str:
    if not path:
        return ""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()[-15:]
    except OSError:
        return ""
    return "; its last output:\n  " + "\n  ".join(lines) if lines else ""
