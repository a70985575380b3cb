"""Fixtures of the Orpheus suite: tiny random models (CPU, fp32), built once per session.

The whole folder is skipped when the optional dependencies (``streamvox[orpheus]``) are absent.
Torch runs on one thread: the ops of a tiny model are too small to gain from two, and on a
shared 2-core machine a second thread mostly waits for a busy core.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("snac")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model():
    from tts_service.orpheus.loader import random_llama

    return random_llama("tiny", dtype="fp32", seed=0)


@pytest.fixture(scope="session")
def tiny_snac():
    from tts_service.orpheus.loader import random_snac

    return random_snac("tiny", seed=0)
