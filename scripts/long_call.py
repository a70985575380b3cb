"""A long call through the real local LLM: per-turn first-token time, old vs new trim, one run.

Issue 22: from turn 14 of a 42-turn call about every 4th turn had seconds of dead air, the
local LLM re-reading its trimmed history (a 2,048-token cache). This drives
``python -m pipelines.local_llm`` (a child process, as the demo starts it) through its HTTP
endpoint with one scripted 60-turn call: the demo's system prompt, callers' turns of ~60
tokens, streamed replies of up to ``--max-tokens``, each reply kept in the history as the agent
keeps it. Each configuration gets a fresh server and the same call:

* ``before``: ``--max-len 2048 --trim reread`` (the old defaults);
* ``after``: the defaults (the model's own context, the cache follows a trim);
* ``8k-reread`` (with ``--configs``): the full context, re-reading on a trim.

Per turn: first token (request sent -> first content chunk), prompt tokens, tokens read
(prompt - ``usage.prompt_tokens_details.cached_tokens``), the server's RSS. Summary: median and
p95 (nearest rank) over turns 1-10 and 50-60, the worst turn, turns over 1 s.

``--calls N``: instead, N callers' first turns sent at once (``--rounds`` times, a fresh
conversation each round), against ``--concurrent 1`` (one request at a time, as before issue 22
part 5) and the default (interleaved): each call's first-token time, sorted.

    .venv/bin/python scripts/long_call.py --json out/long_call.json
    .venv/bin/python scripts/long_call.py --calls 4 --json out/four_calls.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipelines.persona import SYSTEM_PROMPT  # noqa: E402
from tts_service.localproc import free_port  # noqa: E402

CONFIGS = {
    "before": ["--max-len", "2048", "--trim", "reread"],
    "after": [],
    "8k-reread": ["--trim", "reread"],
    "2k-shift": ["--max-len", "2048"],
}
CALL_CONFIGS = {"one-at-a-time": ["--concurrent", "1"], "interleaved": []}
FIRST_TURNS = [
    "Hi! Where is my order? I placed it last week.",
    "Hello, can you help me book a table for four tonight?",
    "Good morning. My internet keeps dropping, what should I try?",
    "Hey there, what is a good name for a red boat?",
]
TOPICS = [
    "my parcel that was meant to arrive on Tuesday",
    "the broken heater in the spare bedroom",
    "a refund for the concert tickets I could not use",
    "changing my flight to Lisbon to a later date",
    "the noise from the building site next door",
    "setting up the new router my provider sent me",
    "a bill that charged me twice for the same month",
    "booking a table for eight people on Saturday",
    "the recipe for the lemon cake my aunt used to bake",
    "planning a cycling trip along the river next spring",
]


def caller_turn(i: int) -> str:
    """Turn ``i`` (1-based) of the call: ~60 tokens, a new topic every turn, a name to remember first."""
    if i == 1:
        return "Hello, my name is Zorblax and I am calling about " + TOPICS[0] + ". Can you help me with it today?"
    if i == 60:
        return "Before I hang up, can you remind me what my name is and what I first called about?"
    topic = TOPICS[i % len(TOPICS)]
    return (
        f"Thank you. Next, on turn {i}, I would like to talk about {topic}. I have tried a few things "
        f"already and I am not sure what to do next, so please tell me, in a few sentences, what you "
        f"would suggest and why, and whether there is anything I should avoid."
    )


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _wait_ready(base: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    t0 = time.monotonic()
    async with aiohttp.ClientSession() as s:
        while time.monotonic() - t0 < timeout:
            if proc.poll() is not None:
                raise SystemExit(f"the local LLM exited with {proc.returncode}")
            try:
                async with s.get(f"{base}/v1/models") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.3)
    raise SystemExit("the local LLM did not start in time")


async def _turn(s: aiohttp.ClientSession, base: str, messages: list[dict], max_tokens: int) -> dict:
    body = {
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    first, text, usage = None, [], {}
    async with s.post(f"{base}/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            raise SystemExit(f"HTTP {resp.status}: {await resp.text()}")
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                piece = choice["delta"].get("content")
                if piece:
                    first = first or time.perf_counter()
                    text.append(piece)
    end = time.perf_counter()
    prompt = usage.get("prompt_tokens", 0)
    cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
    return {
        "first_token_s": (first or end) - t0,
        "total_s": end - t0,
        "prompt_tokens": prompt,
        "read_tokens": prompt - cached,
        "completion_tokens": usage.get("completion_tokens", 0),
        "reply": "".join(text),
    }


def _start(port: int, args: list[str], log_file) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pipelines.local_llm", "--port", str(port), *args]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log_file)


async def run_calls(
    name: str, args: list[str], calls: int, rounds: int, max_tokens: int
) -> tuple[list[list[float]], list[list[float]]]:
    """First-token times (s) of ``calls`` first turns sent at once, per round, sorted; and each
    reply's decode rate (tokens/s after its first token, while the others decode too)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile("w+") as log_file:
        proc = _start(port, args, log_file)
        try:
            await _wait_ready(base, proc)
            out, rates = [], []
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as s:
                for r in range(rounds):
                    asks = [
                        [
                            {"role": "system", "content": SYSTEM_PROMPT},
                            {"role": "user", "content": f"{FIRST_TURNS[i % len(FIRST_TURNS)]} (call {r}.{i})"},
                        ]
                        for i in range(calls)
                    ]
                    figures = await asyncio.gather(*(_turn(s, base, m, max_tokens) for m in asks))
                    out.append(sorted(f["first_token_s"] for f in figures))
                    rates.append(
                        [
                            (f["completion_tokens"] - 1) / (f["total_s"] - f["first_token_s"])
                            for f in figures
                            if f["completion_tokens"] > 1 and f["total_s"] > f["first_token_s"]
                        ]
                    )
                    print(
                        f"{name}: round {r + 1}: first tokens "
                        + " / ".join(f"{t * 1000:.0f}" for t in out[-1])
                        + " ms; decode "
                        + " / ".join(f"{x:.1f}" for x in rates[-1])
                        + " tokens/s a reply"
                    )
            return out, rates
        finally:
            _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def run_config(name: str, args: list[str], turns: int, max_tokens: int) -> list[dict]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log_file = tempfile.TemporaryFile("w+")  # the server's log: its trim lines are counted at the end
    proc = _start(port, args, log_file)
    try:
        await _wait_ready(base, proc)
        messages = [{"role": "system", "content": SYSTEM_PROMPT}]
        figures = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as s:
            for i in range(1, turns + 1):
                messages.append({"role": "user", "content": caller_turn(i)})
                f = await _turn(s, base, messages, max_tokens)
                f.update(turn=i, rss_mb=_rss_mb(proc.pid))
                messages.append({"role": "assistant", "content": f["reply"]})
                figures.append(f)
                print(
                    f"{name:9s} turn {i:2d}: first token {f['first_token_s'] * 1000:6.0f} ms, prompt "
                    f"{f['prompt_tokens']:5d}, read {f['read_tokens']:5d}, reply {f['completion_tokens']:3d}, "
                    f"RSS {f['rss_mb']:.0f} MB",
                    flush=True,
                )
        return figures
    finally:
        _stop(proc)
        log_file.seek(0)
        trims = [line for line in log_file.read().splitlines() if "outgrew" in line]
        log_file.close()
        print(f"{name}: {len(trims)} trim lines logged" + (f", last: {trims[-1][-160:]}" if trims else ""))


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def summary(figures: list[dict]) -> dict:
    def span(lo: int, hi: int) -> dict:
        ft = [f["first_token_s"] for f in figures if lo <= f["turn"] <= hi]
        return {"median_ms": statistics.median(ft) * 1000, "p95_ms": _p95(ft) * 1000} if ft else {}

    worst = max(figures, key=lambda f: f["first_token_s"])
    warm = [f["rss_mb"] for f in figures if f["turn"] >= 10]
    return {
        "turns_1_10": span(1, 10),
        "turns_50_60": span(50, 60),
        "worst_ms": worst["first_token_s"] * 1000,
        "worst_turn": worst["turn"],
        "turns_over_1s": sum(f["first_token_s"] > 1.0 for f in figures),
        "max_read_tokens_after_turn_1": max((f["read_tokens"] for f in figures[1:]), default=0),
        "last_prompt_tokens": figures[-1]["prompt_tokens"],
        "rss_mb_turn_10_and_last": [warm[0], warm[-1]] if warm else [],
        "last_reply": figures[-1]["reply"],
    }


