"""The shared sampler: HF's penalty, top-p's cut, and a draw that is ``torch.multinomial``'s own."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from llama import Sampling  # noqa: E402
from llama.sampler import choose, penalize, top_p_draw  # noqa: E402


def test_penalty_divides_positive_logits_and_multiplies_the_rest():
    logits = torch.tensor([2.0, -2.0, 0.0, 3.0])
    seen = torch.tensor([True, True, True, False])
    assert penalize(logits, seen, 2.0).tolist() == [1.0, -4.0, 0.0, 3.0]
    per_row = penalize(logits.repeat(2, 1), seen.repeat(2, 1), torch.tensor([[2.0], [1.0]]))
    assert per_row.tolist() == [[1.0, -4.0, 0.0, 3.0], logits.tolist()]


def test_the_draw_is_multinomial_draw_for_draw():
    """Why a seeded local-LLM reply did not change when its sampler (``multinomial`` over the
    sorted, cut distribution) moved here."""
    for seed in range(20):
        logits = torch.randn(5000, generator=torch.Generator().manual_seed(seed)) * 3
        sp, order = torch.sort(torch.softmax(logits / 0.7, dim=-1), descending=True)
        sp = torch.where(torch.cumsum(sp, 0) - sp < 0.9, sp, torch.zeros_like(sp))
        a = order[torch.multinomial(sp, 1, generator=torch.Generator().manual_seed(seed))]
        b = top_p_draw(logits, 0.7, 0.9, generator=torch.Generator().manual_seed(seed))
        assert int(a) == int(b)


def test_top_p_cut_and_its_boundary_option():
    logits = torch.tensor([0.0, 0.0, -1e9]).log_softmax(-1)  # two candidates of 0.5 each
    gen = torch.Generator().manual_seed(0)
    drawn = {int(top_p_draw(logits, 1.0, 0.5, generator=gen)) for _ in range(50)}
    assert drawn == {0}  # mass before the second is 0.5: reaching top_p already, so cut
    kept = {int(top_p_draw(logits, 1.0, 0.5, generator=gen, keep_boundary=True)) for _ in range(50)}
    assert kept == {0, 1}
    assert {int(top_p_draw(logits, 1.0, 0.0, generator=gen)) for _ in range(20)} == {0}  # the top always stays


def test_choose_is_greedy_at_temperature_zero_and_reproducible_with_a_seed():
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    seen = torch.zeros(1000, dtype=torch.bool)
    seen[int(logits.argmax())] = True
    greedy = choose(logits, seen, Sampling(repetition_penalty=1.0))
    assert greedy == int(logits.argmax())
    assert choose(logits, seen, Sampling(repetition_penalty=100.0)) != greedy  # the seen best is pushed down
    s = Sampling(temperature=1.0, top_p=0.95)
    gens = [torch.Generator().manual_seed(3) for _ in range(2)]
    runs = [[choose(logits, seen, s, g) for _ in range(8)] for g in gens]
    assert runs[0] == runs[1] and len(set(runs[0])) > 1
