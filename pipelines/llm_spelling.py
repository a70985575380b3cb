"""Spell a prompt with the tokens its conversation's cache already holds, where the text is the same.

Why: the engine's cache reuse (:mod:`pipelines.llm_chat`) works on token ids, but a chat client
sends text. A sampled reply is often not the tokenizer's own spelling of its text ("\\n\\n" where
the tokenizer writes "\\n" twice): encoded afresh, the next turn's prompt left the cache at that
token and read the rest of the history again (hundreds of tokens on the reply path). And a history
that outgrew the cache comes back with its oldest messages cut out, so what it shares with the cache
is a span further on, found by the engine's trim-following only if the tokens are the same too.

So the text is compared with each cached conversation's text, character for character, token
boundary by token boundary: the longest cached prefix that spells the prompt's beginning, then
(when the rest of the cache is not that prefix) the cached span that spells what comes next, as a
trimmed history's kept messages do; only what is left after those is encoded. The result is the
same text for the model, in the spelling it wrote or read before.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Characters of the prompt, after the cached prefix, that must be found in the cache before a span
# there is taken as the same messages (a trimmed history's kept part). Shorter runs match by chance.
MIN_SPAN_CHARS = 48


@dataclass(frozen=True, slots=True)
class _Cached:
    ids: list[int]
    text: str  # the ids decoded, special tokens kept
    starts: list[int]  # character offset in text where each token starts, plus len(text)


def _cached(tokenizer: Any, ids: list[int], known: dict[int, str]) -> _Cached | None:
    if not ids:
        return None
    new = list({t for t in ids if t not in known})
    if new:  # each token's text once per process: a prompt's cache is thousands of tokens, its vocabulary not
        known.update(zip(new, tokenizer.decode_batch([[t] for t in new], skip_special_tokens=False), strict=True))
    pieces = [known[t] for t in ids]
    for n, piece in enumerate(pieces):  # a token inside a multi-byte character has no text of its own
        if "\ufffd" in piece:
            ids, pieces = ids[:n], pieces[:n]
            break
    if not ids:
        return None
    starts = [0]
    for piece in pieces:
        starts.append(starts[-1] + len(piece))
    return _Cached(ids, "".join(pieces), starts)


def _common_chars(a: str, b: str, a0: int = 0, b0: int = 0) -> int:
    """Length of the common prefix of ``a[a0:]`` and ``b[b0:]`` (by halving: strings compare in C)."""
    lo, hi = 0, min(len(a) - a0, len(b) - b0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[a0 : a0 + mid] == b[b0 : b0 + mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class CachedSpelling:
    """The cached conversations of one moment (snapshots of the slots' ids), ready to spell prompts."""

    def __init__(self, tokenizer: Any, slots: Sequence[list[int]], known: dict[int, str] | None = None) -> None:
        """``known``: token id -> its text, kept between instances (filled as needed)."""
        self.tokenizer = tokenizer
        known = {} if known is None else known
        self.cached = [c for c in (_cached(tokenizer, list(ids), known) for ids in slots) if c is not None]

    def encode(self, text: str) -> list[int]:
        """``text``'s token ids, reusing cached tokens where they spell it (else the plain encoding)."""
        best: tuple[list[int], int, int] = ([], 0, 0)  # (cached ids, how many, characters of text they spell)
        for c in self.cached:
            ids, pos = self._spell(c, text)
            if len(ids) > best[1]:
                best = (ids, len(ids), pos)
        ids, _, pos = best
        return ids + (self.tokenizer.encode(text[pos:], add_special_tokens=False).ids if pos < len(text) else [])

    def _spell(self, c: _Cached, text: str) -> tuple[list[int], int]:
        """(cached ids, characters of ``text`` they spell) for ``text``'s beginning spelled from ``c``."""
        same = _common_chars(c.text, text)
        j = bisect.bisect_right(c.starts, same) - 1  # tokens wholly inside the common prefix
        pos = c.starts[j]
        out = c.ids[:j]
        if j < len(c.ids) and len(text) - pos >= MIN_SPAN_CHARS:
            span = self._span(c, text, pos, j)
            if span is not None:
                b, k, pos = span
                out = out + c.ids[b : b + k]
        return out, pos

    @staticmethod
    def _span(c: _Cached, text: str, pos: int, after: int) -> tuple[int, int, int] | None:
        """(first token, tokens, end in ``text``) of the longest cached run after token ``after``
        that starts on a token boundary and spells ``text`` from ``pos`` on; None if none is long."""
        probe = text[pos : pos + MIN_SPAN_CHARS]
        found: tuple[int, int, int] | None = None
        at = c.text.find(probe, c.starts[after] + 1)
        while at >= 0:
            b = bisect.bisect_left(c.starts, at)
            if b < len(c.ids) and c.starts[b] == at:  # a token boundary: the run can start here
                same = _common_chars(c.text, text, at, pos)
                e = bisect.bisect_right(c.starts, at + same) - 1
                if e - b > 0 and (found is None or e - b > found[1]):
                    found = (b, e - b, pos + c.starts[e] - at)
            at = c.text.find(probe, at + 1)
        return found
