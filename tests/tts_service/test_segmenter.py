"""The segmenter alone: streaming equals offline, and cuts fall where a listener hears them."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tts_service.segmenter import Segmenter, SegmenterOptions

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


def test_short_first_clause_is_not_cut() -> None:
    assert offline("Well, I think so. Yes.") == ["Well, I think so.", "Yes."]


def test_number_commas_are_not_clause_boundaries() -> None:
    text = "The invoice was dated on May 5, 2024 and paid late. Ok."
    long_first = SegmenterOptions(first_max_chars=280)
    assert offline(text, long_first)[0] == "The invoice was dated on May 5, 2024 and paid late."
    assert streamed(list(text), long_first) == offline(text, long_first)
    # Capped first segment: the cut still never falls on the number's comma.
    assert not offline(text)[0].endswith("5,")


def test_a_long_first_clause_is_capped_without_stranding_a_function_word() -> None:
    # TTFB: the first segment's front part runs before any audio, so it is kept short.
    assert offline("I found three flights to Denver tomorrow morning, and the earliest one leaves at seven.")[0] == (
        "I found three flights to Denver"
    )
    assert offline("Sure, I can move your appointment to Thursday at three in the afternoon.")[0] == (
        "Sure, I can move your appointment"
    )
    # a short clause inside the cap is preferred over a word cut
    assert offline("Hello there, my friend, how are you doing today?")[0] == "Hello there, my friend,"
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
