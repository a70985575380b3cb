"""Phone calls through the whole demo agent, measured at the caller: several at once, and one long one.

    .venv/bin/python scripts/agent_calls.py --calls 1,2,3,4 --rounds 3 --json out/agent_calls.json
    .venv/bin/python scripts/agent_calls.py --turns 60 --json out/agent_long_call.json

Why: ``scripts/long_call.py`` times the local LLM alone (its first token), but a caller hears the
whole pipeline — Silero VAD, smart-turn, Whisper, the LLM and the TTS server, all sharing the
machine's cores — and issue 22's bounds (first-turn voice-to-voice of 4 concurrent calls
≤ 1.5 s; a 60-turn call with no turn above 1.5 s and memory flat after warm-up) are about that.
The session cap (``STREAMVOX_MAX_CALLS``, ``pipelines/room_limits.py``) should come from the same
measurement, so this script gives it.

It starts the demo the way a user does, ``python -m pipelines.pipecat_agent`` (its own TTS server
and local LLM children; loopback only; ``STREAMVOX_MAX_CALLS`` raised to the sweep's largest level)
and waits for ``/readyz``. Callers speak Twilio's media-stream protocol (8 kHz mu-law, 20 ms
packets in real time) on its ``/ws`` (``support.pipecat_harness.TwilioCaller``), with voices of the
caller corpus (``support/callers.py``) that are not the agent's own.

* ``--calls 1,2,3,4``: per level, N callers dial together, let the greeting end, then each says a
  corpus question at the same moment. Voice-to-voice = the caller's speech end (known from the
  audio sent: the words end at a known offset in it) -> the first voiced packet received after
  it. Per level: each call's figure, median, p95 (interpolated), max, calls with no answer within
  10 s, the load average, the agent's RSS with its children, and the agent's own per-turn stage
  medians from its log. ``--rounds`` fresh sets of calls per level.
* ``--turns 60``: one call, turns that ask for long answers (the corpus voices, texts of this
  script), each after the previous reply has finished and a short pause; per turn voice-to-voice
  and RSS; summary over turns 1-10 and the last 11, turns over 1.5 s, RSS at turns 10/30/60.

Progress lines go to stderr; ``--json FILE`` keeps every raw figure. The figures belong in
docs/BENCHMARKS.md ("Calls at once through the agent") with the tree and the load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # support.*, bench.*
os.environ.setdefault("LOGURU_LEVEL", "WARNING")  # Pipecat's import-time INFO banner, in this process

from bench.stats import median, percentile  # noqa: E402

BOUND_S = 1.5  # issue 22's voice-to-voice bound
ANSWER_TIMEOUT_S = 10.0  # no voiced packet this long after the speech end: no answer
GREETING_TIMEOUT_S = 30.0  # the greeting not over by then: speak anyway
GREETING_QUIET_S = 1.0  # this long without a voiced packet after the greeting: it is over
REPLY_QUIET_S = 1.5  # ... after a reply (longer: a slow LLM leaves gaps between sentences)
REPLY_TIMEOUT_S = 90.0  # a reply still going after this long is cut by the next turn
PAUSE_S = 0.5  # the caller's breath between the reply's end and the next turn
LEAD_S, TAIL_S = 0.1, 0.05  # room noise kept before the first word and after the last
START_TIMEOUT_S = 420.0  # the demo's start (the LLM's first start packs its weights)

# Corpus questions for first turns: complete turns (no mid-thought pause), voices not the agent's
# timbre, and none at -38 dBFS (the quietest callers the VAD may not hear at all: a miss there is
# the VAD's, not concurrency's). Call k of round r says FIRST_TURNS[(r + k) % len].
FIRST_TURNS = (
    "espeak-us-f3/q-france",
    "espeak-scot-fast/q-pharmacy",
    "espeak-rp-slow/q-italy",
    "espeak-us-klatt/s-train",
    "espeak-caribbean-f4/n-table",
    "espeak-scot-fast/n-order",
    "espeak-us-klatt/q-pharmacy",
    "espeak-caribbean-f4/q-france",
)


class DemoError(Exception):
    """The demo could not start or went away: the message says what it printed."""


# ---------------------------------------------------------------- the demo, as a user starts it


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:  # gone meanwhile
        pass
    return 0


def _tree(root: int) -> list[int]:
    """``root`` and all its descendants."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # the command may hold spaces and parentheses
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _part(pid: int, root: int) -> str:
    """Which part of the demo a process is: "agent" (the root), "llm", "tts" or "other"."""
    if pid == root:
        return "agent"
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "other"
    return "llm" if "local_llm" in cmd else "tts" if "tts_service" in cmd else "other"


