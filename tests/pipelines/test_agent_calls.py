"""Calls at once through the real demo (``scripts/agent_calls.py``, issue 22 part 5).

The figures (voice-to-voice per call at 1-4 calls, the proposed ``STREAMVOX_MAX_CALLS``) are the
script's, in docs/BENCHMARKS.md; a loaded test machine cannot hold the 1.5 s bound. What this
holds on any machine: two phone callers who ask at the same moment are both answered, within a
generous 10 s, by the demo as a user starts it (its own TTS server and local LLM). The cap rule
and the log parsing are checked alone.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from support.scripts import load_script

agent_calls = load_script("agent_calls")


def _level(n: int, p95: float | None, no_answer: int = 0) -> dict:
    return {"n": n, "summary": {"v2v_p95_s": p95, "no_answer": no_answer}}


def test_the_cap_is_the_largest_level_within_the_bound_with_every_call_answered() -> None:
    cap = agent_calls.proposed_cap
    assert cap([_level(1, 0.9), _level(2, 1.2), _level(3, 1.49), _level(4, 1.8)]) == 3
    assert cap([_level(1, 0.9), _level(2, 1.6), _level(3, 1.4)]) == 1  # no skipping a level that failed
    assert cap([_level(1, 0.9), _level(2, 1.0, no_answer=1)]) == 1  # an unanswered call fails its level
    assert cap([_level(1, 1.7)]) is None


def test_the_agents_stage_lines_are_read_from_its_log() -> None:
    log = (
        "07:06:10 | INFO | pipelines.pipecat_figures:... - turn 1: ms after the caller's speech end in the audio "
        "received: VAD stop +285, STT final +740, end of turn +741, LLM first token +988; TTS first text -> "
        "first audio 90 ms; transcript decoded before the VAD's stop\n"
        "turn 2: ms after the caller's speech end as the VAD presumes: VAD stop +301, STT final +760\n"
        "barge-in 1: ms after the caller's speech onset as the VAD presumes: VAD start +120\n"
    )
    stages = agent_calls.stage_medians(log)
    assert stages == {"VAD stop": 293.0, "STT final": 750.0, "end of turn": 741.0, "LLM first token": 988.0}
    assert agent_calls.early_decodes(log) == [1, 2]  # the barge-in line is not a turn


def test_the_replies_words_are_read_from_the_frame_log(tmp_path) -> None:
    """Two calls' responses interleaved, as the agent's frame log writes them (a torn last line too)."""
    log = tmp_path / "frames.jsonl"
    events = [
        ("a", "LLMFullResponseStartFrame", None),
        ("a", "LLMTextFrame", "Sure,"),
        ("b", "LLMFullResponseStartFrame", None),
        ("a", "LLMTextFrame", " knead it."),
        ("b", "LLMTextFrame", "Paris."),
        ("b", "LLMFullResponseEndFrame", None),
        ("a", "TTSFirstAudio", None),
        ("a", "LLMFullResponseEndFrame", None),
        ("a", "LLMFullResponseStartFrame", None),  # never ended (the call was cut): not a reply
    ]
    lines = [
        json.dumps({"call": c, "t": i / 10, "frame": f, **({"text": x} if x else {})})
        for i, (c, f, x) in enumerate(events)
    ]
    log.write_text("\n".join(lines) + '\n{"call": "a", "fra')
    replies = agent_calls.llm_replies(log)
    assert [(r["call"], r["text"]) for r in replies] == [("b", "Paris."), ("a", "Sure, knead it.")]
    assert agent_calls.llm_replies(tmp_path / "none.jsonl") == []


def test_a_slow_turn_of_a_long_call_says_where_it_waited(tmp_path) -> None:
    """The frame log's turns are matched to the caller's answered turns in order, and only the slow
    ones are listed with their stages; when the counts disagree nothing is attributed."""
    log = tmp_path / "frames.jsonl"
    events = []
    for i, (text, end) in enumerate([("What is the capital of France?", 0.2), ("Before I adopt a", 1.5)]):
        t0 = 10.0 * i
        events += [
            (t0, "VADUserStoppedSpeakingFrame", None),
            (t0 + 0.25, "TranscriptionFrame", text),
            (t0 + 0.25 + end, "UserStoppedSpeakingFrame", None),
            (t0 + 0.3, "LLMTextFrame", "Sure."),
            (t0 + 0.6 + end, "TTSFirstAudio", None),
            (t0 + 0.65 + end, "BotStartedSpeakingFrame", None),
        ]
    lines = [json.dumps({"call": "a", "t": t, "frame": f, **({"text": x} if x else {})}) for t, f, x in events]
    log.write_text("\n".join(lines) + '\n{"call": "a", "t": 30.0, "fra')  # cut short as the demo stopped
    stages = agent_calls.frame_stages(log)
    assert [(st["text"], st["end_of_turn"]) for st in stages] == [
        ("What is the capital of France?", 450),
        ("Before I adopt a", 1750),
    ]
    turns = [{"turn": 1, "v2v_s": 0.9}, {"turn": 2, "v2v_s": None}, {"turn": 3, "v2v_s": 2.1}]
    slow = agent_calls.slow_stages(turns, stages)
    assert [(st["turn"], st["text"]) for st in slow] == [(3, "Before I adopt a")]
    assert agent_calls.slow_stages([*turns, {"turn": 4, "v2v_s": 1.0}], stages) == []  # 3 answered, 2 in the log
    assert agent_calls.frame_stages(tmp_path / "none.jsonl") == []


def test_a_child_that_died_during_a_level_is_reported() -> None:
    log = (
        "pipecat_agent: ready\n"
        "pipecat_agent: the local LLM exited (signal 11); restarting it in 0.5 s\n"
        "pipecat_agent: the TTS server has not answered /healthz for 20 s (hung); killing it\n"
        "turn 1: ms after the caller's speech end: VAD stop +285\n"
    )
    assert agent_calls.child_exits(log) == log.splitlines()[1:3]
    assert agent_calls.child_exits("pipecat_agent: ready\n") == []


def test_memory_is_charged_to_the_part_that_holds_it() -> None:
    """A child whose command line names the local LLM is counted as "llm", this process as the agent."""
    hold = "import time; x = b'x' * (64 << 20); time.sleep(30)"  # written pages: resident
    child = subprocess.Popen([sys.executable, "-c", hold, "local_llm"])
    try:
        deadline = time.monotonic() + 10
        while (parts := agent_calls.tree_rss_parts(os.getpid())).get("llm", 0) < 60 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert set(parts) >= {"agent", "llm"} and parts["llm"] >= 60, parts  # the 64 MiB it holds
        assert abs(sum(parts.values()) - agent_calls.tree_rss_mb(os.getpid())) < 0.2 * sum(parts.values())
    finally:
        child.kill()
        child.wait()


def test_cpu_is_charged_to_the_part_that_spends_it() -> None:
    """A busy child named like the TTS server shows as about one core of "tts"; an idle one as none."""
    spin = "import time\nend = time.monotonic() + 1.5\nwhile time.monotonic() < end: pass"
    busy = subprocess.Popen([sys.executable, "-c", spin, "tts_service"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)", "local_llm"])
    try:
        time.sleep(0.3)  # both started (the interpreter's own start-up is CPU too)
        before, t0 = agent_calls.tree_cpu_parts(os.getpid()), time.monotonic()
        time.sleep(1.0)
        shares = agent_calls.cpu_shares(before, agent_calls.tree_cpu_parts(os.getpid()), time.monotonic() - t0)
        # generous: beside two other test workers on two cores the spinning child got 0.42 of one
        assert shares["tts"] > 0.15 > shares["llm"], shares
        assert {"agent", "callers"} <= set(shares)
    finally:
        for p in (busy, idle):
            p.kill()
            p.wait()


@pytest.mark.slow
def test_two_phone_callers_asking_at_once_are_both_answered_by_the_real_demo() -> None:
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng not installed (make system-deps)")
    lines = agent_calls.first_lines()
    demo = agent_calls.Demo(max_calls=2)
    try:
        demo.start()
        result = asyncio.run(agent_calls.one_round(demo, 2, 0, lines))
    finally:
        demo.stop()
    calls = result["calls"]
    assert [c["hung_up"] for c in calls] == [False, False], calls
    assert all(c["greeting_s"] is not None for c in calls), calls  # each heard the greeting
    assert all(c["v2v_s"] is not None and 0 < c["v2v_s"] < 10.0 for c in calls), calls
    assert max(c["spoke_after_first_s"] for c in calls) < 0.1, calls  # they did ask at the same moment


def test_the_tts_soak_replies_are_long_varied_and_the_same_every_run() -> None:
    tts_soak = load_script("tts_soak")
    texts = tts_soak.replies(20)
    assert texts == tts_soak.replies(20) and len(set(texts)) == 20
    assert all(t.endswith(".") for t in texts) and min(len(t) for t in texts) > 150  # many sentences each
