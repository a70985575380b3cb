"""Chat prompts, streaming detokenisation and the prefix-cached generation loop for :mod:`llm_model`.

Why a prefix cache: in a voice conversation the prompt of turn n+1 is turn n's prompt, the
reply, and one new user message. The engine keeps each conversation's keys/values in a slot and
runs only the tokens after the longest common prefix of the new prompt and the slot's cached
tokens, so the first token of a later turn costs a prefill of ~20-40 tokens, not of the whole
history. When the client sends something else (an assistant message cut to what was played, an
edited history, another conversation) the common prefix is simply shorter; with no match at all
it is a full prefill. The output is the same either way (greedy decoding; tests check it token
for token).

Tokenizer: the ``tokenizers`` library on a ``tokenizer.json`` (written once from the GGUF by
transformers' converter, see :mod:`local_llm`), and the model's Jinja chat template rendered the
way transformers renders it (sandboxed, ``trim_blocks``/``lstrip_blocks``), so prompts equal
``apply_chat_template``'s without importing transformers at run time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from llama import Sampling
from llama.sampler import choose

from .llm_model import Llama

PREFILL_CHUNK = 512  # prompt tokens per forward call: bounds attention memory; a stop is seen between chunks
MIN_FOLLOW = 16  # cached tokens worth moving (see ChatEngine._follow_trim); fewer are simply re-read


_MARKS = ("\x00first\x00", "\x00second\x00")  # placeholder texts whose template tokens between are wanted


class ChatTokenizer:
    """``encode_chat(messages)`` -> prompt token ids with the generation prompt, as transformers does."""

    def __init__(self, tokenizer_json: Path, chat_template: str, *, eos_tokens: list[str], bos_token: str = "") -> None:
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(tokenizer_json))
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])

        def raise_exception(message: str) -> None:
            raise ValueError(f"chat template: {message}")

        env.globals["raise_exception"] = raise_exception
        self.template = env.from_string(chat_template)
        self.bos_token = bos_token
        self.eos_token = eos_tokens[0] if eos_tokens else ""
        ids = [self.tokenizer.token_to_id(t) for t in eos_tokens]
        self.eos_ids = frozenset(i for i in ids if i is not None)
        if not self.eos_ids:
            raise ValueError(f"none of the end tokens {eos_tokens} is in the vocabulary")

    def render(self, messages: list[dict[str, Any]]) -> str:
        return self.template.render(
            messages=messages, add_generation_prompt=True, bos_token=self.bos_token, eos_token=self.eos_token
        )

    def encode_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        return self.tokenizer.encode(self.render(messages), add_special_tokens=False).ids

    def decoder(self) -> StreamDecoder:
        return StreamDecoder(self.tokenizer)

    def turn_opening(self) -> list[int]:
        """The template's tokens between a reply's last word and the caller's next words.

        For SmolLM2's template the end token and ``\n<|im_start|>user\n``: what every next
        turn of a conversation starts with, known before the caller has said anything
        (:meth:`ChatEngine.read_ahead`). Empty where the template puts nothing there."""
        return self._between([("user", "hi"), ("assistant", _MARKS[0]), ("user", _MARKS[1])])

    def reply_opening(self) -> list[int]:
        """The template's tokens between the caller's last word and a reply's first: for SmolLM2's
        template the end token and ``\n<|im_start|>assistant\n``. Where they occur in a prompt an
        earlier reply follows (:class:`CopyBan`)."""
        return self._between([("user", _MARKS[0]), ("assistant", _MARKS[1])])

    def _between(self, turns: list[tuple[str, str]]) -> list[int]:
        """The template's tokens between the two marked turns' texts (``_MARKS``) of ``turns``."""
        rendered = self.render([{"role": role, "content": text} for role, text in turns])
        between = rendered[rendered.index(_MARKS[0]) + len(_MARKS[0]) : rendered.index(_MARKS[1])]
        return self.tokenizer.encode(between, add_special_tokens=False).ids if between else []


class StreamDecoder:
    """Token ids in, text pieces out, never splitting a multi-byte character.

    Byte-level BPE tokens can end inside a UTF-8 sequence; a piece is released only once the
    decoded text no longer ends in U+FFFD. Only a short window of recent ids is re-decoded per
    token (the two offsets), so the cost does not grow with the reply.
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # start of the window re-decoded as context
        self.read = 0  # ids before this are already emitted

    def push(self, token: int) -> str:
        self.ids.append(token)
        done = self.tokenizer.decode(self.ids[self.prefix : self.read], skip_special_tokens=True)
        text = self.tokenizer.decode(self.ids[self.prefix :], skip_special_tokens=True)
        if len(text) > len(done) and not text.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return text[len(done) :]
        return ""


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass(slots=True)
class _Slot:
    ids: list[int] = field(default_factory=list)  # tokens whose keys/values the slot holds, in order
    prompt_len: int = 0  # how many of them were the last request's prompt (the rest: its reply)
    used: float = 0.0


