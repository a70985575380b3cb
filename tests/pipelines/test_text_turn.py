"""The caller's words as an end-of-turn signal (``pipelines.text_turn``), with the real SmolLM2.

The pairs are Whisper's transcripts of the caller corpus at a pause and at the turn's end
(``scripts/end_of_turn.py --judge``): a phrase that needs more words must score far below the
finished sentence, and the clearest cases must fall on their side of the judge's thresholds.
"""

from __future__ import annotations

import asyncio
import math

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


# A read in a shared pass may differ from the same read alone by the kernels' rounding (their sums
# run over another number of rows; bf16 activations on AVX2 moved one read 0.06 nats on an AMD EPYC),
# never by what the read sees: a branch that saw another's words moves by nats, not hundredths.
SAME_READ_NATS = 0.15


def same_reads(got: list[float | None], alone: list[float | None]) -> bool:
    """Each read within ``SAME_READ_NATS`` of its read alone, on the log-odds the judge thresholds."""

    def logit(p: float) -> float:
        p = min(max(p, 1e-9), 1 - 1e-9)
        return math.log(p / (1 - p))

    return len(got) == len(alone) and all(
        a is not None and b is not None and abs(logit(a) - logit(b)) <= SAME_READ_NATS for a, b in zip(got, alone)
    )


FOUR = [
    "What is the capital of France?",
    "Could you send me",
    "I need to cancel my appointment on Tuesday.",
    "um, I'd like to",
]


def test_reads_judged_together_equal_each_read_alone(words) -> None:
    """Several calls pausing at once share one pass (``Llama.branches``): each read must score as it
    does alone, and the pass must leave the cached prompt as it was."""
    alone = [words.p_end(t) for t in FOUR]
    together = words.p_end_many([*FOUR, "", "  ... "])
    assert together[4:] == [None, None]
    assert same_reads(together[:4], alone), (together[:4], alone)
    assert words.p_end(FOUR[0]) == pytest.approx(alone[0], rel=1e-3)


def test_reads_asked_for_while_one_runs_go_in_the_next_pass(words) -> None:
    """Four calls ask at once while the model is busy: they must not queue one pass each."""
    alone = [words.p_end(t) for t in FOUR]
    before = len(words.batches)

    async def ask() -> list[float | None]:
        with words._lock:  # the model busy with another read: the four queue meanwhile
            tasks = [asyncio.ensure_future(words.p_end_async(t)) for t in FOUR]
            await asyncio.sleep(0.2)
        return await asyncio.gather(*tasks)

    got = asyncio.run(ask())
    passes = list(words.batches)[before:]
    assert sum(passes) == 4 and max(passes) >= 3, passes
    assert same_reads(got, alone), (got, alone)


def test_a_read_given_up_while_queued_does_not_stop_the_next(words) -> None:
    """A call's read is cancelled while it waits (the caller spoke again): the worker must skip it
    and go on serving the other calls, then and later."""

    async def ask() -> list[float | None]:
        with words._lock:
            dropped = asyncio.ensure_future(words.p_end_async("Could you send me"))
            kept = asyncio.ensure_future(words.p_end_async(FOUR[0]))
            await asyncio.sleep(0.1)
            dropped.cancel()
            await asyncio.sleep(0.1)
        return [await asyncio.wait_for(kept, 30), await asyncio.wait_for(words.p_end_async(FOUR[2]), 30)]

    got = asyncio.run(ask())
    assert same_reads(got, [words.p_end(FOUR[0]), words.p_end(FOUR[2])]), got
