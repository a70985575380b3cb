"""Incremental text segmentation: LLM tokens in, synthesis segments out.

Text arrives a token at a time. A segment is cut where a listener would hear a boundary: at
sentence ends, and - for the first segment of a context only - at an early clause boundary,
because time to first audio grows with the first segment's length (the front part runs over
the whole segment before its first window can be decoded).

The head of a reply (first-segment policy):

* a short **opening** clause ("Sure," "Okay," "Well," "Of course,") is a segment of its own, cut
  as soon as its punctuation arrives: the first audio then waits for one word, not for the
  first sentence. Speakers pause there anyway (Whisper understands such replies as well as
  sentence-by-sentence renders: docs/BENCHMARKS.md);
* the segment after an opening is still the head: it is cut early at a clause, and capped at
  ``first_max_chars``, before a preposition or conjunction ("a table | for four people"), else
  at a word boundary that does not strand a function word, so the opening's audio is followed
  quickly;
* ``cut_words`` (called by the scheduler when waiting for punctuation would leave the listener in
  silence) cuts at a word boundary that does not strand a function word either; a first segment
  cut so is treated as an opening: the segment after it is still the head.

A boundary is only *confirmed* when the character after it has arrived: "3." may become
"3.14", "Dr." is followed by a name, "example." may be "example.com". Abbreviations and
numbers are therefore never cut. An opening's comma after a letter needs no confirmation:
nothing that can follow it makes it not a boundary. ``flush``/``end`` cut whatever is buffered.

Every cut made by ``push`` depends only on the text, never on how it was split into pieces
(streaming equals offline, a property test holds it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Words after which a period does not end a sentence.
ABBREVIATIONS = frozenset(
    """mr mrs ms dr prof sr jr st mt ft vs etc e.g i.e approx dept est inc ltd co corp no vol
    jan feb mar apr jun jul aug sep sept oct nov dec mon tue wed thu fri sat sun a.m p.m u.s""".split()
)
# Words a phrase should not end on when it has to be cut between words.
FUNCTION_WORDS = frozenset(
    """a an the to of in on at by for from with and or but nor so as than that which who whom whose
    my your his her its our their this these those is are was were be been am i you he she we they
    it not no if into onto over under about after before near through across around without within
    between behind during toward towards per via has have had do does did will would shall should can
    could may might must""".split()
)
# Words that lean on the noun after them ("three | hotels", "the next | train"): a forced cut
# does not end on them either. Superlatives ("the cheapest | one") are caught by their ending.
MODIFIERS = frozenset(
    """one two three four five six seven eight nine ten eleven twelve twenty thirty forty fifty hundred
    thousand first second third next last every each some any all many few several such other another
    more most less very own same""".split()
)
# Words that begin a phrase (prepositions, conjunctions, relatives): a forced cut goes before them.
PHRASE_STARTS = frozenset(
    """to of in on at by for from with and or but nor so as than that which who whom whose into onto over
    under about after before because while when where until since near through across around without
    within between behind during toward towards per via""".split()
)
_SENTENCE_END = ".!?…"
_CLAUSE_END = ",;:—"
_CLOSERS = "\"')]}”’"


@dataclass(slots=True)
class SegmenterOptions:
    first_clause_min_chars: int = 24  # an early clause cut only once this much text is buffered
    max_chars: int = 280  # a run-on without punctuation is cut at a word boundary here
    # The first segment's front part runs before the first audio and its cost grows with the
    # segment's length: a long first clause would make TTFB grow with the text (first audio:
    # docs/BENCHMARKS.md, "TTS streaming: first audio, cancel, load, vs the batch baseline"). Past this many
    # characters without a boundary, the first segment is cut at a word instead.
    first_max_chars: int = 40
    first_clause_floor_chars: int = 10  # ... preferring a clause of at least this many characters
    min_chars: int = 2  # shorter sentence fragments wait for more text ("A." "B.")
    # A first clause of at most this many words ("Sure," "Okay, so" -> "Okay,") is its own
    # segment; 0 turns openings off.
    opening_max_words: int = 3


@dataclass(slots=True)
class Segmenter:
    """Buffers one context's text and yields segments; pure, synchronous, deterministic."""

    options: SegmenterOptions = field(default_factory=SegmenterOptions)
    _buf: str = ""
    _emitted: int = 0
    # the only segment emitted so far is an opening (or a word cut): the next one is still the head
    _opened: bool = False

    @property
    def pending(self) -> str:
        return self._buf

    def push(self, text: str) -> list[str]:
        """Append text; return the segments it completes (possibly none)."""
        self._buf += text
        out: list[str] = []
        while True:
            cut = self._find_cut()
            if cut is None:
                break
            opening = self._emitted == 0 and self._buf[cut - 1] in _CLAUSE_END and self._is_opening(self._buf, cut - 1)
            seg, self._buf = self._buf[:cut], self._buf[cut:]
            self._take(seg, out, opening=opening)
        return out

    def flush(self) -> list[str]:
        """Cut everything buffered (``flush``/``end`` messages)."""
        seg, self._buf = self._buf, ""
        out: list[str] = []
        self._take(seg, out)
        return out

    def cut_words(self, min_words: int) -> list[str]:
        """Once ``min_words`` whole words are buffered, cut after the last one that is not a
        function word, keeping a possibly unfinished last word buffered.

        The scheduler calls this when waiting for punctuation would leave the listener in
        silence (a slow LLM): a cut mid-clause costs some prosody, silence costs more.
        """
        words = self._buf.split()
        if words and not self._buf[-1:].isspace():
            words.pop()  # the last word may still be growing ("abo" -> "about")
        if len(words) < max(1, min_words):
            return []
        # "Your flight | is on time", not "Your flight is | on time": a function word belongs to
        # what follows it, so it waits with that (the cut is not later for it, only shorter).
        while words and _leans_forward(words[-1]):
            words.pop()
        if not words:
            return []
        head_end = _end_of_word(self._buf, len(words))
        head, self._buf = self._buf[:head_end], self._buf[head_end:].lstrip()
        out: list[str] = []
        # A first segment cut at a word is short, like an opening: what follows it is still the
        # head (cut at an early clause or ``first_max_chars``), not held for the sentence's end,
        # which a slow LLM may reach after the short first segment has played out.
        self._take(head, out, opening=True)
        return out

    def _take(self, seg: str, out: list[str], *, opening: bool = False) -> None:
        seg = " ".join(seg.split())
        if seg:
            out.append(seg)
            self._opened = opening and self._emitted == 0
            self._emitted += 1

    def _find_cut(self) -> int | None:
        """Where the next segment ends, or None to wait for more text."""
        buf = self._buf
        head = self._emitted == 0 or (self._emitted == 1 and self._opened)
        n = len(buf)
        limit = self.options.first_max_chars if head else self.options.max_chars
        # A boundary needs its next character to be confirmed. Only boundaries inside the first
        # `limit` characters count, so that a cut never depends on how the text was split into pieces.
        for i in range(min(n, limit)):
            ch = buf[i]
            if self._emitted == 0 and ch in _CLAUSE_END and self._is_opening(buf, i):
                return i + 1  # decided by buf[: i + 1] alone: no need to wait for the next character
            if i + 1 >= n:
                break
            if ch in _SENTENCE_END:
                j = i + 1
                while j < n and buf[j] in _CLOSERS + _SENTENCE_END:
                    j += 1
                if j >= n:
                    return None
                if (
                    buf[j].isspace()
                    and self._is_sentence_end(buf, i)
                    and len(buf[:j].strip()) >= self.options.min_chars
                ):
                    return j
            elif head and ch in _CLAUSE_END and buf[i + 1].isspace():
                if len(buf[:i].strip()) >= self.options.first_clause_min_chars:
                    if _after_digit(buf, i) and i + 2 >= n:
                        return None  # "May 5, 2024" or "5, then": the next character decides
                    if not _inside_number(buf, i):
                        return i + 1
        if n > limit:
            return self._first_cut(buf, limit) if head else _word_cut(buf, limit)
        return None

    def _is_opening(self, buf: str, i: int) -> bool:
        """Is ``buf[:i]`` a short opening clause ("Sure" "Of course" "Hello there") ending at ``buf[i]``?

        Only plain words count: a digit before the comma may be a number ("5, 10"), a quote or a
        bracket has a closer to wait for.
        """
        if not (i > 0 and buf[i - 1].isalpha()):
            return False
        words = buf[:i].split()
        return 0 < len(words) <= self.options.opening_max_words and all(_PLAIN_WORD.fullmatch(w) for w in words)

    def _first_cut(self, buf: str, limit: int) -> int:
        """The head ran past ``first_max_chars`` with no boundary: prefer the last short clause
        ("Hello there, my friend,"), else the last phrase boundary ("... your appointment | to
        Thursday", "a table | for four people"), else a word boundary that does not strand a
        function word."""
        best = None
        for i in range(min(len(buf) - 1, limit)):
            if (
                buf[i] in _CLAUSE_END
                and buf[i + 1].isspace()
                and len(buf[:i].strip()) >= self.options.first_clause_floor_chars
                and not _after_digit(buf, i)
            ):
                best = i + 1
        if best is not None:
            return best
        return _phrase_cut(buf, limit) or _word_cut(buf, limit, step_back=True)

    @staticmethod
    def _is_sentence_end(buf: str, i: int) -> bool:
        if buf[i] != ".":
            return True
        m = re.search(r"([\w.]+)$", buf[:i])
        raw = m.group(1) if m else ""
        word = raw.lower()
        if word in ABBREVIATIONS:
            return False
        if len(raw) == 1 and raw.isalpha() and raw.isupper():  # initials: "J. Smith"
            return False
        if re.fullmatch(r"(?:[a-z]\.)+[a-z]", word):  # "e.g", "u.s"
            return False
        return True


