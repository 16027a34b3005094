"""The scheduler's rule, written once: the scheduler (:mod:`sim.instance.scheduler`) and the
run-ahead planners (:mod:`sim.instance.runs`, :mod:`sim.instance.step_planner`) call these.
Each rule that runs over numpy arrays in one caller and over lists in another has both forms
side by side (tests/test_rules.py checks them equal)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np

from sim.config.run import EngineConfig


def share_budget(remaining: np.ndarray, budget: int) -> np.ndarray:
    """Tokens each running request gets this step, in order: all it still needs while the
    token ``budget`` lasts (``remaining``: what each needs)."""
    if int(remaining.sum()) <= budget:  # everyone gets all it needs (the usual decode step)
        return remaining
    return np.clip(budget - (np.cumsum(remaining) - remaining), 0, remaining)


def share_budget_list(remaining: list[int], budget: int) -> list[int]:
    """:func:`share_budget` over a list of ints."""
    if sum(remaining) <= budget:
        return remaining
    tokens, left = [], budget
    for r in remaining:
        tokens.append(min(max(left, 0), r))
        left -= r
    return tokens


def admitted_tokens(total: int, start: int, budget: int, chunked: bool) -> int | None:
    """Tokens a waiting request computes in its first step, starting at token ``start`` of
    its ``total``, with ``budget`` tokens left; None if the budget refuses it (no chunked
    prefill, and its rest does not fit)."""
    if not chunked and total - start > budget:
        return None
    return min(total - start, budget)


def admit_fcfs(
    waiting: deque[int], budget: int, seats: int,
    admit_one: Callable[[int, int], int | None], started: Callable[[int], None] = lambda rid: None,
) -> tuple[list[int], list[int]]:  # fmt: skip
    """Admit the queue's head while ``budget`` tokens and ``seats`` last: ``admit_one(rid,
    budget)`` gives its tokens this step, 0 if it went loading (it leaves the queue, not
    running), None if it cannot be admitted (admission stops: first come, first served).
    Returns the admitted requests and their tokens; ``started`` is told of each."""
    ids: list[int] = []
    tokens: list[int] = []
    while waiting and budget > 0 and len(ids) < seats:
        rid = waiting[0]
        n = admit_one(rid, budget)
        if n is None:
            break
        waiting.popleft()
        if n == 0:
            continue
        started(rid)
        ids.append(rid)
        tokens.append(n)
        budget -= n
    return ids, tokens


def max_sequence_tokens(engine: EngineConfig, pool_blocks: int) -> int:
    """Longest sequence (prompt + output) an engine with a KV pool of ``pool_blocks`` can
    ever hold; a longer request is rejected on arrival."""
    limits = [pool_blocks * engine.block_tokens + 1]
    if engine.max_model_len:
        limits.append(engine.max_model_len)
    if not engine.chunked_prefill:
        limits.append(engine.max_batched_tokens)
    return min(limits)


def blocks_for(tokens: int, block_tokens: int) -> int:
    """Blocks that hold ``tokens`` tokens."""
    return -(-tokens // block_tokens)