def tree_rss_parts(root: int) -> dict[str, float]:
    """RSS in MB of the demo's parts (the agent, its local LLM, its TTS server, anything else):
    a growth is then charged to the process that grows."""
    return {k: round(v, 1) for k, v in sorted(_by_part(root, lambda pid: _rss_kb(pid) / 1024).items())}


def _by_part(root: int, measure) -> dict[str, float]:
    """``measure(pid)`` summed over the processes of each part of the demo (see :func:`_part`)."""
    parts: dict[str, float] = {}
    for pid in _tree(root):
        part = _part(pid, root)
        parts[part] = parts.get(part, 0.0) + measure(pid)
    return parts


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def tree_cpu_parts(root: int) -> dict[str, float]:
    """CPU seconds so far of the demo's parts (as :func:`tree_rss_parts`) and of the callers (this
    script: their audio, μ-law and sockets share the machine too). Two readings around a level say
    which part the machine's cores went to."""
    parts = _by_part(root, _cpu_s)
    t = os.times()
    parts["callers"] = t.user + t.system
    return parts


def cpu_shares(before: dict[str, float], after: dict[str, float], wall_s: float) -> dict[str, float]:
    """Cores used by each part between two :func:`tree_cpu_parts` readings (1.0 = one core busy)."""
    return {k: round((after[k] - before.get(k, 0.0)) / wall_s, 2) for k in sorted(after)} if wall_s > 0 else {}


def tree_rss_mb(root: int) -> float:
    """RSS of ``root`` and all its descendants (the demo, its TTS server and local LLM), summed."""
    return sum(_rss_kb(pid) for pid in _tree(root)) / 1024


class Demo:
    """``python -m pipelines.pipecat_agent`` on a free loopback port, its output in a file; in a
    process group of its own, stopped as a group (its children must not outlive it), and killed by
    the kernel if this script dies without stopping it (``tts_service.die_with_parent``: a SIGKILLed
    run once left the demo and its children holding 1.7 GB)."""

    def __init__(self, *, max_calls: int) -> None:
        from tts_service.localproc import free_port

        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", STREAMVOX_MAX_CALLS=str(max_calls))
        self.env.setdefault("HF_HUB_OFFLINE", "1")
        self.log = tempfile.NamedTemporaryFile("w+b", prefix="agent_calls-", suffix=".log")
        # the agent's frame log (the user's STREAMVOX_FRAME_LOG if set): the replies' words come from it
        self._frames = None
        if not self.env.get("STREAMVOX_FRAME_LOG"):
            self._frames = tempfile.NamedTemporaryFile("w+b", prefix="agent_calls-", suffix=".jsonl")
            self.env["STREAMVOX_FRAME_LOG"] = self._frames.name
        self.frame_log = Path(self.env["STREAMVOX_FRAME_LOG"])
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = START_TIMEOUT_S) -> Demo:
        cmd = [sys.executable, "-m", "tts_service.die_with_parent", str(os.getpid()), "-m", "pipelines.pipecat_agent"]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port)]
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=self.env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise DemoError(f"the demo exited with status {self.proc.returncode}: {self.tail()}")
            try:
                with urllib.request.urlopen(f"{self.base}/readyz", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise DemoError(f"the demo was not ready within {timeout_s:.0f} s: {self.tail()}")

    def text(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_bytes().decode(errors="replace")

    def tail(self, lines: int = 4) -> str:
        last = [line.strip() for line in self.text().splitlines() if line.strip()][-lines:]
        return " | ".join(last) if last else "(it printed nothing)"

    def rss_mb(self) -> float:
        return tree_rss_mb(self.proc.pid) if self.proc is not None else float("nan")

    def rss_parts(self) -> dict[str, float]:
        return tree_rss_parts(self.proc.pid) if self.proc is not None else {}

    def cpu_parts(self) -> dict[str, float]:
        return tree_cpu_parts(self.proc.pid) if self.proc is not None else {}

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.proc is None:
            return
        self.proc.terminate()  # the demo stops its own children, in order
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=timeout_s)
        with contextlib.suppress(ProcessLookupError):  # whatever of the group is still there
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=5)
        self.proc = None
        self.log.close()
        if self._frames is not None:
            self._frames.close()


