"""The segmenter alone: streaming equals offline, and cuts fall where a listener hears them."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tts_service.segmenter import Segmenter, SegmenterOptions, _leans_forward

PARAGRAPH = (
    "Hello there, my friend. I paid $3.50 to Dr. Smith at example.com on Jan. 5, 2024! "
    "Pi is about 3.14, e.g. in school. J. R. R. Tolkien wrote books (many of them). "
    'Mr. and Mrs. Jones live at 1,000 Main St. in the U.S. now... Really? Yes: "quite so." '
    "Prices rose 5, 10 and 15 percent; nobody noticed — not even Prof. Xavier."
)


def offline(text: str, options: SegmenterOptions | None = None) -> list[str]:
    seg = Segmenter(options or SegmenterOptions())
    return seg.push(text) + seg.flush()


def streamed(pieces: list[str], options: SegmenterOptions | None = None) -> list[str]:
    seg = Segmenter(options or SegmenterOptions())
    out: list[str] = []
    for piece in pieces:
        out += seg.push(piece)
    return out + seg.flush()


def random_pieces(text: str, rng: random.Random, max_len: int = 12) -> list[str]:
    pieces, i = [], 0
    while i < len(text):
        n = rng.randint(1, max_len)
        pieces.append(text[i : i + n])
        i += n
    return pieces


def test_char_by_char_equals_offline() -> None:
    expected = offline(PARAGRAPH)
    assert streamed(list(PARAGRAPH)) == expected
    assert len(expected) >= 6


@pytest.mark.parametrize("seed", range(20))
def test_random_chunks_equal_offline(seed: int) -> None:
    rng = random.Random(seed)
    assert streamed(random_pieces(PARAGRAPH, rng)) == offline(PARAGRAPH)


TOKENS = [
    "word", "a", "Anna", "Dr.", "e.g.", "J.", "U.S.", "3.14", "41,", "5,", "2024", "1,000", "$3.50",
    "example.com", "end.", "stop!", "why?", "so,", "well;", "note:", "—", '"quoted."', "(aside.)", "...", "…",
    "Sure,", "Okay", "Of", "course,", "the", "to", "from", "and", "don't,", '"Well,"',
]  # fmt: skip
TEXT = st.lists(st.tuples(st.sampled_from(TOKENS), st.sampled_from([" ", " ", " ", "", "  ", "\n"])), max_size=40).map(
    lambda parts: "".join(t + sep for t, sep in parts)
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=TEXT, cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=16), data=st.data())
def test_any_split_equals_offline(text: str, cuts: list[int], data: st.DataObject) -> None:
    options = SegmenterOptions(
        first_clause_min_chars=data.draw(st.integers(1, 30)),
        max_chars=data.draw(st.integers(8, 80)),
        first_max_chars=data.draw(st.integers(8, 80)),
        first_clause_floor_chars=data.draw(st.integers(1, 20)),
        min_chars=data.draw(st.integers(1, 4)),
        opening_max_words=data.draw(st.integers(0, 4)),
    )
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    assert streamed(pieces, options) == offline(text, options)
    assert streamed(list(text), options) == offline(text, options)


def test_nothing_is_lost_or_invented() -> None:
    segments = offline(PARAGRAPH)
    assert " ".join(segments).split() == PARAGRAPH.split()


@pytest.mark.parametrize(
    "sentence",
    [
        "Please call Dr. Smith tomorrow morning.",
        "Bring fruit, e.g. apples or pears, to the party.",
        "We met on Jan. 5th at noon.",
        "Pi is roughly 3.14 and that is enough.",
        "Visit example.com for more details.",
        "The book by J. R. R. Tolkien is long.",
        "It costs $3.50 at the U.S. border.",
        "I moved from St. Louis to Mt. Vernon.",
    ],
)
def test_abbreviations_numbers_urls_initials_are_not_cut(sentence: str) -> None:
    text = f"Right. {sentence} And then we left."  # not first: no early clause cut
    assert offline(text) == ["Right.", sentence, "And then we left."]
    assert streamed(list(text)) == ["Right.", sentence, "And then we left."]


def test_sentence_ends_are_cut_once_confirmed() -> None:
    seg = Segmenter()
    assert seg.push("It works.") == []  # "works." might still become "works.com"
    assert seg.push(" Next") == ["It works."]
    assert seg.push(" one? Yes!") == ["Next one?"]
    assert seg.pending == " Yes!"
    assert seg.flush() == ["Yes!"]
    assert seg.flush() == []


def test_closing_quotes_stay_with_their_sentence() -> None:
    assert offline('He said "stop." Then (quietly.) we went.') == ['He said "stop."', "Then (quietly.)", "we went."]


def test_first_segment_is_cut_early_at_a_clause() -> None:
    seg = Segmenter(SegmenterOptions(first_clause_min_chars=24))
    out = seg.push("When the meeting finally ended, everyone went home, tired but happy. ")
    assert out[0] == "When the meeting finally ended,"
    # later segments are cut at sentence ends only
    assert out[1:] == ["everyone went home, tired but happy."]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Well, I think so. Yes.", ["Well,", "I think so.", "Yes."]),
        ("Sure, I can help with that. Your order shipped.", ["Sure,", "I can help with that.", "Your order shipped."]),
        ("Okay, so what now?", ["Okay,", "so what now?"]),
        ("Of course; here it is.", ["Of course;", "here it is."]),
        ("Hmm, let me check. Done.", ["Hmm,", "let me check.", "Done."]),
        ("Great question, it depends.", ["Great question,", "it depends."]),
    ],
)
def test_a_short_opening_clause_is_its_own_segment(text: str, expected: list[str]) -> None:
    assert offline(text) == expected
    assert streamed(list(text)) == expected


def test_an_opening_is_cut_as_soon_as_its_comma_arrives() -> None:
    # First audio waits for one LLM token, not for the next one to confirm the comma.
    seg = Segmenter()
    assert seg.push("Sure") == []
    assert seg.push(",") == ["Sure,"]
    assert seg.push(" I can") == []
    # Only the first clause can be an opening.
    seg = Segmenter()
    assert seg.push("Okay. Well,") == ["Okay."]
    assert seg.push(" then") == []


@pytest.mark.parametrize(
    "text",
    [
        "Prices rose 5, 10 and 15 percent today.",  # a number's comma
        "In 2024, we moved to the coast.",  # a digit before the comma
        '"Well," he said, and left.',  # a quote to close first
        "When I got home, it was dark.",  # four words: a clause, not an opening
    ],
)
def test_what_is_not_an_opening(text: str) -> None:
    first = offline(text)[0]
    assert len(first.split()) > 3, first


def test_openings_can_be_turned_off() -> None:
    assert offline("Well, I think so. Yes.", SegmenterOptions(opening_max_words=0)) == ["Well, I think so.", "Yes."]


def test_the_segment_after_an_opening_is_still_the_head() -> None:
    # Capped like a first segment, so the opening's audio is followed quickly ...
    text = "Sure, I can move your appointment to Thursday at three in the afternoon. And then some more."
    assert offline(text) == [
        "Sure,",
        "I can move your appointment",
        "to Thursday at three in the afternoon.",
        "And then some more.",
    ]
    # ... and cut early at a clause; the segment after that is not the head any more.
    text = "Well, the meeting went on for a while, and then, at last, everyone went home."
    assert offline(text) == ["Well,", "the meeting went on for a while,", "and then, at last, everyone went home."]


def test_number_commas_are_not_clause_boundaries() -> None:
    text = "The invoice was dated on May 5, 2024 and paid late. Ok."
    long_first = SegmenterOptions(first_max_chars=280)
    assert offline(text, long_first)[0] == "The invoice was dated on May 5, 2024 and paid late."
    assert streamed(list(text), long_first) == offline(text, long_first)
    # Capped first segment: the cut still never falls on the number's comma.
    assert not offline(text)[0].endswith("5,")


@pytest.mark.parametrize(
    ("text", "first"),
    [
        # at a phrase boundary (before a preposition or conjunction), the modifier kept with its noun
        ("I found three flights to Denver tomorrow morning, and the earliest one leaves.", "I found three flights"),
        ("So you would like a table for four people on Saturday evening.", "So you would like a table"),
        ("I have moved your booking to next Monday at noon.", "I have moved your booking"),
        ("Your flight is on time and boarding starts forty minutes before departure.", "Your flight is on time"),
        # no phrase boundary: a word boundary that does not strand a function word
        ("Please remember your passport and your ticket tomorrow.", "Please remember your passport"),
        ("Seventeen enormous elephants quietly wandered northwards today.", "Seventeen enormous elephants quietly"),
    ],
)
def test_a_long_first_clause_is_capped_without_stranding_a_word(text: str, first: str) -> None:
    # TTFB: the first segment's front part runs before any audio, so it is kept short.
    assert offline(text)[0] == first
    assert streamed(list(text))[0] == first


def test_a_short_clause_inside_the_cap_is_preferred_over_a_word_cut() -> None:
    assert offline("Hello there, my friend, how are you doing today?") == [
        "Hello there,",
        "my friend, how are you doing today?",
    ]
    text = "Early yesterday at noon, my friend, we all went to the market by the river."
    assert offline(text)[0] == "Early yesterday at noon, my friend,"
    # later segments are not capped
    assert offline("Okay. " + "This second sentence is much longer than forty characters in all.")[1].endswith("all.")


def test_max_chars_cuts_at_a_word_boundary() -> None:
    options = SegmenterOptions(max_chars=40)
    text = " ".join(["word"] * 30)
    segments = streamed(list(text), options)
    assert segments == offline(text, options)
    assert all(len(s) <= 40 for s in segments)
    assert all(s.split() == ["word"] * len(s.split()) for s in segments)  # no word cut in half
    assert " ".join(segments) == text
    # one unbroken "word" longer than max_chars is cut hard
    assert offline("x" * 100, options)[0] == "x" * 40


def test_flush_cuts_everything() -> None:
    seg = Segmenter()
    assert seg.push("no punctuation yet and a number 3.") == []
    assert seg.flush() == ["no punctuation yet and a number 3."]
    assert seg.pending == ""
    assert seg.push("   ") == [] and seg.flush() == []  # whitespace is not a segment


def test_fragments_below_min_chars_wait() -> None:
    assert offline("A. B. Cat sat.", SegmenterOptions(min_chars=3)) == ["A. B. Cat sat."]


@pytest.mark.parametrize(
    ("pending", "cut", "left"),
    [
        ("I think that the best way to go abo", "I think that the best way to go", "abo"),  # unfinished word kept
        ("Your order shipped yesterday from our ", "Your order shipped yesterday", "from our "),
        ("Your flight is on", "Your flight", "is on"),  # as early as a cut after "is", only shorter
        ("I found three hotels near the", "I found three hotels", "near the"),
        ("I found three ", "I found", "three "),  # a modifier waits for its noun
        ("Well I want the cheapest ", "Well I want", "the cheapest "),  # a superlative too
        ("and it should arrive", "", "and it should arrive"),  # a modal: "arrive" may still grow
        ("and breakfast has ", "and breakfast", "has "),
        ("and it is the ", "", "and it is the "),  # nothing but function words: wait
        ("Well then", "", "Well then"),  # too few whole words
    ],
)
def test_cut_words_does_not_strand_a_function_word(pending: str, cut: str, left: str) -> None:
    # The scheduler's cut when a slow LLM would leave the listener in silence.
    seg = Segmenter()
    assert seg.push(pending) == []
    assert seg.cut_words(3) == ([cut] if cut else [])
    assert seg.pending == left


def _word_cut_then(pending: str, text: str) -> tuple[list[str], list[str], Segmenter]:
    """The scheduler's word cut of ``pending``, then ``text`` a character at a time: (cut, segments, segmenter)."""
    seg = Segmenter()
    seg.push(pending)
    cut = seg.cut_words(3)
    return cut, [s for ch in text for s in seg.push(ch)], seg


