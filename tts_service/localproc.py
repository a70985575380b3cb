"""Local servers on free loopback ports: the one way every caller starts one.

The demo, the bench, the barge-in simulation, the agent launcher and the tests all need a real
server (the TTS server, the batch baseline, the local LLM) that answers before they go on:

* :class:`ChildServer` runs one as its own process (so its CPU is its own, as in production),
  waits until a readiness URL answers 200, fails early with the child's last output when it
  exits, and stops it (terminate, then kill) on exit;
* :class:`ServerThread` runs the TTS server inside this process, in a thread with its own event
  loop, so that a stalled caller loop does not stall synthesis (tests use it to reach the
  server's objects), with any registered engine (:mod:`tts_service.engines`).

Loading an engine is the engine's own business (``tts_service.piper.serve.load_piper_engine``
loads Piper voices the way ``streamvox serve`` does): this module imports no engine package.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from typing import Any

from . import engines
from . import protocol as P


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


def tts_server_args(port: int, *, log_level: str = "WARNING", extra: Sequence[str] = ()) -> list[str]:
    """``python -m tts_service`` arguments for a TTS server on ``port`` (what ``streamvox serve`` runs)."""
    return ["-m", "tts_service", "--port", str(port), "--log-level", log_level, *extra]


class ChildServer:
    """One server process on a loopback port, ready when ``base + ready_path`` answers 200.

    ``output``: ``"inherit"`` shows the child's output in this terminal (the demo: a user sees
    the server's own messages), ``"log"`` keeps it in a temporary file that is quoted only if the
    child fails to start (the bench, tests), ``"quiet"`` discards it.

    ``die_with_parent``: the child is killed by the kernel when this process goes, even on
    SIGKILL (Linux; ``tts_service.die_with_parent``). Start such a child from a thread that lives
    as long as the process: the kernel ties the signal to the thread that started it. ``args``
    must then be ``["-m", MODULE, ...]``.
    """

    def __init__(
        self,
        args: Sequence[str],
        *,
        what: str,
        port: int,
        ready_path: str = "/readyz",
        output: str = "log",
        env: dict[str, str] | None = None,
        die_with_parent: bool = False,
    ) -> None:
        if output not in ("inherit", "log", "quiet"):
            raise ValueError(f"output must be 'inherit', 'log' or 'quiet', not {output!r}")
        if die_with_parent and (len(args) < 2 or args[0] != "-m"):
            raise ValueError(f"die_with_parent runs a module: args must start with '-m MODULE', not {list(args)!r}")
        self.args = [sys.executable, *args]
        self.die_with_parent = die_with_parent
        self.what = what
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self.ready_path = ready_path
        self._output = output
        self._env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
        self._log: Any = None
        self.proc: subprocess.Popen | None = None

    @classmethod
    def tts(cls, *, port: int | None = None, log_level: str = "WARNING", extra: Sequence[str] = (), **kw):
        """The streamvox TTS server (``python -m tts_service``)."""
        port = free_port() if port is None else port
        return cls(tts_server_args(port, log_level=log_level, extra=extra), what="the TTS server", port=port, **kw)

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}{P.WS_PATH}"

    def spawn(self) -> ChildServer:
        """Start the process without waiting (several children can load in parallel); again after
        it exited, to restart it."""
        self._drop_log()
        if self._output == "log":
            self._log = tempfile.NamedTemporaryFile(prefix="streamvox-child-", suffix=".log", delete=False)
            out: Any = self._log
        else:
            out = None if self._output == "inherit" else subprocess.DEVNULL
        args = self.args
        if self.die_with_parent:
            args = [args[0], "-m", "tts_service.die_with_parent", str(os.getpid()), *args[1:]]
        self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT if out else None, env=self._env)
        return self

    def wait(self, timeout: float = 180.0) -> ChildServer:
        """Block until ready; on failure stop the child and raise :class:`StartError`."""
        if self.proc is None:
            self.spawn()
        try:
            wait_ready(
                self.base, self.proc, timeout, self._log.name if self._log else "", path=self.ready_path, what=self.what
            )
        except StartError:
            self.stop()
            raise
        return self

    def start(self, timeout: float = 180.0) -> ChildServer:
        return self.spawn().wait(timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate (SIGTERM: a server drains), then kill what is left after ``timeout``."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._drop_log()

    def _drop_log(self) -> None:
        if self._log is not None:
            self._log.close()
            with contextlib.suppress(OSError):
                os.unlink(self._log.name)
            self._log = None

    def __enter__(self) -> ChildServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ServerThread:
    """The real TTS server on a free loopback port, in a thread with its own event loop.

    A thread (not the caller's event loop) so that the caller's timing is not the server's: a
    stalled caller loop does not stall synthesis, and the reverse, as with separate processes.
    ``engine`` is a loaded engine of the registered kind ``engine_name`` (:mod:`tts_service.engines`;
    ``None``: that entry's default, the bundled Piper voice for ``piper``); ``options`` (that
    engine's scheduler options) and ``config`` go to the scheduler and the server.
    """

    def __init__(self, engine=None, *, options=None, config=None, engine_name: str = engines.DEFAULT_ENGINE) -> None:
        self._engine = engine
        self._engine_name = engine_name
        self._options = options
        self._config = config
        self.loop: asyncio.AbstractEventLoop | None = None
        self.server = None
        self.url = ""
        self._runner = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        started = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self.loop = loop
            try:
                loop.run_until_complete(self._up())
            except BaseException as exc:
                failure.append(exc)
                started.set()
                return
            started.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=main, name="streamvox-local-server", daemon=True)
        self._thread.start()
        started.wait()
        if failure:
            raise failure[0]
        return self.url

    async def _up(self) -> None:
        from aiohttp import web

        from .server import Server

        synth = engines.synthesizer(self._engine_name, self._engine, options=self._options)
        self.server = Server(synth, self._config)
        self._runner = web.AppRunner(self.server.app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"ws://{host}:{port}{P.WS_PATH}"

    def run(self, coro, timeout: float = 10.0):
        """Run a coroutine on the server's loop (from another thread) and return its result."""
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        if self.loop is not None and self._thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> ServerThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
