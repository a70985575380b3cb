"""The on-device sampler: phase-restricted candidates, stop at frame starts, penalty, top-p."""

from __future__ import annotations

import math

import torch

from tts_service.orpheus import sampler
from tts_service.orpheus import tokens as T

W = sampler.WINDOW


def col(token: int) -> int:
    return token - T.END_OF_SPEECH


def run(logits, gen, *, temp=0.0, top_p=1.0, penalty=1.0, presence=None):
    n = logits.shape[0]
    presence = torch.zeros(n, W, dtype=torch.bool) if presence is None else presence
    full = lambda v: torch.full((n,), float(v))  # noqa: E731
    return sampler.sample(logits, torch.tensor(gen), presence, full(temp), full(top_p), full(penalty)).tolist()


def test_greedy_picks_the_best_id_of_the_frame_position_only():
    logits = torch.zeros(2, W)
    logits[:, col(T.audio_id(7, 2))] = 5.0  # the best id overall, but of position 2
    logits[:, col(T.audio_id(9, 3))] = 3.0
    logits[:, col(T.audio_id(0, 6))] = 9.0  # and an even better one of position 6
    assert run(logits, [3, 10]) == [T.audio_id(9, 3), T.audio_id(9, 3)]  # gen 10 -> position 3


def test_stop_token_only_at_a_frame_start():
    logits = torch.zeros(3, W)
    logits[:, 0] = 100.0
    out = run(logits, [0, 7, 4])
    assert out[0] == out[1] == T.END_OF_SPEECH
    assert out[2] != T.END_OF_SPEECH and T.code_of(out[2], 4) >= 0


def test_repetition_penalty_applies_to_seen_ids_of_its_own_row():
    logits = torch.zeros(2, W)
    a, b = T.audio_id(1, 0), T.audio_id(2, 0)
    logits[:, col(a)] = 1.0
    logits[:, col(b)] = 0.8
    presence = torch.zeros(2, W, dtype=torch.bool)
    presence[0, col(a)] = True  # only row 0 has said a before
    assert run(logits, [0, 0], penalty=1.5, presence=presence) == [b, a]


def test_tiny_top_p_keeps_only_the_top_candidate():
    logits = torch.randn(4, W)
    greedy = run(logits, [1, 2, 3, 5])
    assert run(logits, [1, 2, 3, 5], temp=1.0, top_p=1e-6) == greedy


def test_sampling_follows_the_softmax():
    torch.manual_seed(0)
    n = 1000  # the share of b has a standard deviation of 0.014
    logits = torch.full((n, W), -1e9)
    a, b = T.audio_id(1, 0), T.audio_id(2, 0)
    logits[:, col(a)] = 0.0
    logits[:, col(b)] = math.log(3.0)  # p(b) = 0.75 at temperature 1
    out = run(logits, [0] * n, temp=1.0, top_p=1.0)
    share = sum(1 for t in out if t == b) / n
    assert abs(share - 0.75) < 0.05
    low = run(logits, [0] * n, temp=0.25, top_p=1.0)  # p(b) = 3^4 / (1 + 3^4) = 0.988
    assert sum(1 for t in low if t == b) / n > 0.95


def test_mark_seen_only_for_committing_rows():
    presence = torch.zeros(2, W, dtype=torch.bool)
    tokens = torch.tensor([T.audio_id(5, 1), T.audio_id(6, 1)])
    sampler.mark_seen(presence, tokens, torch.tensor([True, False]))
    assert presence[0, col(T.audio_id(5, 1))] and presence.sum() == 1
