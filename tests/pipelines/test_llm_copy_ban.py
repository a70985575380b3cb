"""``llm_chat.CopyBan`` on token ids alone: which runs of the earlier replies it finds, and what it rules out.

The real model's case (a reply that copied its history and no longer does) is in test_local_llm.py.
"""

from __future__ import annotations

import torch

from pipelines.llm_chat import CopyBan

OPEN, END = [1, 2], frozenset({9})  # a reply opening and an end token, as a chat template gives them


def _prompt(*replies: list[int]) -> list[int]:
    """System and user tokens (50s), then each reply after the opening, closed by the end token."""
    ids = [50, 51]
    for r in replies:
        ids += [60, 61, *OPEN, *r, 9]
    return [*ids, 60, 61, *OPEN]  # the new reply's opening: nothing after it yet


def test_runs_of_earlier_replies_only_are_found() -> None:
    ban = CopyBan.of(_prompt([10, 11, 12, 13], [20, 21, 22]), OPEN, END, n=3)
    assert ban.table == {(10, 11): {12}, (11, 12): {13}, (20, 21): {22}}  # not the user's 60 61, nor across replies


def test_the_token_that_would_continue_a_copy_is_ruled_out_and_nothing_else() -> None:
    ban = CopyBan.of(_prompt([10, 11, 12, 13], [10, 11, 14]), OPEN, END, n=3)
    logits = torch.zeros(32)
    out = ban.apply([7, 10, 11], logits)
    assert torch.isinf(out[12]) and torch.isinf(out[14]) and out[13] == 0 and out[10] == 0
    assert logits[12] == 0  # the caller's tensor is left as it was
    assert ban.blocked == 1
    assert ban.apply([10, 13], logits) is logits and ban.apply([11], logits) is logits  # no run, too short
    assert ban.blocked == 1


def test_no_reply_no_opening_no_ban() -> None:
    assert CopyBan.of(_prompt(), OPEN, END).table == {}
    assert CopyBan.of(_prompt([10, 11, 12]), [], END).table == {}
    assert CopyBan.of(_prompt([10, 11]), OPEN, END, n=3).table == {}  # shorter than a run