def test_the_segment_after_a_first_word_cut_is_still_the_head() -> None:
    # A slow LLM: the scheduler cut the first words before any punctuation came. What follows is
    # cut like a first segment (an early clause, or a phrase within first_max_chars), not held for
    # the sentence's end, which the LLM may write after the short first segment has played out.
    text = "Paris, a city known for its museums, its food and the river that runs through its heart."
    cut, out, seg = _word_cut_then("The capital of France is ", text)
    assert cut == ["The capital of France"] and out == ["is Paris, a city known for its museums,"]
    assert seg.flush() == ["its food and the river that runs through its heart."]
    # a later word cut does not make the segment after it a head again
    text = "on, for longer than the first segment's cap of forty characters would let it go. Done."
    cut, out, _ = _word_cut_then("Well. Then the long sentence goes on and ", text)
    assert cut == ["Then the long sentence goes"]
    assert out == ["on and on, for longer than the first segment's cap of forty characters would let it go."]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=TEXT, min_words=st.integers(0, 4))
def test_cut_words_loses_nothing_and_never_ends_on_a_leaning_word(text: str, min_words: int) -> None:
    seg = Segmenter(SegmenterOptions(opening_max_words=0, first_max_chars=10_000, max_chars=10_000))
    pushed = seg.push(text)
    cut = seg.cut_words(min_words)
    assert (" ".join(pushed + cut) + " " + seg.pending).split() == text.split()
    if cut:
        (head,) = cut
        assert len(head.split()) >= 1
        assert not _leans_forward(head.split()[-1]), head