# a figures line of a turn: its stages, then the rest of the line (the TTS's own figure, the early decode)
_TURN_LINE = re.compile(r"turn \d+: ms after the caller's speech end[^:]*: ([^;\n]*)([^\n]*)")
_STAGE = re.compile(r"([a-zA-Z ]+?) ([+-]\d+)")


def llm_replies(frame_log: Path) -> list[dict]:
    """Each LLM response the agent's frame log holds, in order: its call, pipeline time and words.

    Why: a long call's figures depend on what the agent said (a reply of 2 s or of 40 s); the caller
    hears only audio. A speculative response that was withdrawn (never heard) can be in it too."""
    out: list[dict] = []
    if not frame_log.exists():
        return out
    open_: dict[str, dict] = {}
    for raw in frame_log.read_text(errors="replace").splitlines():
        try:
            ev = json.loads(raw)
        except ValueError:
            continue
        call, frame = ev.get("call", ""), ev.get("frame")
        if frame == "LLMFullResponseStartFrame":
            open_[call] = {"call": call, "t": ev.get("t"), "text": ""}
        elif frame == "LLMTextFrame" and call in open_:
            open_[call]["text"] += ev.get("text", "")
        elif frame == "LLMFullResponseEndFrame" and call in open_:
            out.append(open_.pop(call))
    return out


def frame_stages(frame_log: Path) -> list[dict]:
    """Each answered turn's stages from the agent's frame log (``pipelines.pipecat_frame_log``: ms after
    its VAD stop, the words the agent heard), so that a slow turn of a long run says where it waited."""
    from pipelines.pipecat_frame_log import read_turns

    try:
        return read_turns(frame_log) if frame_log.exists() else []
    except (ValueError, KeyError) as exc:
        print(f"agent_calls: the frame log {frame_log} could not be read ({exc})", file=sys.stderr)
        return []


def slow_stages(turns: list[dict], stages: list[dict]) -> list[dict]:
    """The frame log's stages of the turns over the bound. The n-th answered turn in the log is the
    caller's n-th answered turn only when the counts agree (a turn the agent split in two, or a
    reply to an echo, would shift them): otherwise nothing is attributed."""
    answered = [t for t in turns if t["v2v_s"] is not None]
    if len(answered) != len(stages):
        print(
            f"agent_calls: the frame log has {len(stages)} answered turns for {len(answered)} of the caller's: "
            "the slow turns' stages are not attributed (all of them are in the JSON's 'stages')",
            file=sys.stderr,
        )
        return []
    return [dict(st, turn=t["turn"]) for t, st in zip(answered, stages, strict=True) if t["v2v_s"] > BOUND_S]


def child_exits(log: str) -> list[str]:
    """The supervisor's lines about a child that died or was killed as hung (``pipelines.supervisor``):
    a level's figures with a restarted TTS or LLM in them are not the machine's capacity."""
    died = ("exited (", "(hung)")
    return [line.strip() for line in log.splitlines() if "pipecat_agent: " in line and any(d in line for d in died)]


