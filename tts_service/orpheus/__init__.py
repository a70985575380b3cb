"""Orpheus-class LLM-backbone streaming TTS: a Llama decoder emitting SNAC codec tokens.

Modules, each small enough to read in one sitting:

* ``config``    - model shapes (the real 3B and a tiny test config), sampling defaults (the class
  and its ``config.json`` I/O are the shared :mod:`llama` ones);
* ``tokens``    - token ids <-> SNAC codes with phase checks, prompt building;
* ``model``     - the Llama forward over a slot-based static KV cache (gpt-fast style);
* ``sampler``   - per-slot temperature / top-p / repetition penalty on the device (over
  :mod:`llama.sampler`);
* ``codec``     - SNAC decoding over sliding windows, batched across streams;
* ``loader``    - local HF / SNAC checkpoints, ``--random-weights tiny|3b``;
* ``engine``    - slots, chunked prefill, the batched decode step (CUDA graphs on GPU), ticks;
* ``scheduler`` - pure bookkeeping: which stream gets which slot, pacing, admission;
* ``runtime``   - the asyncio adapter the aiohttp server drives (same surface as the Piper one);
* ``bench``     - ``streamvox bench engine``: concurrency sweep on one device.

torch and snac are optional dependencies (``pip install streamvox[orpheus]``); nothing outside
this package imports it, so the Piper server works without them.
"""
