"""Watch the demo's child servers (the TTS server, the local LLM) and restart the ones that die.

Why: the agent talks to its parts over loopback, so a part that dies (killed, out of memory, a
crash) leaves every call silent until someone restarts the demo, and the dead child stays a
zombie. The supervisor polls each child, which also reaps it, and restarts it on the same port
(the agent's URLs stay valid) after a back-off that doubles on each failure in a row, at most
``max_restarts`` times within ``window_s``; then it gives up in one line rather than flapping.
A child that stays up ``healthy_s`` starts its back-off over.

A child can also hang without exiting (a deadlock, a stopped process, a loop that never yields):
its port still accepts connections, so the agent's requests wait and the call has dead air. For
a child added with a ``live_path``, a prober thread asks that path every ``probe_every_s``; when
no answer has come for ``hung_after_s`` the supervisor kills the child, and the usual restart
follows. The bound is generous on purpose: a child that is merely busy (a long prefill beside a
busy core) answers late, not never, and must not be killed for it.

It runs in one thread kept for the life of the process: children started with
``die_with_parent`` are tied by the kernel to the thread that started them
(``tts_service.die_with_parent``), so restarts must not come from a thread that ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from tts_service.localproc import ChildServer, StartError


@dataclass
class _Watched:
    child: ChildServer
    name: str
    ready_timeout_s: float
    up: bool = True
    given_up: bool = False
    failures: int = 0  # in a row; the back-off doubles with each
    restarts: list[float] = field(default_factory=list)  # when each restart began (monotonic)
    up_since: float = field(default_factory=time.monotonic)
    live_path: str | None = None  # probed for liveness (None: only exits are noticed)
    alive_at: float = field(default_factory=time.monotonic)  # the last answer (or the last start)
    killed_hung: bool = False  # the supervisor killed it for not answering: say so on its exit


class Supervisor:
    """Keeps ``add``-ed children running; ``status()`` says which are up (for ``/readyz``)."""

    def __init__(
        self,
        *,
        poll_s: float = 0.2,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        max_restarts: int = 5,
        window_s: float = 300.0,
        healthy_s: float = 60.0,
        probe_every_s: float = 2.0,
        probe_timeout_s: float = 3.0,
        hung_after_s: float = 20.0,
        say: Callable[[str], None] = print,
    ) -> None:
        if hung_after_s <= probe_timeout_s:
            raise ValueError(f"hung_after_s ({hung_after_s}) must be longer than probe_timeout_s ({probe_timeout_s})")
        self.poll_s, self.backoff_s, self.max_backoff_s = poll_s, backoff_s, max_backoff_s
        self.max_restarts, self.window_s, self.healthy_s = max_restarts, window_s, healthy_s
        self.probe_every_s, self.probe_timeout_s, self.hung_after_s = probe_every_s, probe_timeout_s, hung_after_s
        self._say = say
        self._watched: list[_Watched] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._prober: threading.Thread | None = None

    def add(
        self, child: ChildServer, name: str, *, ready_timeout_s: float = 120.0, live_path: str | None = None
    ) -> None:
        """Watch ``child`` (already started and ready) under ``name`` (``tts``, ``llm``); with
        ``live_path`` (``/healthz``) a child that stops answering it is treated as dead."""
        with self._lock:
            self._watched.append(_Watched(child, name, ready_timeout_s, live_path=live_path))

    def status(self) -> dict[str, bool]:
        with self._lock:
            return {w.name: w.up for w in self._watched}

    def start(self) -> Supervisor:
        self._thread = threading.Thread(target=self._run, name="streamvox-supervisor", daemon=True)
        self._thread.start()
        # probes wait on sockets for seconds: in their own thread, so exits are still seen at once
        self._prober = threading.Thread(target=self._probe_loop, name="streamvox-prober", daemon=True)
        self._prober.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop watching, then stop every child (before the process exits, in the normal way)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s + self.max_backoff_s)
        if self._prober is not None:
            self._prober.join(timeout=self.probe_timeout_s + 1)
        for w in self._watched:
            w.child.stop(timeout=timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            for w in list(self._watched):
                if not w.given_up and w.child.proc is not None and w.child.proc.poll() is not None:  # poll() reaps
                    self._restart(w)
                elif w.up and w.live_path and not w.killed_hung and time.monotonic() - w.alive_at > self.hung_after_s:
                    self._kill_hung(w)
                elif w.up and w.failures and time.monotonic() - w.up_since >= self.healthy_s:
                    w.failures = 0

    def _probe_loop(self) -> None:
        while not self._stop.wait(self.probe_every_s):
            for w in list(self._watched):
                if w.live_path and w.up and not w.killed_hung and self._answers(w):
                    w.alive_at = time.monotonic()

    def _answers(self, w: _Watched) -> bool:
        try:
            with urllib.request.urlopen(w.child.base + w.live_path, timeout=self.probe_timeout_s) as resp:
                return resp.status < 500
        except Exception:  # refused, timed out, 5xx: no answer this time
            return False

    def _kill_hung(self, w: _Watched) -> None:
        proc = w.child.proc
        if proc is None or proc.poll() is not None:
            return
        w.killed_hung = True
        self._say(
            f"pipecat_agent: {w.child.what} has not answered {w.live_path} for {self.hung_after_s:g} s "
            f"(hung); killing it"
        )
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)  # the next poll reaps it and restarts it

    def _restart(self, w: _Watched) -> None:
        code = w.child.proc.returncode if w.child.proc is not None else None
        how = f"signal {-code}" if code is not None and code < 0 else f"status {code}"
        if w.killed_hung:
            how += ", killed as hung"
        with self._lock:
            w.up = False
        now = time.monotonic()
        w.restarts = [t for t in w.restarts if now - t < self.window_s]
        if len(w.restarts) >= self.max_restarts:
            w.given_up = True
            self._say(
                f"pipecat_agent: {w.child.what} exited ({how}) after {len(w.restarts)} restarts within "
                f"{self.window_s:g} s; not restarting it again (calls will apologise; restart the demo)"
            )
            return
        delay = min(self.max_backoff_s, self.backoff_s * 2**w.failures)
        w.restarts.append(now)
        w.failures += 1
        self._say(f"pipecat_agent: {w.child.what} exited ({how}); restarting it in {delay:g} s")
        if self._stop.wait(delay):
            return
        t0 = time.monotonic()
        try:
            w.child.start(w.ready_timeout_s)
        except StartError as exc:
            self._say(f"pipecat_agent: restarting {w.child.what} failed: {exc}")
            return  # its process has exited: the next poll tries again, with a longer back-off
        with self._lock:
            w.up, w.up_since = True, time.monotonic()
            w.alive_at, w.killed_hung = w.up_since, False
        self._say(f"pipecat_agent: {w.child.what} is back ({time.monotonic() - t0:.1f} s to be ready)")
