"""The end-of-turn judge's rule (``pipelines.turn_judge``) on transcripts as Whisper wrote them.

The strings are what Whisper tiny.en made of the caller corpus's segments at a VAD stop (the
corpus script, ``scripts/end_of_turn.py --judge``): the rule must read a phrase that stops on a
function word, a dash, a comma or an ellipsis as a caller going on, and anything else by its mark.
"""

from __future__ import annotations

import pytest

from pipelines.turn_judge import TurnJudge, cue

GOING_ON = [
    "I'd like to...",
    "My order number is...",
    "and the other is...",
    "So I was thinking maybe.",  # Whisper's full stop after a trailing "maybe"
    "I would like to.",
    "My order number is 7-",
    "Then...",
    "um",
    "what I really wanted to ask was",
]
ENDED = ["What is the capital of France?", "Yes.", "Thank you very much.", "742.", "Could you send me?"]


@pytest.mark.parametrize("text", GOING_ON)
def test_a_trailing_phrase_is_a_caller_going_on(text: str) -> None:
    assert cue(text) == "continuing"
    assert TurnJudge().wait_s(text, acoustic_complete=0.99) == TurnJudge().continuing_s  # the text wins


@pytest.mark.parametrize("text", ENDED)
def test_a_sentence_waits_the_sentence_silence(text: str) -> None:
    judge = TurnJudge(sentence_s=0.4, other_s=0.7)
    assert cue(text) == "sentence" and judge.wait_s(text) == 0.4


def test_no_mark_and_no_text_wait_the_other_silence() -> None:
    judge = TurnJudge(other_s=0.5)
    assert cue("12 bulk treat") == cue("") == "none"
    assert judge.wait_s("12 bulk treat") == judge.wait_s("") == 0.5


def test_the_acoustic_verdict_counts_only_when_trusted() -> None:
    assert TurnJudge().wait_s("I need to cancel.", acoustic_complete=0.98) == 0.6  # off by default
    trusting = TurnJudge(trust_acoustic=0.95)
    assert trusting.wait_s("I need to cancel.", acoustic_complete=0.98) == 0.0
    assert trusting.wait_s("I need to cancel.", acoustic_complete=0.5) == 0.6
    assert trusting.wait_s("I need to cancel.", acoustic_complete=None) == 0.6


def test_the_worst_case_is_the_longest_wait_and_bad_settings_are_refused() -> None:
    assert TurnJudge(continuing_s=0.9, sentence_s=0.3, other_s=0.5).worst_s == 0.9
    with pytest.raises(ValueError, match="continuing_s must be between 0 and 3 s"):
        TurnJudge(continuing_s=-1)
    with pytest.raises(ValueError, match="trust_acoustic must be a probability"):
        TurnJudge(trust_acoustic=1.5)