def early_decodes(log: str) -> list[int]:
    """[turns whose transcript was decoded before the VAD's stop, turns] in ``log`` (the figures' lines)."""
    tails = [m.group(2) for m in _TURN_LINE.finditer(log)]
    return [sum("decoded before the VAD's stop" in t for t in tails), len(tails)]


def stage_medians(log: str) -> dict[str, float | None]:
    """The agent's own per-turn stage figures (``pipelines.pipecat_figures``'s INFO lines: ms after
    the speech end as its VAD saw it), median per stage over the turns in ``log``."""
    stages: dict[str, list[float]] = {}
    for m in _TURN_LINE.finditer(log):
        for name, value in _STAGE.findall(m.group(1)):
            stages.setdefault(name.strip(" ,"), []).append(float(value))
    return {name: median(values) for name, values in stages.items()}


# ---------------------------------------------------------------- what the callers say


@dataclass(frozen=True)
class Line:
    """One caller turn as the phone carries it, and where in it the words end."""

    id: str
    text: str
    mulaw: bytes  # 8 kHz mu-law, 1 byte a sample
    speech_end_s: float  # from the first byte sent


def _line(u) -> Line:
    from support.lines import to_mulaw

    start = max(0.0, u.speech_start_s - LEAD_S)
    x = u.audio()[int(start * u.sample_rate) : int((u.speech_end_s + TAIL_S) * u.sample_rate)]
    return Line(u.id, u.text, to_mulaw(x), u.speech_end_s - start)


def first_lines() -> list[Line]:
    from support.callers import corpus

    return [_line(u) for u in corpus(list(FIRST_TURNS))]


def long_lines(turns: int) -> list[Line]:
    """``turns`` long-answer asks (``support.callers.long_asks``: the demo's system prompt still asks
    for one to three sentences, what a user of the demo gets)."""
    from support.callers import long_asks

    return [_line(u) for u in long_asks(turns)]


# ---------------------------------------------------------------- one caller's ear


class Ear:
    """What a caller heard, scanned incrementally (a long call receives tens of thousands of packets)."""

    def __init__(self, caller) -> None:
        self.caller = caller
        self.pos = 0
        self.last_voiced: float | None = None
        self.spoke_at: float | None = None  # the last turn's first packet sent

    def _scan(self, after: float) -> float | None:
        """Advance over new packets; the time of the first voiced one later than ``after``, if any."""
        from support.pipecat_harness import voiced

        events, first = self.caller.events, None
        while self.pos < len(events):
            t, ev = events[self.pos]
            self.pos += 1
            if voiced(ev):
                self.last_voiced = t
                if first is None and t > after:
                    first = t
        return first

    @property
    def hung_up(self) -> bool:
        return self.caller.ws.close_code is not None

    async def first_voiced_after(self, t0: float, timeout_s: float) -> float | None:
        deadline = t0 + timeout_s
        while True:
            first = self._scan(t0)
            if first is not None or time.monotonic() > deadline or self.hung_up:
                return first
            await asyncio.sleep(0.01)

    async def quiet(self, quiet_s: float, timeout_s: float) -> float | None:
        """Wait until ``quiet_s`` passed without a voiced packet after one (or ``timeout_s``): the
        end of the last voiced packet heard, None when nothing was."""
        t0 = time.monotonic()
        while True:
            self._scan(float("inf"))
            now = time.monotonic()
            heard = self.last_voiced is not None and self.last_voiced >= t0 - quiet_s
            if (heard and now - self.last_voiced >= quiet_s) or now - t0 > timeout_s or self.hung_up:
                return self.last_voiced
            await asyncio.sleep(0.05)

    async def say(self, line: Line) -> float | None:
        """Send ``line`` and return when its last packet is out: the wall time its words ended
        (None: the agent hung up first, e.g. all lines busy)."""
        asked = time.monotonic()
        self.caller.outgoing.put_nowait(line.mulaw)
        while self.caller.speech_end < asked:
            if self.hung_up:
                return None
            await asyncio.sleep(0.02)
        # talking[-1] is this utterance: (its first packet's send time, its last packet's end)
        self.spoke_at = self.caller.talking[-1][0]
        return self.spoke_at + line.speech_end_s


