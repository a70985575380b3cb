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
are read). An agent calls :meth:`p_end_async`: the read runs on the model's own worker thread, so
the event loop stays free, and reads that several calls ask for while one runs go together in the
next pass (:meth:`Llama.branches`) instead of queueing one by one behind a lock. Loaded once per
process (:func:`shared_text_turn`).
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

# The prompt's frame: the caller's words as what a user said on a call (SmolLM2's chat template).
SYSTEM = "You are a friendly voice assistant on a phone call."
ENDINGS = (".", "?", "!")
_MARK = "\x00caller\x00"  # where the caller's words go in the rendered template
_TRAILING = ".,?!;:-…\"' \t\n"
MAX_WORDS = 48  # a long greeting is judged by its last words: bounds the prefill
MAX_BATCH = 8  # reads in one pass at most: bounds its rows (8 x 4 x MAX_WORDS tokens)


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
        self._queue: list[tuple[str, Future[float | None]]] = []
        self._queue_lock = threading.Lock()
        self._draining = False
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="text-turn")
        self.batches: deque[int] = deque(maxlen=256)  # the last passes' sizes: the figures' and tests' view
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

    def _words(self, text: str) -> list[int] | None:
        """The prompt's tokens for ``text``'s last words; None when there are no words to judge."""
        words = text.strip().rstrip(_TRAILING).split()
        if not words or not re.search(r"\w", " ".join(words)):
            return None
        return self._encode(self._prefix + " ".join(words[-MAX_WORDS:]))

    def p_end(self, text: str) -> float | None:
        """Probability that the sentence ends here; ``None`` when there are no words to judge."""
        return self.p_end_many([text])[0]

    def p_end_many(self, texts: list[str]) -> list[float | None]:
        """:meth:`p_end` of each text, the reads that share the cached prompt in one pass."""
        prompts = [self._words(t) for t in texts]
        n = len(self._prefix_ids)
        # the words that did not merge with the frame's last token: read after the cached prompt
        shared = [i for i, ids in enumerate(prompts) if ids and ids[:n] == self._prefix_ids and len(ids) > n]
        out: list[float | None] = [None] * len(texts)
        with self._lock:
            if shared:
                if not self._cached:
                    self.model.forward(self._prefix_ids, 0, 0)
                    self._cached = True
                logits = self.model.branches([prompts[i][n:] for i in shared], 0, n)
                for i, row in zip(shared, logits, strict=True):
                    out[i] = self._ending(row)
            for i, ids in enumerate(prompts):
                if ids is not None and i not in shared:  # the words merged with the frame's last token
                    self._cached = False  # read whole: rewrites the slot
                    out[i] = self._ending(self.model.forward(ids, 0, 0))
        return out

    def _ending(self, logits: Any) -> float:
        return float(self._torch.softmax(logits.float(), dim=-1)[self._endings].sum())

    async def p_end_async(self, text: str) -> float | None:
        """:meth:`p_end` in a worker thread, batched with the reads other calls ask for meanwhile.

        Reads queue while one runs; the next pass takes all of them (at most ``MAX_BATCH``).
        """
        future: Future[float | None] = Future()
        with self._queue_lock:
            self._queue.append((text, future))
            start = not self._draining
            self._draining = True
        if start:
            self._worker.submit(self._drain)
        return await asyncio.wrap_future(future)

    def _drain(self) -> None:
        """The worker: read whatever is queued, in passes, until nothing is.

        A read whose caller gave up (its task cancelled: the caller spoke again) is skipped; one
        taken into a pass can no longer be cancelled, so setting its result cannot fail.
        """
        try:
            while True:
                with self._queue_lock:
                    taken, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                    if not taken:
                        self._draining = False
                        return
                batch = [(text, future) for text, future in taken if future.set_running_or_notify_cancel()]
                if not batch:
                    continue
                self.batches.append(len(batch))
                try:
                    results = self.p_end_many([text for text, _ in batch])
                except Exception as exc:  # every waiter hears it; the worker goes on with the next pass
                    for _, future in batch:
                        future.set_exception(exc)
                    continue
                for (_, future), p in zip(batch, results, strict=True):
                    future.set_result(p)
        except BaseException:
            with self._queue_lock:  # never leave the queue marked as drained by a worker that is gone
                self._draining = False
            raise


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
    # what several calls pausing at once pay: the phrases one after the other against one pass
    one_by_one: list[float] = []
    together: list[float] = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        for text in texts:
            model.p_end(text)
        t1 = time.perf_counter()
        model.p_end_many(texts)
        t2 = time.perf_counter()
        one_by_one.append(1000 * (t1 - t0))
        together.append(1000 * (t2 - t1))
    print(
        f"all {len(texts)} phrases: one after the other {statistics.median(one_by_one):.1f} ms p50, "
        f"in one pass {statistics.median(together):.1f} ms p50 ({args.rounds} rounds)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
