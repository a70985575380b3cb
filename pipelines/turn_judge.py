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
* the words read as a finished sentence to a language model (``pipelines.text_turn``, when given:
  probability >= ``text_likely``): ``likely_s`` (short); as clearly unfinished ("Could you send
  me", "I need to cancel": < ``text_unlikely``, and not a short answer such as "No."): ``unlikely_s``,
  unless the words themselves are in doubt — the turn is long (``doubt_words`` words or more), or
  Whisper decoded them unsurely (their log-probability under ``doubt_logprob``), or the acoustic
  model hears a finished turn (``rescue_acoustic``): a garbled transcript ("Please tell me
  everything I should know before I'm not") reads unfinished to a language model for reasons that
  are not the caller's, and waiting on it is dead air;
  in between: ``between_s``;
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
_WORD = re.compile(r"[a-z0-9']+")  # digits too: "My order number is 742." ends on 742, not on "is"


# Whole turns that answer by themselves; a language model rates their end low ("No." is rarely a
# whole message in its training), so they are not read as unfinished.
SHORT_ANSWERS = frozenset(
    "yes yeah yep no nope sure okay ok right correct exactly thanks fine great perfect absolutely".split()
)


def words(text: str) -> list[str]:
    """The transcript's words, lower-cased, punctuation dropped (digits kept)."""
    return _WORD.findall(text.lower())


def short_answer(text: str) -> bool:
    """Whether the turn is one or two words of a short answer ("No.", "Yes please", "Sure, thanks")."""
    said = words(text)
    return 0 < len(said) <= 2 and said[0] in SHORT_ANSWERS


def cue(text: str) -> str:
    """The transcript's ending: ``"continuing"``, ``"sentence"`` or ``"none"`` (no text, no mark)."""
    t = text.strip().lower()
    if not t:
        return "none"
    if t.endswith(_TRAILING_MARKS):
        return "continuing"
    said = words(t)
    if said and said[-1] in CONTINUING_WORDS:
        return "continuing"
    if t.endswith((".", "!", "?")):
        return "sentence"
    return "none"


@dataclass(frozen=True)
class TurnJudge:
    """Seconds of silence after the VAD stop that end the turn, from the transcript and the acoustic verdict.

    The defaults are the corpus's choice (docs/BENCHMARKS.md): a trailing transcript or words a
    reader expects more of wait longest, since a cut pause means the agent talks over a caller who
    was not done, while a finished sentence ends the turn almost at the VAD stop (with the reply's
    inference already running: ``pipelines.pipecat_turns``). ``trust_acoustic`` is off by default:
    on the corpus even smart-turn's surest "complete" verdicts fell in mid-thought pauses ("I need
    to cancel." before "my appointment on Tuesday"), so trusting them cut more pauses than it saved.
    """

    continuing_s: float = 1.5
    sentence_s: float = 0.6
    other_s: float = 0.6
    trust_acoustic: float | None = None  # smart-turn's probability of "complete" from which it decides alone
    # the text model's probability that the sentence ends here: at or above ``text_likely`` the turn
    # ends after ``likely_s``, below ``text_unlikely`` after ``unlikely_s``, between after
    # ``between_s`` (the corpus's choice, docs/BENCHMARKS.md "Turn-taking and voice-to-voice")
    text_likely: float = 0.7
    text_unlikely: float = 0.1
    likely_s: float = 0.2
    between_s: float = 0.4
    unlikely_s: float = 1.8
    # an "unlikely" verdict on a turn of ``doubt_words`` words or more waits ``between_s``: a long
    # turn is where Whisper garbles a word or two, and a garble reads unfinished, while callers who
    # pause mid-thought mostly do it early ("My order number is..."; one that trails on "to" or
    # "um" waits ``continuing_s`` whatever its length). The corpus's choice (docs/BENCHMARKS.md,
    # the long asks): a shorter worst case for long turns at the price of a rare cut pause. The
    # words' surprise to SmolLM2 told the two apart no better than their count. None: off
    doubt_words: int | None = 10
    # likewise on words Whisper was unsure of (the segment's log-probability below ``doubt_logprob``)
    # or with smart-turn's "complete" at or above ``rescue_acoustic``: off by default, neither
    # helped on the corpus. None turns either check off
    doubt_logprob: float | None = None
    rescue_acoustic: float | None = None
    # a transcript that ends in a question mark and reads unfinished waits ``between_s``: Whisper
    # heard a question, and a garbled one ("How do I plan a merc-day party for 20 people on a
    # mer-hit?") reads unfinished to the text model for reasons that are not the caller's. Off: on
    # the corpus Whisper writes "?" in mid-thought pauses too, and it cut more of them
    question_ends: bool = False
    # a turn of ``doubt_words`` words or more that Whisper closed with a full stop or a question mark
    # but that ends on a word the cue takes for "more to come" ("…before I turn on." for "…before I
    # adopt a dog.") is judged by the text model as any sentence, not held ``continuing_s``: on the
    # corpus it cut no more pauses and shortened the long asks' worst case (docs/BENCHMARKS.md, the
    # judge's long asks); long calls met such garbles where the corpus holds few
    doubt_continuing: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.text_unlikely <= self.text_likely <= 1.0:
            raise ValueError(
                f"TurnJudge needs 0 <= text_unlikely <= text_likely <= 1, got {self.text_unlikely}, {self.text_likely}"
            )
        for name in ("continuing_s", "sentence_s", "other_s", "likely_s", "between_s", "unlikely_s"):
            value = getattr(self, name)
            if not 0.0 <= value <= 3.0:
                raise ValueError(f"TurnJudge.{name} must be between 0 and 3 s, got {value}")
        for name in ("trust_acoustic", "rescue_acoustic"):
            value = getattr(self, name)
            if value is not None and not 0.0 <= value <= 1.0:
                raise ValueError(f"TurnJudge.{name} must be a probability, got {value}")
        if self.doubt_words is not None and self.doubt_words < 1:
            raise ValueError(f"TurnJudge.doubt_words must be a count of words (>= 1), got {self.doubt_words}")
        if self.doubt_logprob is not None and self.doubt_logprob > 0.0:
            raise ValueError(f"TurnJudge.doubt_logprob is a log-probability (<= 0), got {self.doubt_logprob}")

    def wait_s(
        self,
        text: str,
        acoustic_complete: float | None = None,
        text_complete: float | None = None,
        words_logprob: float | None = None,
    ) -> float:
        """How much more silence ends the turn, given the turn's transcript so far, the acoustic
        model's probability that it is complete, the text model's that its sentence ends here
        (``None``: no such model) and how sure Whisper was of the last segment's words (their
        mean log-probability; ``None``: not known)."""
        ending = cue(text)
        if ending == "continuing" and not self._closed_long_turn(text):
            return self.continuing_s
        trusted = self.trust_acoustic is not None and acoustic_complete is not None
        if trusted and acoustic_complete >= self.trust_acoustic:
            return 0.0
        if text_complete is not None:
            if text_complete >= self.text_likely:
                return self.likely_s
            if (
                text_complete >= self.text_unlikely
                or short_answer(text)
                or self._doubted(text, acoustic_complete, words_logprob)
                or (self.question_ends and text.rstrip().endswith("?"))
            ):
                return self.between_s
            return self.unlikely_s
        return self.sentence_s if ending == "sentence" else self.other_s

    def _closed_long_turn(self, text: str) -> bool:
        """A long turn Whisper closed as a sentence though its last word reads as more to come
        (``doubt_continuing``); a trailing comma, dash or ellipsis still waits."""
        t = text.rstrip()
        return (
            self.doubt_continuing and t.endswith((".", "?", "!")) and not t.endswith(_TRAILING_MARKS) and self._long(t)
        )

    def _long(self, text: str) -> bool:
        """A turn of ``doubt_words`` words or more (None: no turn is)."""
        return self.doubt_words is not None and len(words(text)) >= self.doubt_words

    def _doubted(self, text: str, acoustic_complete: float | None, words_logprob: float | None) -> bool:
        """Whether an "unfinished" reading of the words is not to be waited on: the turn is long,
        Whisper was unsure of its words, or the acoustic model is sure the turn is over."""
        if self._long(text):
            return True
        unsure = self.doubt_logprob is not None and words_logprob is not None and words_logprob < self.doubt_logprob
        heard_done = (
            self.rescue_acoustic is not None
            and acoustic_complete is not None
            and acoustic_complete >= self.rescue_acoustic
        )
        return unsure or heard_done

    @property
    def worst_s(self) -> float:
        """The longest wait after the VAD stop, whatever the signals say."""
        return max(self.continuing_s, self.sentence_s, self.other_s, self.unlikely_s)
