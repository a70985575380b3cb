"""Watch the demo's child servers (the TTS server, the local LLM) and restart the ones that die.

Why: the agent talks to its parts over loopback, so a part that dies (killed, out of memory, a
crash) leaves every call silent until someone restarts the demo, and the dead child stays a
zombie. The supervisor polls each child, which also reaps it, and restarts it on the same port
(the agent's URLs stay valid) after a back-off that doubles on each failure in a row, at most
``max_restarts`` times within ``window_s``; then it gives up in one line rather than flapping.
A child that stays up ``healthy_s`` starts its back-off over.

It runs in one thread kept for the life of the process: children started with
``die_with_parent`` are tied by the kernel to the thread that started them
(``tts_service.die_with_parent``), so restarts must not come from a thread that ends.
"""

from __future__ import annotations

import threading
import time
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
        say: Callable[[str], None] = print,
    ) -> None:
        self.poll_s, self.backoff_s, self.max_backoff_s = poll_s, backoff_s, max_backoff_s
        self.max_restarts, self.window_s, self.healthy_s = max_restarts, window_s, healthy_s
        self._say = say
        self._watched: list[_Watched] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, child: ChildServer, name: str, *, ready_timeout_s: float = 120.0) -> None:
        """Watch ``child`` (already started and ready) under ``name`` (``tts``, ``llm``)."""
        with self._lock:
            self._watched.append(_Watched(child, name, ready_timeout_s))

    def status(self) -> dict[str, bool]:
        with self._lock:
            return {w.name: w.up for w in self._watched}

    def start(self) -> Supervisor:
        self._thread = threading.Thread(target=self._run, name="streamvox-supervisor", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop watching, then stop every child (before the process exits, in the normal way)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s + self.max_backoff_s)
        for w in self._watched:
            w.child.stop(timeout=timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            for w in list(self._watched):
                if not w.given_up and w.child.proc is not None and w.child.proc.poll() is not None:  # poll() reaps
                    self._restart(w)
                elif w.up and w.failures and time.monotonic() - w.up_since >= self.healthy_s:
                    w.failures = 0

    def _restart(self, w: _Watched) -> None:
        code = w.child.proc.returncode if w.child.proc is not None else None
        how = f"signal {-code}" if code is not None and code < 0 else f"status {code}"
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
        self._say(f"pipecat_agent: {w.child.what} is back ({time.monotonic() - t0:.1f} s to be ready)")