@dataclass(slots=True, frozen=True)
class DecodeStep:
    """A batched generator's token, and the decode step it needs next (see ChatEngine.generate)."""

    token: int
    slot: int
    position: int


@dataclass(slots=True)
class TurnStats:
    """What the last request cost: how much of its prompt came from the cache."""

    prompt_tokens: int = 0
    reused_tokens: int = 0
    prefill_s: float = 0.0
    completion_tokens: int = 0
    decode_s: float = 0.0
    finish_reason: str = "stop"
    slot: int = 0
    moved_tokens: int = 0  # cached tokens moved to earlier positions because the history lost its oldest part
    dropped_tokens: int = 0  # cached tokens that part held
    looped: bool = False  # the reply was ended where it started saying one short cycle over and over
    copy_blocked: int = 0  # steps at which a token that would copy an earlier reply was ruled out (CopyBan)


LOOP_CYCLE = 8  # the longest cycle, in tokens, :func:`repeats_itself` looks for
LOOP_REPEATS, LOOP_TOKENS = 4, 8  # a cycle said this many times in a row, this many tokens at least


def repeats_itself(tokens: list[int]) -> bool:
    """Whether ``tokens`` (a reply so far) end in one short cycle said over and over.

    Why: a small model decoding greedily can fall into a loop its repetition penalty does not
    break (the demo once answered "What is the capital of France?" with "bonjour, bonjour, hello,
    hello, hello, ..." for seven seconds, until ``max_tokens``). A cycle of up to
    ``LOOP_CYCLE`` tokens said ``LOOP_REPEATS`` times in a row, ``LOOP_TOKENS`` tokens at least
    (a single token eight times: "00000000", so a round number of a reply stays whole), is
    such a loop; the reply ends there instead of filling the caller's ear with it.
    """
    n = len(tokens)
    for p in range(1, LOOP_CYCLE + 1):
        reps = max(LOOP_REPEATS, -(-LOOP_TOKENS // p))
        if n < p * reps:
            break
        tail = tokens[n - p :]
        if all(tokens[n - (k + 1) * p : n - k * p] == tail for k in range(1, reps)):
            return True
    return False


COPY_NGRAM = 8  # tokens (about six words) of an earlier reply a new one may not say again in a row


class CopyBan:
    """A reply may not copy its conversation's earlier replies: no run of ``n`` tokens that one of
    them said, in a row.

    Why: the demo's small model copies its own history. In a 20-turn call, from the third turn on
    every reply carried the same sentence ("So step by step, I'm going to show you some tips.",
    the repetition penalty notwithstanding): the caller heard it in every answer, and the answers
    shrank to it. :class:`pipelines.llm_repeats.SentenceRepeats` stops a reply that repeats
    itself; this keeps one from repeating the ones before, at the source: while the reply's last
    ``n - 1`` tokens are a run an earlier reply said, the token that continued that run there is
    not chosen (the transformers ``no_repeat_ngram_size`` rule, over the earlier replies instead of
    the reply itself). A common phrase of fewer than ``n`` tokens stays free.
    """

    def __init__(self, table: dict[tuple[int, ...], set[int]], n: int = COPY_NGRAM) -> None:
        self.table, self.n = table, n
        self.blocked = 0  # steps at which a copying token was ruled out

    @classmethod
    def of(cls, prompt: list[int], opening: list[int], end_ids: frozenset[int], n: int = COPY_NGRAM) -> CopyBan:
        """The earlier replies in ``prompt``: each run of tokens after ``opening`` up to an end token."""
        table: dict[tuple[int, ...], set[int]] = {}
        k, i = len(opening), 0
        while k and (i := _find(prompt, opening, i)) >= 0:
            j = i = i + k
            while j < len(prompt) and prompt[j] not in end_ids:
                j += 1
            span = prompt[i:j]
            for a in range(len(span) - n + 1):
                table.setdefault(tuple(span[a : a + n - 1]), set()).add(span[a + n - 1])
            i = j
        return cls(table, n)

    def apply(self, reply: list[int], logits: Tensor) -> Tensor:
        """``logits`` with the tokens that would continue a copied run ruled out (a copy if any)."""
        if len(reply) < self.n - 1 or not self.table:
            return logits
        banned = self.table.get(tuple(reply[1 - self.n :]))
        if not banned:
            return logits
        self.blocked += 1
        logits = logits.clone()
        logits[list(banned)] = float("-inf")
        return logits


def _find(seq: list[int], sub: list[int], start: int) -> int:
    """The index of ``sub`` in ``seq`` from ``start`` on, or -1."""
    first, k = sub[0], len(sub)
    for i in range(start, len(seq) - k + 1):
        if seq[i] == first and seq[i : i + k] == sub:
            return i
    return -1


class ChatEngine:
    """Generates from token prompts on a :class:`Llama`, keeping each conversation's cache in a slot.

    Not thread-safe by design: one thread drives it (LocalLLM's worker interleaves the generators).

    ``follow_trims``: when a conversation comes back with its oldest turns dropped (its history
    outgrew the cache), move the cached rest into place (:meth:`Llama.shift`) instead of
    re-reading it. Off: the trimmed history is re-read, and the reply equals a fresh recompute.
    """

    def __init__(self, model: Llama, *, follow_trims: bool = True) -> None:
        self.model = model
        self.follow_trims = follow_trims
        self.slots = [_Slot() for _ in range(model.slots)]
        self.busy: set[int] = set()  # slots whose request is running (see generate)
        self.last = TurnStats()

    def reset(self) -> None:
        """Forget every cached conversation (the next request is a full prefill)."""
        for s in self.slots:
            s.ids, s.prompt_len, s.used = [], 0, 0.0

    def read_ahead(self, slot_i: int, tokens: list[int]) -> bool:
        """Read ``tokens`` into slot ``slot_i`` after what it holds, ahead of the request they will begin.

        Why: a conversation's next turn starts with the template's turn opening (the end of the
        reply, the user's header: :meth:`ChatTokenizer.turn_opening`), known as soon as the reply
        ends. Read while the caller listens, those tokens are cached like any other: the next
        turn's prefill (on the critical path, between the transcript and the first token) reads
        only the caller's words and the assistant's header. Nothing is assumed: a next prompt
        that does not continue this way (a reply cut by a barge-in) matches a shorter prefix and
        the read-ahead tokens are overwritten. False (nothing read) for a busy slot or a full cache.
        """
        slot = self.slots[slot_i]
        if not tokens or slot_i in self.busy or not slot.ids or len(slot.ids) + len(tokens) > self.model.max_len:
            return False
        self.model.forward(tokens, slot_i, len(slot.ids))
        slot.ids = slot.ids + tokens
        return True

    def _follow_trim(self, prompt: list[int], matches: list[int]) -> tuple[int, int, int] | None:
        """(slot, reused tokens, dropped tokens) when ``prompt`` is a slot's conversation with a
        span cut out after the common prefix, the cache moved to match; else None.

        The new prompt must hold, after the cut, everything up to the end of the slot's last
        prompt (the same conversation, the reply kept or re-tokenised): a span found in some
        other conversation is not moved.
        """
        found = None  # (reused, slot, source position, length)
        for i, s in enumerate(self.slots):
            n = matches[i]
            if i in self.busy or n >= len(prompt) or n >= s.prompt_len:
                continue  # nothing cut: the ordinary path
            first = prompt[n]
            for b in range(n + 1, min(s.prompt_len, len(s.ids))):
                if s.ids[b] != first:
                    continue
                k = common_prefix(s.ids[b:], prompt[n:])
                if k >= MIN_FOLLOW and b + k >= s.prompt_len and (found is None or n + k > found[0]):
                    found = (n + k, i, b, k)
        if found is None:
            return None
        reused, i, b, k = found
        n = reused - k
        self.model.shift(i, b, n, k)
        self.slots[i].ids = prompt[:reused]
        return i, reused, b - n

    def _place(self, prompt: list[int], matches: list[int]) -> tuple[int, int]:
        """(slot, tokens of ``prompt`` already cached there), copying a shared prefix when branching.

        The slot with the longest common prefix continues in place when the new prompt holds
        that slot's whole last prompt: the same conversation, its reply kept whole, cut to what
        was played, or re-tokenised. Otherwise this is another conversation that merely shares
        a beginning (the system prompt), or an edited history: it takes the least recently used
        other slot, with the shared prefix's keys/values copied over (a copy, not a recompute),
        so the first conversation's cache survives. A busy slot (a request running in it) is
        never taken, only copied from: the positions it shares with this prompt stay as they are.
        """
        free = [i for i in range(len(self.slots)) if i not in self.busy]
        if not free:
            raise RuntimeError(f"all {len(self.slots)} slots are busy: admit at most that many requests at once")
        best = max(range(len(self.slots)), key=lambda i: (matches[i], self.slots[i].used))
        n = matches[best]
        others = [i for i in free if i != best or n == 0]
        if best not in self.busy and (not others or (n > 0 and n >= self.slots[best].prompt_len)):
            return best, n
        target = min(others, key=lambda i: self.slots[i].used)  # a free slot (used 0) first
        if n == 0:
            return target, 0
        m = self.model
        for ck, cv in zip(m.cache_k, m.cache_v, strict=True):
            ck[target, :, :n] = ck[best, :, :n]
            cv[target, :, :n] = cv[best, :, :n]
        self.slots[target].ids = prompt[:n]
        return target, n

    def generate(
        self,
        prompt: list[int],
        sampling: Sampling,
        *,
        eos_ids: frozenset[int],
        stop: threading.Event | None = None,
        stats: TurnStats | None = None,
        yield_prefill: bool = False,
        batched: bool = False,
        ban: CopyBan | None = None,
    ) -> Generator[int | DecodeStep | None, Tensor | None, None]:
        """Yield the reply's token ids (end token excluded); ``stats`` (and :attr:`last`) get its figures.

        Stops at an end token, after ``max_tokens``, where the reply starts going round in a loop
        (:func:`repeats_itself`), or at the first step after ``stop`` is set.
        ``yield_prefill``: also yield None after each prompt chunk but the last, so that one
        thread serving several requests can interleave them (:class:`pipelines.local_llm.LocalLLM`).
        ``batched``: a token that needs a decode step after it comes as a :class:`DecodeStep`
        (the token, its slot and position) and the generator waits to be sent that step's logits;
        the caller runs several requests' steps as one :meth:`Llama.decode`. The reply's last
        token (its ``max_tokens``-th) comes as a plain id.
        ``ban``: runs of the conversation's earlier replies this one may not copy (:class:`CopyBan`).
        A slot is claimed while its generator runs; another request never takes it meanwhile.
        """
        m = self.model
        if not prompt:
            raise ValueError("empty prompt")
        budget = m.max_len - len(prompt)
        if budget < 1:
            raise ValueError(f"the prompt has {len(prompt)} tokens; this model's cache holds {m.max_len}")
        matches = [common_prefix(s.ids, prompt) for s in self.slots]
        followed = self._follow_trim(prompt, matches) if self.follow_trims else None
        if followed is not None:
            slot_i, reused, dropped = followed
            moved = reused - matches[slot_i]
        else:
            (slot_i, reused), moved, dropped = self._place(prompt, matches), 0, 0
        self.busy.add(slot_i)
        try:
            slot = self.slots[slot_i]
            reused = min(reused, len(prompt) - 1)  # the last prompt token must run: its logits pick the first one
            stats = self.last = stats or TurnStats()
            stats.prompt_tokens, stats.reused_tokens, stats.slot = len(prompt), reused, slot_i
            stats.moved_tokens, stats.dropped_tokens = moved, dropped
            slot.ids = prompt[:reused]  # what stays valid whatever happens below
            slot.prompt_len, slot.used = len(prompt), time.monotonic()
            gen = torch.Generator().manual_seed(sampling.seed) if sampling.seed is not None else None
            seen = torch.zeros(m.cfg.vocab_size, dtype=torch.bool)
            seen[torch.tensor(prompt)] = True
            t0 = time.perf_counter()
            for pos in range(reused, len(prompt), PREFILL_CHUNK):
                if pos > reused:
                    if yield_prefill:
                        yield None
                    if stop is not None and stop.is_set():
                        stats.prefill_s, stats.finish_reason = time.perf_counter() - t0, "stop"
                        return
                end = min(pos + PREFILL_CHUNK, len(prompt))
                logits = m.forward(prompt[pos:end], slot_i, pos)
                slot.ids = prompt[:end]
            stats.prefill_s = time.perf_counter() - t0
            t1 = time.perf_counter()
            limit = min(sampling.max_tokens, budget)
            stats.finish_reason = "length"
            reply: list[int] = []
            try:
                while stats.completion_tokens < limit:
                    if ban is not None:
                        logits = ban.apply(reply, logits)
                    token = choose(logits, seen, sampling, gen)
                    if token in eos_ids:
                        stats.finish_reason = "stop"
                        break
                    stats.completion_tokens += 1
                    reply.append(token)
                    if repeats_itself(reply):  # this token is the reply's last (see repeats_itself)
                        stats.looped, stats.finish_reason = True, "stop"
                        yield token
                        break
                    if batched and stats.completion_tokens < limit:
                        seen[token] = True
                        logits = yield DecodeStep(token, slot_i, len(slot.ids))
                        if logits is None:
                            raise RuntimeError("a batched generator must be sent its step's logits")
                        slot.ids.append(token)  # the step wrote its keys/values
                        if stop is not None and stop.is_set():
                            stats.finish_reason = "stop"
                            break
                        continue
                    yield token
                    if stop is not None and stop.is_set():
                        stats.finish_reason = "stop"
                        break
                    if stats.completion_tokens >= limit:
                        break
                    seen[token] = True
                    logits = m.forward([token], slot_i, len(slot.ids))
                    slot.ids.append(token)
            finally:
                stats.decode_s = time.perf_counter() - t1
                stats.copy_blocked = ban.blocked if ban is not None else 0
        finally:
            self.busy.discard(slot_i)
