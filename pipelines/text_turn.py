"""The caller's words as an end-of-turn signal: does a small language model expect the sentence to end here?

Why: at a pause the acoustic model (smart-turn) hears only the voice, and on callers it never heard
it both cuts mid-thought pauses and calls finished questions unfinished (docs/BENCHMARKS.md,
"Turn-taking and voice-to-voice"). The words say what the pitch does not: after "Could you send
me" or "I need to cancel" a reader expects more words, after "What is the capital of France" a
question mark. :class:`TextTurnModel` asks SmolLM2 (the demo's own LLM, already on the machine):
with the caller's transcript so far as a chat user message, minus its trailing punctuation, how
much probability the next token puts on ending the sentence (``.``, ``?``, ``!``) or the message.

That number is relative, not calibrated: an untuned 135M model gives a finished one-word answer
("Sure.") little more than a finished sentence's tail gets, so :class:`pipelines.turn_judge.TurnJudge`
uses it with thresholds chosen on the caller corpus, beside the transcript's own cue (a trailing
"to", "um", a comma).

Cost: one short prefill per pause (the system prompt's keys stay cached, only the caller's words
are read), in the calling thread under a lock; an agent calls :meth:`p_end_async` so the event
loop stays free. Loaded once per process (:func:`shared_text_turn`).
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The prompt's frame: the caller's words as what a user said on a call (SmolLM2's chat template).
SYSTEM = "You are a friendly voice assistant on a phone call."
ENDINGS = (".", "?", "!")
_MARK = "\x00caller\x00"  # where the caller's words go in the rendered template
_TRAILING = ".,?!;:-…\"' \t\n"
MAX_WORDS = 48  # a long greeting is judged by its last words: bounds the prefill


class TextTurnModel:
    """``p_end(text)``: the model's probability that the caller's sentence ends after ``text``."""

    def __init__(self, model: Any, tokenizer: Any, *, system: str = SYSTEM) -> None:
        import torch

        self._torch = torch
        self.model, self.tokenizer = model, tokenizer
        rendered = tokenizer.render([{"role": "system", "content": system}, {"role": "user", "content": _MARK}])
        self._prefix = rendered[: rendered.index(_MARK)]
        self._prefix_ids = self._encode(self._prefix)
        vocab = tokenizer.tokenizer
        ids = {vocab.token_to_id(t) for t in ENDINGS} | set(tokenizer.eos_ids)
        self._endings = torch.tensor(sorted(i for i in ids if i is not None), dtype=torch.long)
        if len(self._prefix_ids) + 4 * MAX_WORDS > model.max_len:
            raise ValueError(f"a {model.max_len}-token cache is too small for the prompt and {MAX_WORDS} words")
        self._lock = threading.Lock()
        self._cached = False  # whether the model's slot 0 holds the prefix's keys and values
        # the first forward pays the kernels' set-up (much longer than a pause): not the first caller
        self.p_end("Hello, how are you today?")

    @classmethod
    def load(cls, source: str | Path | None = None, progress: Callable[[str], Any] = print) -> TextTurnModel:
        """SmolLM2 (or ``source``: a GGUF or HF folder) with one 256-token slot, one thread."""
        from pipelines.local_llm import LocalLLM

        model, tokenizer = LocalLLM(source, slots=1, max_len=256, threads=1, dense="bf16").open_model(progress)
        model.drop_dense()  # a few dozen tokens a call: the int4 kernel alone, at a fraction of the memory
        # (dense="bf16" above: the copy is dropped, so it is not first widened to float32)
        return cls(model, tokenizer)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.tokenizer.encode(text, add_special_tokens=False).ids

    def p_end(self, text: str) -> float | None:
        """Probability that the sentence ends here; ``None`` when there are no words to judge."""
        words = text.strip().rstrip(_TRAILING).split()
        if not words or not re.search(r"\w", " ".join(words)):
            return None
        ids = self._encode(self._prefix + " ".join(words[-MAX_WORDS:]))
        n = len(self._prefix_ids)
        with self._lock:
            if ids[:n] == self._prefix_ids and len(ids) > n:
                if not self._cached:
                    self.model.forward(self._prefix_ids, 0, 0)
                    self._cached = True
                logits = self.model.forward(ids[n:], 0, n)
            else:  # the words merged with the frame's last token: read it all (rewrites the slot)
                self._cached = False
                logits = self.model.forward(ids, 0, 0)
        probs = self._torch.softmax(logits.float(), dim=-1)
        return float(probs[self._endings].sum())

    async def p_end_async(self, text: str) -> float | None:
        """:meth:`p_end` in a worker thread (a prefill is tens of milliseconds of one core)."""
        return await asyncio.to_thread(self.p_end, text)


_shared: dict[str, TextTurnModel] = {}
_shared_lock = threading.Lock()


def shared_text_turn(source: str | Path | None = None, progress: Callable[[str], Any] = print) -> TextTurnModel:
    """One model per process and source: every call of an agent judges with the same weights."""
    key = str(source or "")
    with _shared_lock:
        if key not in _shared:
            _shared[key] = TextTurnModel.load(source, progress)
        return _shared[key]


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelines.text_turn "Could you send me" "What is the capital of France?"``: each
    phrase's probability and time, and the process's memory: what the judge pays per pause."""
    import argparse
    import statistics
    import time

    parser = argparse.ArgumentParser(prog="python -m pipelines.text_turn", description=main.__doc__)
    parser.add_argument("texts", nargs="*", help="phrases as a transcript would give them")
    parser.add_argument("--model", help="a GGUF or HF folder (default: the bundled SmolLM2)")
    parser.add_argument("--rounds", type=int, default=5, help="times each phrase is judged (default 5)")
    args = parser.parse_args(argv)
    texts = args.texts or ["Could you send me?", "What is the capital of France?", "I need to cancel.", "No."]

    def rss_mb() -> int:
        with open("/proc/self/status") as f:
            return int(f.read().split("VmRSS:")[1].split()[0]) // 1024

    before = rss_mb()
    from pipelines.local_llm import LLMLoadError

    try:
        model = TextTurnModel.load(args.model, progress=print)
    except LLMLoadError as exc:
        raise SystemExit(f"text_turn: {exc}") from None
    times: list[float] = []
    for text in texts:
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            p = model.p_end(text)
            times.append(1000 * (time.perf_counter() - t0))
        print(f"{'-' if p is None else f'{p:.3f}'}  {text}")
    print(f"{statistics.median(times):.1f} ms p50 a phrase ({len(times)} calls); RSS {before} -> {rss_mb()} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