# ---------------------------------------------------------------- calls at once


async def _health(http, base: str) -> dict:
    async with http.get(f"{base}/healthz") as resp:
        return await resp.json()


async def _calls_in_use(http, base: str) -> int:
    return int((await _health(http, base))["calls"])


async def _loop_stalls(http, base: str) -> dict:
    """The agent's event-loop stalls so far (``pipelines.loop_watch``, in /healthz): count, worst ms."""
    return (await _health(http, base)).get("loop") or {}


async def _lines_free(http, base: str, timeout_s: float = 30.0) -> None:
    """Wait until the room has given back every line (a hung-up call's pipeline ends in a moment)."""
    for _ in range(int(timeout_s / 0.2)):
        if not await _calls_in_use(http, base):
            return
        await asyncio.sleep(0.2)


async def _none() -> None:
    return None


async def one_round(demo: Demo, n: int, round_: int, lines: list[Line]) -> dict:
    """N callers dial together, hear the greeting out, then all ask at once."""
    from support.pipecat_harness import twilio_call

    said = [lines[(round_ + k) % len(lines)] for k in range(n)]
    async with contextlib.AsyncExitStack() as stack:
        dialled = time.monotonic()
        callers = [await stack.enter_async_context(twilio_call(demo.base)) for _ in range(n)]
        ears = [Ear(c) for c in callers]
        greeted = await asyncio.gather(*(e.first_voiced_after(dialled, GREETING_TIMEOUT_S) for e in ears))
        await asyncio.gather(*(e.quiet(GREETING_QUIET_S, GREETING_TIMEOUT_S) for e in ears))
        ends = await asyncio.gather(*(e.say(line) for e, line in zip(ears, said)))
        heard = await asyncio.gather(
            *(e.first_voiced_after(end, ANSWER_TIMEOUT_S) if end else _none() for e, end in zip(ears, ends))
        )
        rss = demo.rss_mb()  # every call answered (or given up on), the replies still going
    first_spoke = min((e.spoke_at for e in ears if e.spoke_at is not None), default=0.0)
    calls = [
        {
            "caller": line.id,
            "text": line.text,
            "greeting_s": None if g is None else round(g - dialled, 3),
            "v2v_s": None if h is None or end is None else round(h - end, 3),
            "spoke_after_first_s": None if end is None else round(ear.spoke_at - first_spoke, 3),
            "hung_up": end is None,
        }
        for line, ear, g, end, h in zip(said, ears, greeted, ends, heard)
    ]
    return {"round": round_ + 1, "calls": calls, "rss_mb": round(rss, 1)}


def level_summary(rounds: list[dict]) -> dict:
    v2v = [c["v2v_s"] for r in rounds for c in r["calls"]]
    got = [v for v in v2v if v is not None]
    return {
        "calls": len(v2v),
        "no_answer": len(v2v) - len(got),
        "v2v_median_s": median(got),
        "v2v_p95_s": percentile(got, 95),
        "v2v_max_s": max(got) if got else None,
        "over_bound": sum(v > BOUND_S for v in got),
        "rss_mb_max": max(r["rss_mb"] for r in rounds),
    }


