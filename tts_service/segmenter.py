"""Incremental text segmentation: LLM tokens in, synthesis segments out.

Text arrives a token at a time. A segment is cut where a listener would hear a boundary: at
sentence ends, and - for the first segment of a context only - at an early clause boundary,
because time to first audio grows with the first segment's length (the front part runs over
the whole segment before its first window can be decoded).

A boundary is only *confirmed* when the character after it has arrived: "3." may become
"3.14", "Dr." is followed by a name, "example." may be "example.com". Abbreviations and
numbers are therefore never cut. ``flush``/``end`` cut whatever is buffered.
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
    it not no if into onto over under about after before""".split()
)
_SENTENCE_END = ".!?…"
_CLAUSE_END = ",;:—"
_CLOSERS = "\"')]}”’"


@dataclass(slots=True)
class SegmenterOptions:
    first_clause_min_chars: int = 24  # an early clause cut only once this much text is buffered
    max_chars: int = 280  # a run-on without punctuation is cut at a word boundary here
    # The first segment's front part runs before the first audio and costs ~0.6 ms per character
    # on 2 cores: a long first clause would make TTFB grow with the text. Past this many
    # characters without a boundary, the first segment is cut at a word instead.
    first_max_chars: int = 40
    first_clause_floor_chars: int = 10  # ... preferring a clause of at least this many characters
    min_chars: int = 2  # shorter sentence fragments wait for more text ("A." "B.")


@dataclass(slots=True)
class Segmenter:
    """Buffers one context's text and yields segments; pure, synchronous, deterministic."""

    options: SegmenterOptions = field(default_factory=SegmenterOptions)
    _buf: str = ""
    _emitted: int = 0

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
            seg, self._buf = self._buf[:cut], self._buf[cut:]
            self._take(seg, out)
        return out

    def flush(self) -> list[str]:
        """Cut everything buffered (``flush``/``end`` messages)."""
        seg, self._buf = self._buf, ""
        out: list[str] = []
        self._take(seg, out)
        return out

    def cut_words(self, min_words: int) -> list[str]:
        """Cut at the last word boundary, keeping a possibly unfinished last word buffered.

        The scheduler calls this when waiting for punctuation would leave the listener in
        silence (a slow LLM): a cut mid-clause costs some prosody, silence costs more.
        """
        space = self._buf.rstrip().rfind(" ") if not self._buf[-1:].isspace() else len(self._buf)
        head = self._buf[:space] if space > 0 else ""
        if len(head.split()) < min_words:
            return []
        self._buf = self._buf[space:].lstrip()
        out: list[str] = []
        self._take(head, out)
        return out

    def _take(self, seg: str, out: list[str]) -> None:
        seg = " ".join(seg.split())
        if seg:
            out.append(seg)
            self._emitted += 1

    def _find_cut(self) -> int | None:
        buf = self._buf
        first = self._emitted == 0
        n = len(buf)
        limit = self.options.first_max_chars if first else self.options.max_chars
        # A boundary needs its next character to be confirmed. Only boundaries inside the first
        # `limit` characters count, so that a cut never depends on how the text was split into pieces.
        for i in range(min(n - 1, limit)):
            ch = buf[i]
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
            elif first and ch in _CLAUSE_END and buf[i + 1].isspace():
                if len(buf[:i].strip()) >= self.options.first_clause_min_chars:
                    if _after_digit(buf, i) and i + 2 >= n:
                        return None  # "May 5, 2024" or "5, then": the next character decides
                    if not _inside_number(buf, i):
                        return i + 1
        if n > limit:
            return self._first_cut(buf, limit) if first else _word_cut(buf, limit)
        return None

    def _first_cut(self, buf: str, limit: int) -> int:
        """The first segment ran past ``first_max_chars`` with no boundary: prefer the last short
        clause ("Hello there, my friend,"), else a word boundary that does not strand a
        function word ("... your appointment | to Thursday", not "... appointment to | Thursday")."""
        best = None
        for i in range(min(len(buf) - 1, limit)):
            if (
                buf[i] in _CLAUSE_END
                and buf[i + 1].isspace()
                and len(buf[:i].strip()) >= self.options.first_clause_floor_chars
                and not _after_digit(buf, i)
            ):
                best = i + 1
        return best if best is not None else _word_cut(buf, limit, avoid=FUNCTION_WORDS)

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


def _after_digit(buf: str, i: int) -> bool:
    return i > 0 and buf[i] == "," and buf[i - 1].isdigit()


def _word_cut(buf: str, limit: int, avoid: frozenset[str] = frozenset()) -> int:
    """The last space before ``limit``, stepping back over words in ``avoid`` (keeping >= 3 words)."""
    space = buf.rfind(" ", 0, limit)
    if space <= 0:
        return limit  # one unbroken "word": cut hard
    while avoid:
        head = buf[:space].split()
        if len(head) <= 3 or head[-1].lower().strip("\"'") not in avoid:
            break
        space = buf.rfind(" ", 0, space - len(head[-1]))
    return space


def _inside_number(buf: str, i: int) -> bool:
    """'1,000' has a comma but no clause boundary (only reached when followed by a space)."""
    return _after_digit(buf, i) and i + 2 < len(buf) and buf[i + 2].isdigit()