_PLAIN_WORD = re.compile(r"[^\W\d_](?:[\w'’.-]*[^\W\d_])?")  # letters, inner apostrophes/dots/hyphens


def _bare(word: str) -> str:
    return word.lower().strip("\"'“”‘’()[]{}")


def _leans_forward(word: str) -> bool:
    """A word that belongs with what follows it: a function word or a modifier ("the", "three",
    "cheapest"). Words ending in punctuation end a phrase, so they never lean."""
    bare = _bare(word)
    if not bare[-1:].isalnum():
        return False
    return bare in FUNCTION_WORDS or bare in MODIFIERS or (len(bare) >= 6 and bare.endswith("est"))


def _end_of_word(buf: str, k: int) -> int:
    """Index just after the ``k``-th whitespace-separated word of ``buf`` (``k`` >= 1)."""
    return [m.end() for m in re.finditer(r"\S+", buf)][k - 1]


def _after_digit(buf: str, i: int) -> bool:
    return i > 0 and buf[i] == "," and buf[i - 1].isdigit()


def _phrase_cut(buf: str, limit: int, min_words: int = 3) -> int | None:
    """The last space before ``limit`` that starts a phrase: a content word, then a word in
    ``PHRASE_STARTS`` (complete: followed by a space before ``limit``). None if there is none
    after ``min_words`` words. Cutting there keeps "next Monday" and "four people" whole."""
    spans = [(m.start(), m.end()) for m in re.finditer(r"\S+", buf[:limit])]
    best = None
    for k in range(min_words, len(spans) - 1):  # the last span may be a word cut by ``limit``
        prev, word = buf[slice(*spans[k - 1])], buf[slice(*spans[k])]
        if _bare(word) in PHRASE_STARTS and not _leans_forward(prev) and prev[-1:].isalnum():
            best = spans[k - 1][1]
    return best


def _word_cut(buf: str, limit: int, *, step_back: bool = False) -> int:
    """The last space before ``limit``; ``step_back``: before the words that lean on what follows
    them (keeping >= 3 words)."""
    space = buf.rfind(" ", 0, limit)
    if space <= 0:
        return limit  # one unbroken "word": cut hard
    while step_back:
        head = buf[:space].split()
        if len(head) <= 3 or not _leans_forward(head[-1]):
            break
        space = buf.rfind(" ", 0, space - len(head[-1]))
    return space


def _inside_number(buf: str, i: int) -> bool:
    """'1,000' has a comma but no clause boundary (only reached when followed by a space)."""
    return _after_digit(buf, i) and i + 2 < len(buf) and buf[i + 2].isdigit()
