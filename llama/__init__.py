"""One Llama description and one sampler for the two Llama runtimes in this repository.

The local LLM (``pipelines/llm_model.py``: SmolLM2 on the GGUF's int4 codes, on the CPU) and the
Orpheus TTS backbone (``tts_service/orpheus``: batched slots, CUDA graphs) run different forward
passes for good reasons, but read the same ``config.json``, take the same sampling options and
sample the same way. That part lives here, beside both: ``tts_service`` never imports the apps,
and the apps should not reach into an engine package for it.

* :mod:`llama.config` - :class:`LlamaConfig` (HF ``config.json`` and GGUF metadata in and out),
  :class:`Sampling`, :class:`ConfigError`. Plain Python: importing this package needs no torch.
* :mod:`llama.hf_names` - which HF tensors make up each fused matrix (q/k/v, gate/up) of a layer:
  both loaders concatenate the same ones in the same order. Plain Python too.
* :mod:`llama.rope` - rotary-embedding tables (torch).
* :mod:`llama.attention` - grouped-query attention, query groups folded into the query length (torch).
* :mod:`llama.sampler` - repetition penalty, top-p, the draw (torch).

This package imports nothing else of the repository.
"""

from .config import ConfigError, LlamaConfig, Sampling

__all__ = ["ConfigError", "LlamaConfig", "Sampling"]