async def run_levels(demo: Demo, levels: list[int], rounds: int) -> list[dict]:
    import aiohttp

    lines = first_lines()
    out = []
    async with aiohttp.ClientSession() as http:
        for n in levels:
            log_from = len(demo.text())
            stalls_before = await _loop_stalls(http, demo.base)
            load_before = os.getloadavg()[0]
            cpu_before, t_before = demo.cpu_parts(), time.monotonic()
            done = []
            for r in range(rounds):
                await _lines_free(http, demo.base)
                done.append(await one_round(demo, n, r, lines))
                figures = ", ".join("-" if c["v2v_s"] is None else f"{c['v2v_s']:.2f}" for c in done[-1]["calls"])
                print(f"{n} call(s), round {r + 1}/{rounds}: voice-to-voice s {figures}", file=sys.stderr, flush=True)
            level = {
                "n": n,
                "rounds": done,
                "load": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                "agent_stages_ms_median": stage_medians(demo.text()[log_from:]),
                "early_decodes": early_decodes(demo.text()[log_from:]),
                "cores_by_part": cpu_shares(cpu_before, demo.cpu_parts(), time.monotonic() - t_before),
                "child_exits": child_exits(demo.text()[log_from:]),
                # stalls of the agent's event loop over the level (audio waits through each)
                "loop_stalls": (await _loop_stalls(http, demo.base)).get("stalls", 0) - stalls_before.get("stalls", 0),
                "loop_stall_lines": loop_stall_lines(demo.text()[log_from:]),
            }
            level["summary"] = level_summary(done)
            out.append(level)
            s = level["summary"]
            print(
                f"{n} call(s): median {_s(s['v2v_median_s'])}, p95 {_s(s['v2v_p95_s'])}, max {_s(s['v2v_max_s'])}, "
                f"no answer {s['no_answer']}/{s['calls']}, load {level['load'][0]}-{level['load'][1]}, "
                f"RSS {s['rss_mb_max']:.0f} MB",
                file=sys.stderr,
                flush=True,
            )
    return out


def loop_stall_lines(log: str) -> list[str]:
    """The logged stalls (``pipelines.loop_watch``: one line per 5 s, with its stack): "ms in function"."""
    out = []
    for m in re.finditer(r"event loop held (\d+) ms[^\n]*\n((?:  .*\n)*)", log):
        frames = re.findall(r'File "([^"]+)", line \d+, in (\w+)', m.group(2))
        where = f"{Path(frames[-1][0]).name}:{frames[-1][1]}" if frames else "not sampled"
        out.append(f"{m.group(1)} ms in {where}")
    return out


def proposed_cap(levels: list[dict]) -> int | None:
    """The largest N whose first-turn voice-to-voice p95 is within the bound, every call answered,
    and every smaller level too (a cap must not skip a level that failed)."""
    cap = None
    for level in sorted(levels, key=lambda lv: lv["n"]):
        s = level["summary"]
        if s["no_answer"] or s["v2v_p95_s"] is None or s["v2v_p95_s"] > BOUND_S:
            break
        cap = level["n"]
    return cap


# ---------------------------------------------------------------- one long call


async def run_long_call(demo: Demo, turns: int) -> list[dict]:
    from support.pipecat_harness import twilio_call

    lines = long_lines(turns)
    out = []
    async with twilio_call(demo.base) as caller:
        ear = Ear(caller)
        await ear.first_voiced_after(time.monotonic(), GREETING_TIMEOUT_S)
        await ear.quiet(GREETING_QUIET_S, GREETING_TIMEOUT_S)
        for i, line in enumerate(lines, 1):
            end = await ear.say(line)
            if end is None:
                raise DemoError(f"the call was dropped at turn {i}: {demo.tail()}")
            first = await ear.first_voiced_after(end, ANSWER_TIMEOUT_S)
            last = await ear.quiet(REPLY_QUIET_S, REPLY_TIMEOUT_S) if first is not None else None
            turn = {
                "turn": i,
                "caller": line.id,
                "text": line.text,
                "v2v_s": None if first is None else round(first - end, 3),
                "reply_s": None if first is None or last is None else round(last - first, 2),
                "rss_mb": round(demo.rss_mb(), 1),
                "rss_parts_mb": demo.rss_parts(),
                "load": round(os.getloadavg()[0], 2),
            }
            out.append(turn)
            v2v = "no answer" if first is None else f"{turn['v2v_s']:.2f} s"
            print(
                f"turn {i}/{turns}: voice-to-voice {v2v}, reply {turn['reply_s']} s, RSS {turn['rss_mb']:.0f} MB, "
                f"load {turn['load']}",
                file=sys.stderr,
                flush=True,
            )
            if ear.hung_up:
                raise DemoError(f"the call was dropped at turn {i}: {demo.tail()}")
            await asyncio.sleep(PAUSE_S)
    return out