async def main_async(args: argparse.Namespace) -> dict:
    results = {}
    if args.calls:
        for name, server_args in CALL_CONFIGS.items():
            rounds, rates = await run_calls(name, server_args, args.calls, args.rounds, args.max_tokens)
            results[name] = {"args": server_args, "first_token_s": rounds, "tokens_per_s": rates}
        return results
    for name in args.configs:
        figures = await run_config(name, CONFIGS[name], args.turns, args.max_tokens)
        results[name] = {"args": CONFIGS[name], "summary": summary(figures), "turns": figures}
        if args.json:  # after each configuration: a long run cut short keeps what it measured
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(results, indent=1))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--max-tokens", type=int, default=96, help="at most this many tokens a reply")
    parser.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=["before", "after"])
    parser.add_argument("--calls", type=int, default=0, help="measure this many first turns at once instead")
    parser.add_argument("--rounds", type=int, default=3, help="with --calls: rounds of simultaneous first turns")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.turns < 2 or args.max_tokens < 1 or args.calls < 0 or args.rounds < 1:
        parser.error("--turns must be >= 2, --max-tokens and --rounds >= 1, --calls >= 0")
    results = asyncio.run(main_async(args))
    if args.calls:
        for name, r in results.items():
            by_rank = [statistics.median(round_[k] for round_ in r["first_token_s"]) for k in range(args.calls)]
            print(
                f"{name}: median over rounds, fastest to slowest call: "
                + " / ".join(f"{t * 1000:.0f}" for t in by_rank)
                + f" ms; decode median {statistics.median(x for rs in r['tokens_per_s'] for x in rs):.1f}"
                + " tokens/s a reply"
            )
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
        return 0
    print()
    print("| config | turns 1-10 median / p95 | turns 50-60 median / p95 | worst (turn) | turns > 1 s | most read |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        s = r["summary"]
        a, b = s["turns_1_10"], s["turns_50_60"]
        print(
            f"| {name} | {a['median_ms']:.0f} / {a['p95_ms']:.0f} ms | "
            + (f"{b['median_ms']:.0f} / {b['p95_ms']:.0f} ms" if b else "-")
            + f" | {s['worst_ms']:.0f} ms ({s['worst_turn']}) | {s['turns_over_1s']}"
            + f" | {s['max_read_tokens_after_turn_1']} |"
        )
        print(
            f"  {name}: RSS turn 10 / last {s['rss_mb_turn_10_and_last']}, last prompt {s['last_prompt_tokens']} tokens"
        )
        print(f"  {name}: last reply: {s['last_reply'][:200]!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
