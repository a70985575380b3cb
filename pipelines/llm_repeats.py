"""A reply never says the same sentence twice: the text is held while it may be a repeat, and a repeat ends the reply.

Why: the demo's small model, decoding greedily, falls into sentence loops its repetition penalty
does not break. A 20-turn phone call's replies became "So, it's all about learning. So, it's all
about learning. So, it's all about ..." (the short-cycle guard, :func:`pipelines.llm_chat.repeats_itself`,
stopped each after four rounds: the caller heard the sentence four times), and every later reply
copied the loop from the history. A sentence is only known to repeat once it is complete, and by
then the text has gone to the TTS; so a sentence is held back while its words so far are words
this reply already said in a row (the TTS is still speaking the earlier ones: the LLM writes
faster than a voice speaks, so the caller hears no gap), released the moment it differs, and
dropped, ending the reply, when it completes the repeat. What the caller hears, and what goes back
into the history, is the reply without it.

A repeat is a whole sentence of ``MIN_WORDS`` words or more that the reply has already said, word
for word and in a row: an earlier sentence or its end ("Yes, it's a challenge. It's a challenge.").
Shorter ones are never dropped ("No. No." may be meant).
"""

from __future__ import annotations

import re

MIN_WORDS = 3
_WORD = re.compile(r"[a-z0-9']+")
_SENTENCE_END = (".", "!", "?", "…")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower().replace("’", "'"))


class SentenceRepeats:
    """Feed a reply's text pieces in order; get back what may be said now.

    ``push(piece)`` returns the text to emit (maybe empty: held); once it has seen a sentence
    repeat, ``repeated`` is True and everything after is dropped. ``flush()`` at the reply's end
    returns what is still held (a last sentence that only began like an earlier one).
    """

    def __init__(self) -> None:
        self.earlier = " "  # the words of this reply's finished sentences, joined and framed by spaces
        self.current = ""  # the sentence being written (since the last sentence end)
        self.held = ""  # its text not emitted yet
        self.repeated = False
        self._closed = False  # ``current`` ends in a sentence end: a space next confirms it

    def push(self, piece: str) -> str:
        if self.repeated or not piece:
            return ""
        out = ""
        if self._closed and (piece[:1].isspace() or self.current[-1:].isspace()):  # ``current`` is complete
            out = self._complete()
            if self.repeated:
                return ""
        self.current += piece
        self.held += piece
        self._closed = self.current.rstrip().rstrip("\"')]”’").endswith(_SENTENCE_END)  # ".\n\n" too
        if not self._may_repeat():
            out, self.held = out + self.held, ""
        return out

    def flush(self) -> str:
        """At the reply's end: the held text, unless it completes a repeat (then nothing)."""
        if self.repeated:
            return ""
        if self._said_before(_words(self.current)):
            self.repeated = True
            return ""
        held, self.held = self.held, ""
        return held

    def _said_before(self, words: list[str]) -> bool:
        """A whole sentence of ``MIN_WORDS`` or more whose words the reply already said, in a row
        (an earlier sentence, or the end of one: "Yes, it's a challenge. It's a challenge.")."""
        return len(words) >= MIN_WORDS and f" {' '.join(words)} " in self.earlier

    def _may_repeat(self) -> bool:
        """Whether the sentence so far is words the reply already said, in a row (its last word
        may be cut: "about lear" may become "about learning")."""
        so_far = " ".join(_words(self.current))
        return bool(so_far) and f" {so_far}" in self.earlier

    def _complete(self) -> str:
        """``current`` ended a sentence: a repeat ends the reply, else it is remembered. Returns
        the text released (held text of a sentence that turned out new)."""
        words = _words(self.current)
        if self._said_before(words):
            self.repeated, self.held = True, ""
            return ""
        if words:
            self.earlier += " ".join(words) + " "
        held, self.held, self.current = self.held, "", ""
        return held
