"""The demo's local LLM, old vs new in one run: load time, first-token latency per turn, tokens/s.

* new: ``pipelines.local_llm.LocalLLM`` (our int4 Llama with the conversation KV cache), at 1 and
  2 torch threads, in-process and through its HTTP endpoint (what the agents see);
* old: transformers ``generate`` on the same GGUF (the endpoint's runtime before), which pre-fills
  the whole conversation at every turn;
* both: one 1000-token prefill (a history near the cache's end, after its window moved).

Each runtime answers the same three user turns, its own replies kept in the history (as in a
call). First token = from the request to the first generated token; tokens/s = the reply's
tokens after the first, over the time they took. Loads run in fresh processes (imports
included), "first" with an empty cache folder, "cached" with the one that start wrote.

    .venv/bin/python scripts/llm_bench.py --json out/llm_bench.json
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SYSTEM = {"role": "system", "content": "You are a helpful voice assistant. Answer in one or two short sentences."}
TURNS = ["Hi! Where is my order?", "When will it arrive?", "Can I change the delivery address?"]
MAX_TOKENS = 48

LOAD_NEW = """
import json, time
t0 = time.perf_counter()
from pipelines.local_llm import LocalLLM
llm = LocalLLM(threads=1)
llm.load(progress=lambda *_: None)
print(json.dumps({"load_s": time.perf_counter() - t0}))
"""

LOAD_OLD = """
import json, sys, time
t0 = time.perf_counter()
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from pipelines.local_llm import bundled_gguf
src, out = bundled_gguf(), sys.argv[1]
if sys.argv[2] == "first":  # what the old endpoint did on a first start: read + de-quantise the GGUF, save
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    from pathlib import Path
    from safetensors.torch import save_model
    config = model.config.to_dict(); config.pop("quantization_config", None)
    Path(out, "config.json").write_text(json.dumps(config))
    save_model(model, out + "/model.safetensors"); tok.save_pretrained(out)
else:
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
print(json.dumps({"load_s": time.perf_counter() - t0}))
"""


def _subprocess_load(code: str, *args: str, env: dict | None = None) -> float:
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if out.returncode:
        raise SystemExit(f"load failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["load_s"]


def measure_loads() -> dict:
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as old_dir:
        env = {"STREAMVOX_CACHE_DIR": cache}
        return {
            "new_first_s": _subprocess_load(LOAD_NEW, env=env),
            "new_cached_s": _subprocess_load(LOAD_NEW, env=env),
            "old_first_s": _subprocess_load(LOAD_OLD, old_dir, "first"),
            "old_cached_s": _subprocess_load(LOAD_OLD, old_dir, "cached"),
        }


def _turn_figures(t_req: float, stamps: list[float], prompt_tokens: int, reused: int | None) -> dict:
    n = len(stamps)
    rate = (n - 1) / (stamps[-1] - stamps[0]) if n > 1 and stamps[-1] > stamps[0] else float("nan")
    return {
        "first_token_ms": (stamps[0] - t_req) * 1000 if stamps else float("nan"),
        "tokens": n,
        "tokens_per_s": rate,
        "prompt_tokens": prompt_tokens,
        "reused_tokens": reused,
    }


def run_new(llm, threads: int) -> list[dict]:
    import torch

    from llama import Sampling

    llm.threads = threads
    llm.engine.reset()
    messages, turns = [SYSTEM], []
    for ask in TURNS:
        messages.append({"role": "user", "content": ask})
        t_req = time.perf_counter()
        ids = llm.fit(messages, MAX_TOKENS)
        stamps, tokens = [], []
        torch.set_num_threads(threads)
        for tok in llm.engine.generate(ids, Sampling(max_tokens=MAX_TOKENS), eos_ids=llm.tokenizer.eos_ids):
            stamps.append(time.perf_counter())
            tokens.append(tok)
        turns.append(_turn_figures(t_req, stamps, len(ids), llm.engine.last.reused_tokens))
        messages.append({"role": "assistant", "content": llm.tokenizer.tokenizer.decode(tokens)})
    return turns


async def run_endpoint(llm) -> list[dict]:
    """First content chunk over HTTP/SSE, as the agents' OpenAI client sees it."""
    import aiohttp
    from aiohttp import web

    from pipelines.local_llm import build_app
    from tts_service.localproc import free_port

    llm.threads = 1
    llm.engine.reset()
    runner = web.AppRunner(build_app(llm))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    messages, turns = [SYSTEM], []
    try:
        async with aiohttp.ClientSession() as s:
            for ask in TURNS:
                messages.append({"role": "user", "content": ask})
                body = {"messages": messages, "stream": True, "max_tokens": MAX_TOKENS}
                t_req, first, text = time.perf_counter(), None, []
                async with s.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as resp:
                    async for raw in resp.content:
                        line = raw.decode().strip()
                        if not line.startswith("data: {"):
                            continue
                        piece = json.loads(line[6:])["choices"][0]["delta"].get("content")
                        if piece:
                            first = first or time.perf_counter()
                            text.append(piece)
                turns.append({"first_token_ms": (first - t_req) * 1000, "reused_tokens": llm.engine.last.reused_tokens})
                messages.append({"role": "assistant", "content": "".join(text)})
    finally:
        await runner.cleanup()
    return turns


