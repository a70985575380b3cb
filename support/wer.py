"""Word error rate of what the agent heard against what the caller said, on one normal form.

Whisper writes "7429", "12 Oak Street", "$5" and "OK" where the corpus's reference says "seven
four two nine", "twelve Oak Street" and "okay", and leaves out the "um"s it hears. A WER that
counted those as errors would measure spelling, not hearing, so both sides go through one
:func:`normalise`: lowercase; punctuation out (an apostrophe inside a word stays, a hyphen splits);
fillers (um, uh, er, hmm, ...) out; every number, spelled or in digits, as its decimal digits one
token each ("twenty five" and "25" both become ``2 5``; "seven four two nine" and "7429" both
``7 4 2 9``), so a misheard digit costs one token whichever way either side wrote it.
"""

from __future__ import annotations

import re

__all__ = ["edit_distance", "normalise", "wer", "word_errors"]

FILLERS = frozenset({"um", "umm", "uh", "uhm", "er", "erm", "ah", "hmm", "hm", "mm", "mhm"})
_SAME = {"ok": "okay", "alright": "all right"}
_UNITS = {
    w: i
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen".split()
    )
}
_TENS = {w: 10 * i for i, w in enumerate("_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()) if i > 1}
_SCALES = {"hundred": 100, "thousand": 1000}


def normalise(text: str) -> list[str]:
    """``text`` as the tokens WER compares (see the module's docstring)."""
    text = text.lower().replace("’", "'")
    text = re.sub(r"\$(\d[\d,]*(?:\.\d+)?)", r"\1 dollars", text)
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)  # 1,000
    text = re.sub(r"[^a-z0-9' ]+", " ", text)
    words = [w.strip("'") for w in text.split()]
    words = [_SAME.get(w, w) for w in words if w and w not in FILLERS]
    words = " ".join(words).split()
    return _numbers(words)


def _numbers(words: list[str]) -> list[str]:
    """Spelled numbers to digits, then every number to one token per digit."""
    out: list[str] = []
    i = 0
    while i < len(words):
        value, used = _spelled(words, i)
        if used:
            out += list(str(value))
            i += used
        elif words[i].isdigit():
            out += list(words[i])
            i += 1
        else:
            out.append(words[i])
            i += 1
    return out


def _spelled(words: list[str], i: int) -> tuple[int, int]:
    """The number spelled from ``words[i]`` on (``twenty five``, ``three hundred``, ``seven``) and how
    many words it took; ``(0, 0)`` when none starts there. Digit sequences ("seven four") are single
    numbers each."""
    w = words[i]
    if w not in _UNITS and w not in _TENS:
        return 0, 0
    value, used = 0, 0
    if w in _TENS:
        value, used = _TENS[w], 1
        if i + 1 < len(words) and words[i + 1] in _UNITS and 0 < _UNITS[words[i + 1]] < 10:
            value, used = value + _UNITS[words[i + 1]], 2
    else:
        value, used = _UNITS[w], 1
    while i + used < len(words) and words[i + used] in _SCALES and value:
        value, used = value * _SCALES[words[i + used]], used + 1
        rest, more = _spelled(words, i + used)
        if more and rest < value:
            value, used = value + rest, used + more
    return value, used


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    """Levenshtein distance between two word lists (substitutions, insertions, deletions)."""
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[len(hyp)]


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """``(edits, reference words)``: word-level Levenshtein distance between the normal forms."""
    ref = normalise(reference)
    return edit_distance(ref, normalise(hypothesis)), len(ref)


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate of one utterance (edits over the reference's words; pool corpora with
    :func:`word_errors`, not by averaging this)."""
    edits, n = word_errors(reference, hypothesis)
    return edits / max(1, n)
