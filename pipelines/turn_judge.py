"""End of turn from more than one signal: the transcript's last words, the acoustic verdict, the silence.

Why not the acoustic model alone: on the caller corpus (``support/callers.py``) smart-turn v3 calls
finished questions from several espeak voices incomplete (the turn then waits for its timeout) and
lets mid-thought pauses such as "My order number is..." end the turn; a fixed silence does about as
well (docs/BENCHMARKS.md, "End of turn from more than one signal"). Whisper's transcript of the
segment just spoken carries what the model misses: a phrase that stops on "to", "is", "and", "um",
a comma, a dash or an ellipsis is a caller going on, whatever the pitch did.

:class:`TurnJudge` turns the three signals into one number, how long a silence (counted from the
VAD's stop, which itself comes ``stop_secs`` after the last word) ends the turn:

* the transcript trails (a continuing word, ``...``, ``-``, ``,``): ``continuing_s`` (longest);
* the acoustic model is sure the turn is over (probability >= ``trust_acoustic``, when set): at once;
* the transcript ends as a sentence (``.``, ``!``, ``?``): ``sentence_s``;
* anything else (no punctuation, nothing heard): ``other_s``.

The worst case is bounded by the largest of them (plus the VAD's ``stop_secs``), never by a model's
timeout. The rule is framework-free so that the corpus script and a pipeline use the same one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Words a sentence does not end on: articles, conjunctions, prepositions, auxiliaries and fillers.
# A caller who stops on one of them is mid-thought ("I would like to", "the code is", "um").
CONTINUING_WORDS = frozenset(
    "a an the and or but so because if than then that which who of to for in on at with from by "
    "my your our their his her its is are was were be been am "
    "um uh er erm hmm like maybe".split()
)
_TRAILING_MARKS = ("...", "…", "-", ",", ";", ":")
_WORD = re.compile(r"[a-z']+")


def cue(text: str) -> str:
    """The transcript's ending: ``"continuing"``, ``"sentence"`` or ``"none"`` (no text, no mark)."""
    t = text.strip().lower()
    if not t:
        return "none"
    if t.endswith(_TRAILING_MARKS):
        return "continuing"
    words = _WORD.findall(t)
    if words and words[-1] in CONTINUING_WORDS:
        return "continuing"
    if t.endswith((".", "!", "?")):
        return "sentence"
    return "none"


@dataclass(frozen=True)
class TurnJudge:
    """Seconds of silence after the VAD stop that end the turn, from the transcript and the acoustic verdict.

    The defaults are the corpus's choice at about a fixed 0.6 s silence's median wait
    (docs/BENCHMARKS.md): a trailing transcript waits longest. ``trust_acoustic`` is off by default:
    on the corpus even smart-turn's surest "complete" verdicts fell in mid-thought pauses ("I need
    to cancel." before "my appointment on Tuesday"), so trusting them cut more pauses than it saved.
    """

    continuing_s: float = 0.8
    sentence_s: float = 0.6
    other_s: float = 0.6
    trust_acoustic: float | None = None  # smart-turn's probability of "complete" from which it decides alone

    def __post_init__(self) -> None:
        for name in ("continuing_s", "sentence_s", "other_s"):
            value = getattr(self, name)
            if not 0.0 <= value <= 3.0:
                raise ValueError(f"TurnJudge.{name} must be between 0 and 3 s, got {value}")
        if self.trust_acoustic is not None and not 0.0 <= self.trust_acoustic <= 1.0:
            raise ValueError(f"TurnJudge.trust_acoustic must be a probability, got {self.trust_acoustic}")

    def wait_s(self, text: str, acoustic_complete: float | None = None) -> float:
        """How much more silence ends the turn, given the turn's transcript so far and the acoustic
        model's probability that it is complete (``None``: no model)."""
        ending = cue(text)
        if ending == "continuing":
            return self.continuing_s
        trusted = self.trust_acoustic is not None and acoustic_complete is not None
        if trusted and acoustic_complete >= self.trust_acoustic:
            return 0.0
        return self.sentence_s if ending == "sentence" else self.other_s

    @property
    def worst_s(self) -> float:
        """The longest wait after the VAD stop, whatever the signals say."""
        return max(self.continuing_s, self.sentence_s, self.other_s)
