"""The CUDA-graph plumbing, checked on the CPU.

* The decode step runs on the meta device: it has no data-dependent host operation (``.item()``,
  boolean indexing, ``nonzero``...), which is what CUDA graph capture requires.
* With ``torch.cuda``'s graph API replaced by a recorder, capture covers every (batch, length)
  bucket, leaves every slot's state untouched, and replaying gives the eager tokens.
"""

from __future__ import annotations

import contextlib

import torch

from tests.orpheus.orpheus_helpers import make_engine, prompt, start
from tts_service.orpheus.codec import WindowedCodec
from tts_service.orpheus.config import TINY
from tts_service.orpheus.engine import EngineOptions, OrpheusEngine
from tts_service.orpheus.loader import _empty_model
from tts_service.orpheus.tokens import HashTokenizer


def test_decode_step_needs_no_host_sync():
    model = _empty_model(TINY, torch.device("meta"), torch.float32)
    opts = EngineOptions(max_slots=8, max_len=256)
    engine = OrpheusEngine(model, WindowedCodec(None, device="meta"), HashTokenizer(), options=opts)
    with torch.inference_mode():
        for n in engine.batch_buckets:
            for L in engine.len_buckets:
                engine._step_fn(n, L)  # meta tensors raise on any data-dependent host op


class _Recorder:
    """Stands in for torch.cuda.CUDAGraph: remembers the step it captured, replays it eagerly."""

    capturing: _Recorder | None = None

    def __init__(self) -> None:
        self.key: tuple[int, int] | None = None
        self.replays = 0
        self.fn = None

    def replay(self) -> None:
        self.replays += 1
        self.fn(*self.key)


def test_graph_capture_and_replay_plumbing(tiny_model, tiny_snac, monkeypatch):
    class Stream:
        def __init__(self, *a, **k):
            pass

        def wait_stream(self, other):
            pass

    @contextlib.contextmanager
    def graph(g, pool=None):
        _Recorder.capturing = g
        yield
        _Recorder.capturing = None

    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Recorder)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())

    eager = make_engine(tiny_model, tiny_snac, slots=4)
    start(eager, 0, 1, prompt(20, 12))
    start(eager, 2, 2, prompt(21, 9))
    want = [eager.step([0, 2]) for _ in range(10)]

    engine = make_engine(tiny_model, tiny_snac, slots=4)
    real_step = engine._step_fn

    def recording_step(n, L):
        if _Recorder.capturing is not None:
            _Recorder.capturing.key, _Recorder.capturing.fn = (n, L), real_step
        real_step(n, L)

    monkeypatch.setattr(engine, "_step_fn", recording_step)
    start(engine, 0, 1, prompt(20, 12))
    start(engine, 2, 2, prompt(21, 9))
    st = engine._state
    before = [t.clone() for t in (st.cur_tok, st.pos, st.gen, st.presence)]
    cache = tiny_model.layers[0].attention.cache
    k_before = cache.k.clone()
    with torch.inference_mode():
        engine._capture_graphs()
    assert set(engine._graphs) == {(n, L) for n in engine.batch_buckets for L in engine.len_buckets}
    assert all(g.key == k for k, g in engine._graphs.items())
    after = (st.cur_tok, st.pos, st.gen, st.presence)
    assert all(torch.equal(a, b) for a, b in zip(before, after))  # captured steps commit nothing
    # Written: idle rows' scratch column, and each live row's next position (the key of the
    # token it will be fed, which its next real step rewrites before reading). Nothing else.
    changed = (cache.k != k_before).any(dim=(1, 3)).nonzero().tolist()  # [slot, position]
    allowed = {(s, engine.scratch) for s in range(4)} | {(0, 11), (2, 8)}
    assert changed and set(map(tuple, changed)) <= allowed
    got = [engine.step([0, 2]) for _ in range(10)]
    assert got == want
    assert sum(g.replays for g in engine._graphs.values()) == 10
