"""How a browser session's self-interruptions are counted (``harness.Session.self_interruptions``),
on a page record made up here: the rule decides what the echo test and the scenario report, so it
is checked apart from the browser, on the cases that matter (the caller's own late transcript, the
agent's echo heard while the caller speaks, an interruption with the agent silent)."""

from __future__ import annotations

from pathlib import Path

from support.browser import harness as H

PLAN = H.MicPlan(Path("unused.wav"), barge_in=(3.0, 6.0), question=(17.0, 18.5))
MIC_AT = 100.0  # the page's clock when the microphone opened


def _session(rtvi: list[tuple[float, str]], transcript: list[tuple[float, str, str]], **kw) -> H.Session:
    page = {
        "micStartedAt": MIC_AT,
        "rtvi": [{"t": MIC_AT + t, "type": kind} for t, kind in rtvi],
        "transcript": [
            {"t": MIC_AT + t, "who": who, "text": text, "interrupted": False} for t, who, text in transcript
        ],
    }
    return H.Session(page=page, plan=PLAN, **kw)


def test_the_callers_own_turns_are_not_counted() -> None:
    s = _session(
        [(1.0, "bot-started-speaking"), (3.4, "bot-interrupted"), (3.6, "bot-stopped-speaking")],
        [
            (1.2, "agent", "Hello! I am the demo agent."),
            (5.5, "you", "Crane."),  # the caller's words garbled by the browser's echo cancellation
            (9.5, "you", "would rather take the train."),  # late (a loaded machine), but the caller's
            (18.9, "you", "What is the capital of France?"),
        ],
        ended_s=25.0,
    )
    got = s.self_interruptions()
    assert got["count"] == 0 and got["caller_transcripts"] == 3, got
    assert got["session_s"] == 25.0


def test_stops_and_answers_with_the_caller_silent_are_counted() -> None:
    s = _session(
        [
            (1.0, "bot-started-speaking"),
            (1.6, "bot-interrupted"),  # echo of the greeting, caller silent: a stop
            (1.8, "bot-stopped-speaking"),
            (4.0, "bot-interrupted"),  # the caller's barge-in (the agent is silent anyway)
            (10.0, "bot-interrupted"),  # the agent was silent: no stop
            (11.0, "bot-started-speaking"),
            (12.0, "bot-interrupted"),  # a stop
            (12.2, "bot-stopped-speaking"),
            (40.0, "bot-started-speaking"),
            (41.0, "bot-interrupted"),  # after the cut: not counted
        ],
        [
            (1.1, "agent", "I'm sorry for your trouble"),
            (2.5, "you", "Hello!"),  # before the caller spoke: the agent's own greeting
            (8.0, "you", "I'm sorry."),  # in the caller's window, but the agent's words of 7 s ago: echo
            (13.0, "you", "the train"),  # the caller's words, but long after the caller's speech
            (18.0, "agent", "Paris is lovely"),
            (20.0, "you", "Paris is"),  # in the question's window, the agent's words of 2 s ago: echo
            (23.0, "you", "sorry"),  # the agent said it 22 s ago: no longer taken for its echo
            (38.0, "you", "Whatever."),  # after the cut
        ],
        until_s=30.0,
        ended_s=30.0,
    )
    got = s.self_interruptions()
    assert got["stops"] == [1.6, 12.0], got
    assert [a["text"] for a in got["answers"]] == ["Hello!", "I'm sorry.", "the train", "Paris is"], got
    assert got["count"] == 6 and got["caller_transcripts"] == 1 and got["session_s"] == 30.0
