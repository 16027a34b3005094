"""The scheduler's rules (sim/instance/rules.py): each against a hand-computed case, and the
list form equal to the array form (the step planner and the scheduler share them)."""

from __future__ import annotations

from collections import deque

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config.run import EngineConfig
from sim.instance.rules import (
    admit_fcfs,
    admitted_tokens,
    blocks_for,
    max_sequence_tokens,
    share_budget,
    share_budget_list,
)


def test_the_budget_goes_to_running_requests_in_order():
    # 10 tokens among needs of 4, 5, 3: the first two get all, the third the 1 left
    assert share_budget(np.array([4, 5, 3]), 10).tolist() == [4, 5, 1]
    assert share_budget_list([4, 5, 3], 10) == [4, 5, 1]
    assert share_budget_list([4, 5, 3], 3) == [3, 0, 0]
    assert share_budget_list([1, 1, 1], 3) == [1, 1, 1]  # the usual decode step: all fit


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 5000), max_size=40), st.integers(0, 20_000))
def test_the_list_form_is_the_array_form(remaining, budget):
    array = share_budget(np.array(remaining, dtype=np.int64), budget)
    assert share_budget_list(list(remaining), budget) == array.tolist()
    assert sum(array.tolist()) == min(sum(remaining), budget)


def test_admission_takes_what_the_budget_allows_or_refuses_without_chunking():
    assert admitted_tokens(1000, 0, 512, chunked=True) == 512
    assert admitted_tokens(1000, 600, 512, chunked=True) == 400  # a prefix hit of 600 tokens
    assert admitted_tokens(1000, 0, 512, chunked=False) is None  # its prompt does not fit
    assert admitted_tokens(400, 0, 512, chunked=False) == 400


def test_the_longest_sequence_is_the_tightest_limit():
    engine = EngineConfig(block_tokens=16, max_batched_tokens=4096, chunked_prefill=True)
    assert max_sequence_tokens(engine, 100) == 1601  # 100 blocks of 16, plus the one sampled
    limited = engine.model_copy(update={"max_model_len": 1000})
    assert max_sequence_tokens(limited, 100) == 1000
    unchunked = engine.model_copy(update={"chunked_prefill": False})
    assert max_sequence_tokens(unchunked, 1000) == 4096
    assert blocks_for(33, 16) == 3 and blocks_for(32, 16) == 2 and blocks_for(0, 16) == 0


def test_admission_is_first_come_first_served_and_stops_at_the_first_refusal():
    waiting = deque([1, 2, 3, 4])
    answers = {1: 100, 2: 0, 3: None, 4: 50}  # 2 goes loading; 3 is refused: 4 must wait
    started = []
    ids, tokens = admit_fcfs(waiting, 500, 8, lambda rid, budget: answers[rid], started.append)
    assert (ids, tokens, started, list(waiting)) == ([1], [100], [1], [3, 4])
    # the budget and the seats end it too
    waiting = deque([5, 6, 7])
    assert admit_fcfs(waiting, 300, 8, lambda rid, budget: min(200, budget)) == ([5, 6], [200, 100])
    waiting = deque([5, 6, 7])
    assert admit_fcfs(waiting, 900, 2, lambda rid, budget: 10) == ([5, 6], [10, 10])
    assert list(waiting) == [7]