def long_summary(turns: list[dict]) -> dict:
    def span(lo: int, hi: int) -> dict:
        v = [t["v2v_s"] for t in turns if lo <= t["turn"] <= hi and t["v2v_s"] is not None]
        return {"median_s": median(v), "p95_s": percentile(v, 95), "max_s": max(v) if v else None, "n": len(v)}

    last = len(turns)
    rss = {t["turn"]: t["rss_mb"] for t in turns}
    parts = {t["turn"]: t.get("rss_parts_mb", {}) for t in turns}
    answered = [t for t in turns if t["v2v_s"] is not None]
    worst = max(answered, key=lambda t: t["v2v_s"]) if answered else None
    return {
        "turns_1_10": span(1, 10),
        f"turns_{max(1, last - 10)}_{last}": span(max(1, last - 10), last),
        "over_bound": sum(t["v2v_s"] > BOUND_S for t in answered),
        "no_answer": last - len(answered),
        "worst": None if worst is None else {"turn": worst["turn"], "v2v_s": worst["v2v_s"]},
        "rss_mb": {k: rss[k] for k in (1, 10, 30, 60, last) if k in rss},
        "rss_parts_mb": {k: parts[k] for k in (1, 10, 30, 60, last) if k in parts},
    }


# ---------------------------------------------------------------- main


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} s"