@functools.cache
def _old_model():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pipelines.local_llm import bundled_gguf

    src = bundled_gguf()
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    return tok, AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32).eval()


def _stamp_class():
    from transformers import StoppingCriteria

    class Stamp(StoppingCriteria):
        """Called once per generated token: records when."""

        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids, scores, **kwargs) -> bool:
            self.times.append(time.perf_counter())
            return False

    return Stamp


def run_old(threads: int) -> list[dict]:
    import torch
    from transformers import StoppingCriteriaList

    _Stamp = _stamp_class()

    torch.set_num_threads(threads)
    tok, model = _old_model()
    messages, turns = [SYSTEM], []
    for ask in TURNS:
        messages.append({"role": "user", "content": ask})
        t_req = time.perf_counter()
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
        ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
        stamp = _Stamp()
        stamps = stamp.times

        with torch.inference_mode():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=MAX_TOKENS,
                do_sample=False,
                repetition_penalty=1.1,
                pad_token_id=tok.eos_token_id,
                stopping_criteria=StoppingCriteriaList([stamp]),
            )
        reply = out[0, ids.shape[1] :]
        turns.append(_turn_figures(t_req, stamps, int(ids.shape[1]), None))
        messages.append({"role": "assistant", "content": tok.decode(reply, skip_special_tokens=True)})
    return turns


LONG_PROMPT = 1000  # tokens: a history near the cache's end, pre-filled whole after the window moved


def prefill_new(llm) -> float:
    import torch

    torch.set_num_threads(1)
    model = llm.engine.model
    t0 = time.perf_counter()
    model.forward(list(range(1000, 1000 + LONG_PROMPT)), 0, 0)
    llm.engine.reset()
    return (time.perf_counter() - t0) * 1000


def prefill_old() -> float:
    import torch

    torch.set_num_threads(1)
    _tok, model = _old_model()
    with torch.inference_mode():
        t0 = time.perf_counter()
        model(torch.arange(1000, 1000 + LONG_PROMPT)[None])
    return (time.perf_counter() - t0) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--skip-loads", action="store_true", help="skip the load-time subprocesses (~2 min)")
    args = parser.parse_args(argv)
    from pipelines.local_llm import LocalLLM

    result: dict = {"load_avg_before": os.getloadavg()}
    if not args.skip_loads:
        result["loads"] = measure_loads()
    llm = LocalLLM(threads=1)
    llm.load(progress=lambda *_: None)
    result["new_1_thread"] = run_new(llm, 1)
    result["new_2_threads"] = run_new(llm, 2)
    result["new_endpoint_1_thread"] = asyncio.run(run_endpoint(llm))
    result["old_2_threads"] = run_old(2)
    result["old_1_thread"] = run_old(1)
    result["new_1_thread_again"] = run_new(llm, 1)  # same run, after the old one: drift check
    result["prefill_ms"] = {"new_1_thread": prefill_new(llm), "old_1_thread": prefill_old()}
    result["load_avg_after"] = os.getloadavg()

    if "loads" in result:
        lo = result["loads"]
        print(
            f"load: new first {lo['new_first_s']:.1f} s, cached {lo['new_cached_s']:.1f} s; "
            f"old first {lo['old_first_s']:.1f} s, cached {lo['old_cached_s']:.1f} s"
        )
    print(f"{'runtime':<24}{'turn':>5}{'prompt':>8}{'reused':>8}{'first ms':>10}{'tok/s':>8}")
    for key in ("new_1_thread", "new_2_threads", "new_1_thread_again", "old_2_threads", "old_1_thread"):
        for i, t in enumerate(result[key], 1):
            reused = "-" if t["reused_tokens"] is None else t["reused_tokens"]
            print(
                f"{key:<24}{i:>5}{t['prompt_tokens']:>8}{reused!s:>8}"
                f"{t['first_token_ms']:>10.0f}{t['tokens_per_s']:>8.1f}"
            )
        rates = [t["tokens_per_s"] for t in result[key] if t["tokens"] > 1]
        print(f"{'':<24}median tokens/s {statistics.median(rates):.1f}")
    for i, t in enumerate(result["new_endpoint_1_thread"], 1):
        print(
            f"endpoint (HTTP SSE)      turn {i}: first piece {t['first_token_ms']:.0f} ms, reused {t['reused_tokens']}"
        )
    pf = result["prefill_ms"]
    print(f"{LONG_PROMPT}-token prefill, 1 thread: new {pf['new_1_thread']:.0f} ms, old {pf['old_1_thread']:.0f} ms")
    print(f"load average before {result['load_avg_before']}, after {result['load_avg_after']}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
