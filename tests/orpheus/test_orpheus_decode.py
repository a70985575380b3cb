"""Batched decoding over the slot cache equals decoding each stream alone, token for token.

Greedy with a repetition penalty, so per-slot sampling state is part of what must not leak
between rows. Streams join mid-batch at different positions, one prompt arrives in chunks,
a slot inside the batch stays empty, and one stream skips steps (as pacing makes it).
"""

from __future__ import annotations

import torch

from tests.orpheus.orpheus_helpers import GREEDY, generate_alone, make_engine, prompt, start
from tts_service.orpheus import tokens as T
from tts_service.orpheus.scheduler import PrefillJob

N_TOKENS = 35


def test_batched_greedy_equals_single_streams_with_mid_batch_joins(tiny_model, tiny_snac):
    prompts = {"a": prompt(1, 9), "b": prompt(2, 17), "c": prompt(3, 30)}
    alone = {k: generate_alone(tiny_model, tiny_snac, ids, N_TOKENS) for k, ids in prompts.items()}

    engine = make_engine(tiny_model, tiny_snac, slots=4)
    slot = {"a": 0, "b": 2, "c": 1}  # slot 1 stays empty while a and b run: an idle row mid-batch
    got: dict[str, list[int]] = {k: [] for k in prompts}

    def step(names):
        out = engine.step([slot[k] for k in names])
        for k in names:
            got[k].append(out[slot[k]])

    start(engine, slot["a"], 1, prompts["a"])
    for _ in range(5):
        step(["a"])
    start(engine, slot["b"], 2, prompts["b"])
    for _ in range(4):
        step(["a", "b"])
    # c's prompt arrives in 3 chunks between steps (chunked prefill while a and b decode)
    engine.claim(slot["c"], 3, len(prompts["c"]), GREEDY)
    ids = prompts["c"]
    for a, b in ((0, 10), (10, 20), (20, len(ids) - 1)):
        engine.prefill([PrefillJob(slot["c"], 3, ids, a, b)])
        step(["a", "b"])
    i = 0
    while any(len(v) < N_TOKENS for v in got.values()):
        # b skips every third step (a paced stream ahead of its listener)
        names = [k for k in got if len(got[k]) < N_TOKENS and not (k == "b" and i % 3 == 2)]
        step(names)
        i += 1
    assert got == alone


def test_batched_prefill_of_several_joiners_equals_one_at_a_time(tiny_model, tiny_snac):
    """Fresh prompts of different lengths share one padded prefill call."""
    prompts = [prompt(10, 12), prompt(11, 25), prompt(12, 7)]
    alone = [generate_alone(tiny_model, tiny_snac, ids, 14) for ids in prompts]
    engine = make_engine(tiny_model, tiny_snac, slots=4)
    for s, ids in enumerate(prompts):
        engine.claim(s, s + 1, len(ids), GREEDY)
    engine.prefill([PrefillJob(s, s + 1, ids, 0, len(ids) - 1) for s, ids in enumerate(prompts)])
    got = [[], [], []]
    for _ in range(14):
        out = engine.step([0, 1, 2])
        for s in range(3):
            got[s].append(out[s])
    assert got == alone


def test_reused_slot_gives_the_same_tokens_as_a_fresh_engine(tiny_model, tiny_snac):
    ids_y = prompt(5, 11)
    fresh = generate_alone(tiny_model, tiny_snac, ids_y, N_TOKENS)
    engine = make_engine(tiny_model, tiny_snac, slots=2)
    start(engine, 0, 1, prompt(4, 40))  # stream x: a longer history in slot 0
    start(engine, 1, 2, prompt(6, 8))  # and a neighbour that keeps running
    for _ in range(30):
        engine.step([0, 1])
    engine.release(0)  # x cancelled mid-segment
    start(engine, 0, 3, ids_y)  # y reuses slot 0
    got = []
    for _ in range(N_TOKENS):
        got.append(engine.step([0, 1])[0])
    assert got == fresh


def test_generated_tokens_keep_the_frame_phase(tiny_model, tiny_snac):
    engine = make_engine(tiny_model, tiny_snac, slots=1)
    start(engine, 0, 1, prompt(7, 10))
    toks = [engine.step([0])[0] for _ in range(28)]
    for i, t in enumerate(toks):
        if t != T.END_OF_SPEECH:
            T.code_of(t, i % 7)  # raises when out of phase
        else:
            assert i % 7 == 0


def test_released_slot_row_is_zeroed_on_claim(tiny_model, tiny_snac):
    engine = make_engine(tiny_model, tiny_snac, slots=2)
    start(engine, 1, 1, prompt(8, 20))
    engine.step([1])
    cache = tiny_model.layers[0].attention.cache
    assert cache.k[1].abs().sum() > 0
    engine.release(1)
    engine.claim(1, 2, 10, GREEDY)
    assert torch.count_nonzero(cache.k[1]) == 0 and torch.count_nonzero(cache.v[1]) == 0
