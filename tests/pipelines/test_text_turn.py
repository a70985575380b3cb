"""The caller's words as an end-of-turn signal (``pipelines.text_turn``), with the real SmolLM2.

The pairs are Whisper's transcripts of the caller corpus at a pause and at the turn's end
(``scripts/end_of_turn.py --judge``): a phrase that needs more words must score far below the
finished sentence, and the clearest cases must fall on their side of the judge's thresholds.
"""

from __future__ import annotations

import asyncio

import pytest

from pipelines.turn_judge import TurnJudge

PAIRS = [  # (a caller going on, the same caller finished)
    ("Could you send me?", "Could you send me the invoice for last month?"),
    ("Can you tell me?", "Can you tell me what time the pharmacy opens tomorrow?"),
    ("I need to cancel.", "I need to cancel my appointment on Tuesday."),
    ("My order number is", "My order number is 7429."),
]


@pytest.fixture(scope="module")
def words():
    from pipelines.text_turn import shared_text_turn

    return shared_text_turn(progress=lambda line: None)


@pytest.mark.parametrize(("going_on", "finished"), PAIRS)
def test_an_unfinished_phrase_scores_below_the_finished_sentence(words, going_on: str, finished: str) -> None:
    assert words.p_end(going_on) < 0.5 * words.p_end(finished), (words.p_end(going_on), words.p_end(finished))


def test_the_clearest_cases_fall_on_their_side_of_the_judges_thresholds(words) -> None:
    judge = TurnJudge()
    for text in ("Could you send me?", "Can you tell me", "I need to cancel."):
        assert words.p_end(text) < judge.text_unlikely, text
    for text in ("What is the capital of France?", "Can you tell me the capital of Italy?"):
        assert words.p_end(text) >= judge.text_likely, text


def test_the_cached_prompt_is_not_disturbed_by_earlier_words(words) -> None:
    first = words.p_end("What time does the pharmacy open tomorrow?")
    words.p_end("So I was thinking maybe, um, the blue one, or the other one, I am not sure really")
    assert words.p_end("What time does the pharmacy open tomorrow?") == pytest.approx(first, rel=1e-3)


def test_nothing_to_judge_and_a_long_greeting(words) -> None:
    assert words.p_end("") is None and words.p_end("  ... ") is None
    long = "Hello there, I have been a customer for many years and " * 30 + "I wanted to ask about my bill."
    p = words.p_end(long)  # judged by its last words: the prompt stays inside the model's small cache
    assert p is not None and 0.0 <= p <= 1.0


def test_from_the_event_loop(words) -> None:
    assert asyncio.run(words.p_end_async("What is the capital of France?")) >= TurnJudge().text_likely
