"""Run a module as ``python -m`` would, in a process that dies with the one that started it.

    python -m tts_service.die_with_parent PARENT_PID -m MODULE [ARGS...]

Why: a launcher that starts servers (the demo's TTS server and local LLM) stops them on a normal
exit, but nothing runs on SIGKILL or a crash; its children would go on holding their ports and
a gigabyte of memory. On Linux ``prctl(PR_SET_PDEATHSIG)`` has the kernel send this process
SIGKILL when its parent goes. The signal is tied to the parent *thread* that started the child,
so the parent must start children from a thread that lives as long as it does (the main thread,
or a supervisor thread kept to the end). Elsewhere the module simply runs.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Ask the kernel for SIGKILL when the parent goes; exit now if it already has."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)


def main(argv: list[str]) -> None:
    if len(argv) < 3 or not argv[0].isdigit() or argv[1] != "-m":
        raise SystemExit("usage: python -m tts_service.die_with_parent PARENT_PID -m MODULE [ARGS...]")
    die_with_parent(int(argv[0]))
    module, rest = argv[2], argv[3:]
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
