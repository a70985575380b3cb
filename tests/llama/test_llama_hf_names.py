"""The one HF-name mapping both Llama runtimes fuse by (q/k/v, gate/up), checked through both loaders."""

from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")

from llama import hf_names  # noqa: E402
from pipelines.llm_model import prepare  # noqa: E402
from tts_service.orpheus import loader  # noqa: E402
from tts_service.orpheus.config import TINY  # noqa: E402

CFG = replace(TINY, n_layers=2)


def test_parts_are_in_order_and_cover_a_layer():
    assert tuple(hf_names.layer(3)) == hf_names.PARTS
    names = [n for ns in hf_names.layer(3).values() for n in ns]
    assert len(names) == len(set(names)) == 9
    assert all(n.startswith("model.layers.3.") and n.endswith(".weight") for n in names)
    for part in hf_names.NORMS:
        assert len(hf_names.layer(0)[part]) == len(hf_names.rows(CFG, part)) == 1


@pytest.mark.parametrize("tied", [True, False])
def test_orpheus_writes_exactly_the_mapped_names_and_reads_them_back(tied):
    model = loader.random_llama(replace(CFG, tie_embeddings=tied), seed=1)
    hf = loader._ours_to_hf(model)
    expected = {hf_names.EMBED, hf_names.NORM} | ({hf_names.LM_HEAD} if not tied else set())
    for i in range(CFG.n_layers):
        for part, names in hf_names.layer(i).items():
            expected |= set(names)
            assert [hf[n].shape[0] for n in names] == list(hf_names.rows(CFG, part))
    assert set(hf) == expected
    back = loader._hf_to_ours(model.cfg, hf.__getitem__)
    sd = model.state_dict()
    assert set(back) == set(sd)
    assert all(torch.equal(back[k], sd[k]) for k in sd)


def test_the_cpu_runtime_fuses_the_same_tensors_as_orpheus():
    model = loader.random_llama(CFG, seed=2)
    hf = loader._ours_to_hf(model)
    sd = model.state_dict()
    ours = prepare(CFG, dict(hf), "fp32")
    assert torch.equal(ours["embed"], sd["tok_embeddings.weight"]) and torch.equal(ours["norm"], sd["norm.weight"])
    for i in range(CFG.n_layers):
        for part in hf_names.MATRICES:
            assert torch.equal(ours[f"{i}.{part}.weight"], sd[f"layers.{i}.{loader._OURS[part]}"])
        for part in hf_names.NORMS:
            assert torch.equal(ours[f"{i}.{part}"], sd[f"layers.{i}.{loader._OURS[part]}"])
    # the disk cache's keys (pipelines.local_llm stores prepare()'s output as it is)
    layer_keys = {f"{p}.weight" for p in hf_names.MATRICES} | set(hf_names.NORMS)
    assert set(ours) == {"embed", "norm"} | {f"{i}.{k}" for i in range(CFG.n_layers) for k in layer_keys}
    int4 = prepare(CFG, dict(hf), "int4")
    packed = {f"{p}.{s}" for p in hf_names.MATRICES for s in ("packed", "sz")}
    assert set(int4) == set(ours) | {"head.q", "head.scale"} | {f"{i}.{k}" for i in range(CFG.n_layers) for k in packed}