def _levels(raw: str) -> list[int]:
    try:
        levels = sorted({int(x) for x in raw.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--calls takes numbers like 1,2,3,4, got {raw!r}") from None
    if not levels or levels[0] < 1 or levels[-1] > 16:
        raise argparse.ArgumentTypeError(f"--calls takes levels from 1 to 16, got {raw!r}")
    return levels


def print_levels(levels: list[dict]) -> None:
    print("| calls at once | each call's voice-to-voice, s (by round) | median | p95 | max | no answer | load | RSS |")
    print("|---:|---|---:|---:|---:|---:|---|---:|")
    for lv in levels:
        s = lv["summary"]
        each = " · ".join(
            " / ".join("-" if c["v2v_s"] is None else f"{c['v2v_s']:.2f}" for c in r["calls"]) for r in lv["rounds"]
        )
        print(
            f"| {lv['n']} | {each} | {_s(s['v2v_median_s'])} | {_s(s['v2v_p95_s'])} | {_s(s['v2v_max_s'])} | "
            f"{s['no_answer']} of {s['calls']} | {lv['load'][0]}–{lv['load'][1]} | {s['rss_mb_max']:.0f} MB |"
        )
    for lv in levels:
        stages = ", ".join(f"{k} {v:.0f}" for k, v in lv["agent_stages_ms_median"].items() if v is not None)
        print(f"  {lv['n']} call(s), the agent's stages (ms after the speech end it saw, medians): {stages or '-'}")
        if lv.get("early_decodes"):
            used, turns = lv["early_decodes"]
            print(f"  {lv['n']} call(s), transcripts decoded before the VAD's stop: {used} of {turns} turns")
        cores = ", ".join(f"{k} {v:.2f}" for k, v in lv.get("cores_by_part", {}).items())
        print(f"  {lv['n']} call(s), cores busy by part over the level (1.00 = one core): {cores or '-'}")
        if lv.get("loop_stalls") is not None:
            held = ", ".join(lv.get("loop_stall_lines") or []) or "-"
            n, stalls = lv["n"], lv["loop_stalls"]
            print(f"  {n} call(s), the agent's event loop held over 150 ms: {stalls} times (logged: {held})")
        for line in lv.get("child_exits", []):
            print(f"  {lv['n']} call(s), a child of the demo died: {line}")
    cap = proposed_cap(levels)
    print(f"\nthe largest level with p95 ≤ {BOUND_S} s and every call answered: {cap if cap else 'none'}")


def print_long(summary: dict) -> None:
    for key, span in summary.items():
        if key.startswith("turns_"):
            print(
                f"{key.replace('_', ' ', 1).replace('_', '-')}: median {_s(span['median_s'])}, "
                f"p95 {_s(span['p95_s'])}, max {_s(span['max_s'])} ({span['n']} answered)"
            )
    worst = summary["worst"]
    print(f"turns over {BOUND_S} s: {summary['over_bound']}; no answer: {summary['no_answer']}; worst: {worst}")
    slow = summary.get("slow_stages", [])
    if slow:
        print(
            f"turns over {BOUND_S} s, the agent's stages (ms after its VAD stop: STT, end of turn, LLM first token, "
            "TTS first audio, transport; the words it heard):"
        )
        for st in slow:
            print(
                f"  turn {st['turn']}: {st['stt']} {st['end_of_turn']} {st['llm_first']} {st['first_audio']} "
                f"{st['bot_started']}  {st['text']!r}"
            )
    print("RSS (agent + children), MB, by turn: " + ", ".join(f"{k}: {v:.0f}" for k, v in summary["rss_mb"].items()))
    for turn, parts in summary.get("rss_parts_mb", {}).items():
        print(f"  turn {turn}: " + ", ".join(f"{k} {v:.0f}" for k, v in parts.items()))


def _interrupted(_signum, _frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=_levels, help="levels of calls at once, e.g. 1,2,3,4")
    parser.add_argument("--rounds", type=int, default=3, help="fresh sets of calls per level (default 3)")
    parser.add_argument("--turns", type=int, help="instead: one call of this many long-answer turns")
    parser.add_argument("--json", type=Path, help="write every raw figure here")
    args = parser.parse_args(argv)
    if (args.calls is None) == (args.turns is None):
        parser.error("give --calls LEVELS or --turns N")
    if args.rounds < 1 or (args.turns is not None and not 1 <= args.turns <= 200):
        parser.error("--rounds must be >= 1 and --turns within 1..200")
    from support.callers import CorpusError

    try:
        lines = first_lines() if args.calls else long_lines(args.turns)  # rendered before the demo's minutes
    except CorpusError as exc:
        print(f"agent_calls: {exc}", file=sys.stderr)
        return 2
    print(f"agent_calls: {len(lines)} caller turns ready; starting the demo", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, _interrupted)  # a kill stops the demo as Ctrl-C does
    demo = Demo(max_calls=max(args.calls or [1]))
    doc: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "bound_s": BOUND_S}
    try:
        demo.start()
        t0 = time.monotonic()
        doc["rss_mb_idle"] = round(demo.rss_mb(), 1)
        print(f"agent_calls: the demo is ready at {demo.base}, RSS {doc['rss_mb_idle']:.0f} MB", file=sys.stderr)
        if args.calls:
            doc["levels"] = asyncio.run(run_levels(demo, args.calls, args.rounds))
            doc["proposed_max_calls"] = proposed_cap(doc["levels"])
        else:
            doc["turns"] = asyncio.run(run_long_call(demo, args.turns))
            doc["summary"] = long_summary(doc["turns"])
            doc["replies"] = llm_replies(demo.frame_log)
            doc["stages"] = frame_stages(demo.frame_log)
            doc["summary"]["slow_stages"] = slow_stages(doc["turns"], doc["stages"])
            words = [len(r["text"].split()) for r in doc["replies"]]
            print(f"agent_calls: {len(words)} LLM responses, words each: {words}", file=sys.stderr)
        doc["seconds"] = round(time.monotonic() - t0, 1)
    except DemoError as exc:
        print(f"agent_calls: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("agent_calls: interrupted", file=sys.stderr)
        return 130
    finally:
        demo.stop()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1))
    if args.calls:
        print_levels(doc["levels"])
    else:
        print_long(doc["summary"])
    if args.json:
        print(f"\nwritten: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
