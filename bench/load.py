"""Concurrency sweep: N simulated agents, each on its own persistent connection, talking in turns.

Per level, agents start staggered over ``stagger_s`` and then speak turns back to back until
``seconds`` have passed: the next turn starts once the simulated player has played the last one
and a short pause (the caller's brief answer) has passed, so that an agent talks at the pace of
speech whatever the server's delivery; a turn started before the deadline runs to its end.
Each turn's frames feed a simulated real-time player (:mod:`bench.player`). An
``overloaded`` refusal is counted; the agent waits the server's ``retry_after_ms`` and goes on
with its next turn. Server CPU comes from
``process_cpu_seconds_total`` on the server's ``/metrics``, read before and after each level.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp

from . import texts
from .player import Arrival, PlayerResult, simulate
from .servers import capacity_streams, cpu_seconds, http_base
from .stats import gaps, percentile, rnd
from .wire import Conn, Ctx, WireError

TTFB_HEALTHY_MS = 250.0

Progress = Callable[[str], None]


@dataclass(slots=True)
class LoadOptions:
    levels: tuple[int, ...] = (1, 2, 4, 8, 16)
    seconds: float = 15.0
    prebuffer_s: float = 0.08
    pause_s: tuple[float, float] = (0.3, 0.8)
    stagger_s: float | None = None  # agents start this far apart in all (default: 125 ms apart, <= 2 s)
    turn_timeout_s: float = 60.0
    settle_s: float = 1.0  # quiet time between levels
    seed: int = 1
    turns: Sequence[str] = texts.TURNS


@dataclass(slots=True)
class AgentStats:
    turns: int = 0
    refused: int = 0
    errors: int = 0
    timeouts: int = 0
    audio_s: float = 0.0
    underruns: int = 0
    underrun_s: float = 0.0
    ttfb_s: list[float] = field(default_factory=list)
    gaps_s: list[float] = field(default_factory=list)
    error_codes: dict[str, int] = field(default_factory=dict)

    def error(self, code: str) -> None:
        self.errors += 1
        self.error_codes[code] = self.error_codes.get(code, 0) + 1


async def _agent(
    index: int, url: str, session: aiohttp.ClientSession, delay: float, deadline: float, opts: LoadOptions
) -> AgentStats:
    stats = AgentStats()
    rng = random.Random(opts.seed * 1000 + index)
    await asyncio.sleep(delay)
    conn = Conn(url)
    try:
        await conn.connect(session)
    except WireError:
        stats.error("connect")
        return stats
    k = index
    try:
        while time.perf_counter() < deadline:
            text = opts.turns[k % len(opts.turns)]
            k += 1
            # Wait for "started" before the text: after a refusal, a text message would open the
            # context anew (protocol: text for an unknown id starts it), muddling the count.
            ctx = await conn.start(prefix=f"a{index}-")
            await ctx.wait_started()
            if ctx.error is None:
                await ctx.text(text)
                await ctx.end()
            if not await ctx.wait_finished(opts.turn_timeout_s):
                stats.timeouts += 1
                await ctx.cancel()
                await ctx.wait(lambda c: c.ack is not None, 5.0)
                continue
            if ctx.refused:
                stats.refused += 1
                await asyncio.sleep(int(ctx.error.get("retry_after_ms", 1000)) / 1000)
                continue
            if ctx.error is not None or not ctx.frames:
                stats.error(ctx.error.get("code", "unknown") if ctx.error else "no_audio")
                continue
            played = _record(stats, ctx, opts)
            if time.perf_counter() >= deadline:
                break
            # The next turn comes after the caller has heard this one and answered briefly. A
            # batch server's burst must not let its agents talk faster than real time.
            until_heard = (played.ended_at or 0.0) - time.perf_counter()
            await asyncio.sleep(max(0.0, until_heard) + rng.uniform(*opts.pause_s))
    except WireError:
        stats.error("connection")
    finally:
        await conn.close()
    return stats


def _record(stats: AgentStats, ctx: Ctx, opts: LoadOptions) -> PlayerResult:
    stats.turns += 1
    stats.ttfb_s.append(ctx.ttfb_s or 0.0)
    stats.gaps_s.extend(gaps([f.t for f in ctx.frames]))
    played = simulate([Arrival(f.t, ctx.frame_s(f)) for f in ctx.frames], opts.prebuffer_s)
    stats.audio_s += played.audio_s
    stats.underruns += played.underruns
    stats.underrun_s += played.underrun_s
    return played


def summarize_level(
    streams: int, agents: Sequence[AgentStats], wall_s: float, cpu_s: float | None, capacity: Sequence[int] = ()
) -> dict:
    """One level's figures (stable JSON names) from its agents' stats."""
    ttfb = [1000 * t for a in agents for t in a.ttfb_s]
    gap = [1000 * g for a in agents for g in a.gaps_s]
    n = max(1, len(agents))
    audio = sum(a.audio_s for a in agents)
    refused = sum(a.refused for a in agents)
    errors = sum(a.errors for a in agents)
    timeouts = sum(a.timeouts for a in agents)
    underruns = sum(a.underruns for a in agents)
    turns = sum(a.turns for a in agents)
    codes: dict[str, int] = {}
    for a in agents:
        for code, k in a.error_codes.items():
            codes[code] = codes.get(code, 0) + k
    level = {
        "streams": streams,
        "turns": turns,
        "refused": refused,
        "errors": errors,
        "error_codes": codes,
        "timeouts": timeouts,
        "ttfb_ms_p50": rnd(percentile(ttfb, 50)),
        "ttfb_ms_p95": rnd(percentile(ttfb, 95)),
        "ttfb_ms_p99": rnd(percentile(ttfb, 99)),
        "gap_ms_p95": rnd(percentile(gap, 95)),
        "underruns": rnd(underruns / n, 2),  # per stream
        "underrun_ms": rnd(sum(1000 * a.underrun_s for a in agents) / n),  # per stream
        "underrun_ms_max": rnd(max((1000 * a.underrun_s for a in agents), default=0.0)),
        "streams_with_underruns": sum(1 for a in agents if a.underruns),
        "audio_s": rnd(audio, 2),
        "wall_s": rnd(wall_s, 2),
        "rtf": rnd(audio / wall_s if wall_s > 0 else None, 3),
        "cpu_pct": rnd(None if cpu_s is None else 100 * cpu_s / wall_s),
        # server CPU seconds per second of audio delivered: what a whole render is compared on
        "cpu_s_per_audio_s": rnd(None if cpu_s is None or audio <= 0 else cpu_s / audio, 4),
        # /readyz capacity_streams sampled each second of the level (median; None: no /readyz)
        "capacity_streams": percentile(list(capacity), 50) if capacity else None,
        "ttfb_samples_ms": [rnd(x) for x in sorted(ttfb)],
    }
    level["healthy"] = healthy(level)
    return level


def healthy(level: dict, ttfb_ms: float = TTFB_HEALTHY_MS) -> bool:
    """p95 TTFB within ``ttfb_ms``, no underrun after the first frame, nobody refused or failed."""
    p95 = level.get("ttfb_ms_p95")
    return (
        level.get("turns", 0) > 0
        and p95 is not None
        and p95 <= ttfb_ms
        and level.get("underruns", 0) == 0
        and level.get("refused", 0) == 0
        and level.get("errors", 0) == 0
        and level.get("timeouts", 0) == 0
    )


def max_healthy_streams(levels: Sequence[dict], ttfb_goal_ms: float | None = None) -> int:
    """The largest level such that it and every smaller level tested were healthy (0: none).

    ``ttfb_goal_ms``: healthy with that TTFB p95 limit in place of :data:`TTFB_HEALTHY_MS` (the
    GPU figure is quoted at 150 ms): the same rule, so a sweep has one notion of "holds N streams".
    """
    best = 0
    for level in sorted(levels, key=lambda lv: lv["streams"]):
        if not (level["healthy"] if ttfb_goal_ms is None else healthy(level, ttfb_goal_ms)):
            break
        best = level["streams"]
    return best


async def run_level(url: str, streams: int, opts: LoadOptions, progress: Progress) -> dict:
    base = http_base(url)
    cpu0 = await asyncio.to_thread(cpu_seconds, base)
    stagger = min(2.0, 0.125 * (streams - 1)) if opts.stagger_s is None else opts.stagger_s
    t0 = time.perf_counter()
    deadline = t0 + stagger + opts.seconds
    async with aiohttp.ClientSession() as session:
        tasks = [
            asyncio.create_task(_agent(i, url, session, i * stagger / streams, deadline, opts)) for i in range(streams)
        ]
        capacity: list[int] = []
        sampled = t0
        while not all(t.done() for t in tasks):
            elapsed = time.perf_counter() - t0
            phase = "talking" if elapsed < stagger + opts.seconds else "finishing turns"
            progress(f"{streams} streams: {elapsed:4.0f} s, {phase}")
            if time.perf_counter() - sampled >= 1.0:
                sampled = time.perf_counter()
                value = await asyncio.to_thread(capacity_streams, base)
                if value is not None:
                    capacity.append(value)
            await asyncio.wait(tasks, timeout=0.5)
        agents = [t.result() for t in tasks]
    wall = time.perf_counter() - t0
    cpu1 = await asyncio.to_thread(cpu_seconds, base)
    cpu = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
    return summarize_level(streams, agents, wall, cpu, capacity)


async def run_load(url: str, opts: LoadOptions, progress: Progress) -> dict:
    levels = []
    for streams in opts.levels:
        levels.append(await run_level(url, streams, opts, progress))
        await asyncio.sleep(opts.settle_s)
    return {"levels": levels, "max_healthy_streams": max_healthy_streams(levels)}
