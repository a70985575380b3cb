"""The local LLM's forward time by rows, per dtype of its dense prefill copy (bf16, fp32).

    .venv/bin/python scripts/llm_prefill.py [--rows 1,16,17,32,100,500] [--json out/llm_prefill.json]

Why: the int4 model decodes with torch's int4 kernel and runs prefills of more than
``INT4_MAX_ROWS`` tokens as a dense GEMM. Whether that GEMM should be bf16 or float32 depends on
the CPU (:func:`pipelines.llm_model.dense_dtype`): on one without native bf16 torch emulates it.
This prints both side by side on the machine it runs on (best of three, one thread, the bundled
SmolLM2), what ``auto`` picks there, and one batched decode step of 1-4 conversations (best of
five): what calls decoding at once cost the server's worker. The figures belong in docs/BENCHMARKS.md ("Local LLM").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,8,16,17,24,32,64,100,500", help="comma-separated token counts")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    try:
        rows = [int(r) for r in args.rows.split(",")]
    except ValueError:
        parser.error(f"--rows must be comma-separated integers, got {args.rows!r}")
    if not rows or min(rows) < 1 or max(rows) > 1500:
        parser.error("--rows must lie within 1..1500 (the cache holds 2,048 tokens)")

    import torch

    from pipelines.llm_model import Llama, dense_dtype, native_bf16
    from pipelines.local_llm import LocalLLM

    torch.set_num_threads(1)
    cpu = torch.backends.cpu.get_cpu_capability()
    print(f"CPU {cpu}, native bf16: {native_bf16()}, auto picks {dense_dtype('auto')}", file=sys.stderr)
    base, _tokenizer = LocalLLM(slots=1).open_model(progress=lambda line: print(line, file=sys.stderr))
    doc: dict = {"cpu": cpu, "native_bf16": native_bf16(), "auto": dense_dtype("auto"), "ms": {}}
    for kind in ("bf16", "fp32"):
        model = Llama(base.cfg, dict(base.tensors), slots=1, max_len=2048, dense=kind)
        model.forward([1] * 8, 0, 0)  # kernels' set-up
        figures = {}
        for n in rows:
            best = min(_time(model, n) for _ in range(3))
            figures[n] = round(best * 1000, 1)
        doc["ms"][kind] = figures
        print(f"{kind}: " + "  ".join(f"{n}: {ms:.0f} ms" for n, ms in figures.items()), flush=True)
        del model
    # one batched decode step (Llama.decode) of 1-4 conversations: what calls decoding at once cost
    model = Llama(base.cfg, dict(base.tensors), slots=4, max_len=512, dense="auto")
    for slot in range(4):
        model.forward([1] * 8, slot, 0)
    steps = {}
    for b in range(1, 5):
        best = min(_time_decode(model, b, 8 + i) for i in range(5))
        steps[b] = round(best * 1000, 1)
    doc["decode_step_ms"] = steps
    print("decode step, conversations at once: " + "  ".join(f"{b}: {ms:.0f} ms" for b, ms in steps.items()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1))
        print(f"written: {args.json}", file=sys.stderr)
    return 0


def _time(model, n: int) -> float:
    t0 = time.perf_counter()
    model.forward([7] * n, 0, 100)
    return time.perf_counter() - t0


def _time_decode(model, b: int, at: int) -> float:
    t0 = time.perf_counter()
    model.decode([7] * b, list(range(b)), [at] * b)
    return time.perf_counter() - t0


if __name__ == "__main__":
    raise SystemExit(main())
