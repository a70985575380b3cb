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
ENDED = [
    "What is the capital of France?",
    "Yes.",
    "Thank you very much.",
    "742.",
    "Could you send me?",
    "My order number is 7-429.",  # Whisper's digits end the sentence, not the "is" before them
]


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
    assert TurnJudge(continuing_s=0.9, sentence_s=0.3, other_s=0.5, unlikely_s=0.7).worst_s == 0.9
    with pytest.raises(ValueError, match="continuing_s must be between 0 and 3 s"):
        TurnJudge(continuing_s=-1)
    with pytest.raises(ValueError, match="trust_acoustic must be a probability"):
        TurnJudge(trust_acoustic=1.5)


def test_the_words_end_shortens_or_lengthens_the_wait() -> None:
    judge = TurnJudge()
    assert judge.wait_s("What is the capital of France?", text_complete=0.8) == judge.likely_s
    assert judge.wait_s("Could you send me?", text_complete=0.001) == judge.unlikely_s  # the mark says ended
    assert judge.wait_s("Sure.", text_complete=0.001) == judge.between_s  # a short answer is not unfinished
    assert judge.wait_s("I need to cancel.", text_complete=0.3) == judge.between_s
    assert judge.wait_s("I need to cancel.") == judge.sentence_s  # no text model: the mark
    assert judge.wait_s("My order number is", text_complete=0.9) == judge.continuing_s  # the cue wins
    assert judge.worst_s == max(judge.continuing_s, judge.unlikely_s)
    with pytest.raises(ValueError, match="text_unlikely <= text_likely"):
        TurnJudge(text_likely=0.1, text_unlikely=0.2)


@pytest.mark.parametrize("text", ["No.", "yes please", "Sure, thanks.", "Okay"])
def test_short_answers(text: str) -> None:
    from pipelines.turn_judge import short_answer

    assert short_answer(text)
    assert not short_answer("No, I wanted the other one") and not short_answer("") and not short_answer("Paris.")


def test_doubted_words_or_a_sure_acoustic_verdict_shorten_an_unfinished_reading_when_asked() -> None:
    """Off by default (the corpus measured no gain: docs/BENCHMARKS.md); when set, a garbled
    transcript that reads unfinished waits ``between_s``, a clearly decoded one still ``unlikely_s``."""
    garbled = "Can you explain how to cook a simple manual tube?"  # the phone line's "vegetable soup"
    plain = TurnJudge(doubt_words=None)  # ten words: the long-turn check alone would shorten it
    assert plain.wait_s(garbled, 0.95, 0.001, -1.2) == plain.unlikely_s  # the defaults ignore both
    doubting = TurnJudge(doubt_logprob=-0.8, doubt_words=None)
    assert doubting.wait_s(garbled, None, 0.001, words_logprob=-1.2) == doubting.between_s
    assert doubting.wait_s(garbled, None, 0.001, words_logprob=-0.3) == doubting.unlikely_s
    assert doubting.wait_s(garbled, None, 0.001) == doubting.unlikely_s  # confidence unknown
    rescuing = TurnJudge(rescue_acoustic=0.9, doubt_words=None)
    assert rescuing.wait_s(garbled, 0.95, 0.001) == rescuing.between_s
    assert rescuing.wait_s(garbled, 0.5, 0.001) == rescuing.unlikely_s
    assert rescuing.wait_s("I would like to", 0.99, 0.001) == rescuing.continuing_s  # the cue still wins
    with pytest.raises(ValueError, match="doubt_logprob is a log-probability"):
        TurnJudge(doubt_logprob=0.5)
    with pytest.raises(ValueError, match="rescue_acoustic must be a probability"):
        TurnJudge(rescue_acoustic=2.0)


def test_a_long_turn_read_as_unfinished_waits_between_not_unlikely() -> None:
    """On by default (docs/BENCHMARKS.md, the long asks): ten words or more that the text model
    reads as unfinished are more likely a garble than a caller mid-thought; a short one still
    waits ``unlikely_s``, and a trailing "to" still ``continuing_s`` however long the turn."""
    judge = TurnJudge()
    long_garble = "Please tell me everything I should know before I'm not."  # 10 words, a long ask misheard
    assert judge.wait_s(long_garble, None, 0.001) == judge.between_s
    assert judge.wait_s("I need to cancel.", None, 0.001) == judge.unlikely_s
    assert judge.wait_s("Please tell me everything I should know before I go and want to", None, 0.001) == (
        judge.continuing_s
    )
    assert TurnJudge(doubt_words=None).wait_s(long_garble, None, 0.001) == judge.unlikely_s
    assert TurnJudge(doubt_words=11).wait_s(long_garble, None, 0.001) == judge.unlikely_s
    with pytest.raises(ValueError, match="doubt_words must be a count"):
        TurnJudge(doubt_words=0)


def test_a_question_mark_shortens_an_unfinished_reading_only_when_asked() -> None:
    """Off by default: on the corpus Whisper writes "?" in mid-thought pauses too ("Could you send
    me?"), and trusting it cut 8-9 of 42 pauses instead of 3-5 (docs/BENCHMARKS.md)."""
    garbled = "How do I plan a merc-day party for 20 people on a mer-hit?"
    plain = TurnJudge(doubt_words=None)  # twelve words: the long-turn check alone would shorten it
    assert plain.wait_s(garbled, None, 0.001) == plain.unlikely_s
    asking = TurnJudge(question_ends=True, doubt_words=None)
    assert asking.wait_s(garbled, None, 0.001) == asking.between_s
    assert asking.wait_s("I need to cancel.", None, 0.001) == asking.unlikely_s  # not a question
    assert asking.wait_s("Could you send me the", None, 0.9) == asking.continuing_s  # the cue still wins


def test_a_long_turn_closed_as_a_sentence_on_a_continuing_word_can_be_read_as_any_sentence() -> None:
    """``doubt_continuing`` (on by default): "…before I turn on." (Whisper's "adopt a dog") ends on a
    word the cue takes for more to come, and waited ``continuing_s`` in long calls; with the option
    the text model judges it as any long sentence. Short turns, and a trailing comma or ellipsis,
    still wait."""
    judge = TurnJudge(doubt_continuing=False)
    on = TurnJudge()
    garble = "Please tell me everything I should know before I turn on."
    assert judge.wait_s(garble, None, 0.001) == judge.continuing_s
    assert on.wait_s(garble, None, 0.001) == on.between_s  # long, read unfinished: the doubt's wait
    assert on.wait_s(garble, None, 0.9) == on.likely_s
    assert on.wait_s("I would like to go to.", None, 0.001) == on.continuing_s  # short: may be mid-thought
    assert on.wait_s("Please tell me everything I should know before I turn on,", None, 0.9) == on.continuing_s
    assert on.wait_s("Please tell me everything I should know before I turn on...", None, 0.9) == on.continuing_s
    assert TurnJudge(doubt_continuing=True, doubt_words=None).wait_s(garble, None, 0.9) == on.continuing_s
