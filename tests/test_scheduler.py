"""The vectorised running phase matches vLLM's sequential preemption loop, written plainly."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config.run import EngineConfig
from sim.memory import BlockPool
from sim.scheduler import RUNNING, Scheduler
from sim.workload.requests import Requests

BLOCK = 4


def reference(running, remaining, computed, held, free, budget):
    """vLLM v1: walk running requests; on a failed allocation preempt the tail, retry."""
    running = list(running)
    scheduled, preempted = [], []
    i = 0
    while i < len(running) and budget > 0:
        rid = running[i]
        n = min(remaining[rid], budget)
        need = max(-(-(computed[rid] + n) // BLOCK) - held[rid], 0)
        while need > free:
            victim = running.pop()
            preempted.append(victim)
            free += held[victim]
            if victim == rid:
                break
        else:
            free -= need
            scheduled.append((rid, n))
            budget -= n
            i += 1
            continue
        break
    return scheduled, preempted


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_running_phase_matches_sequential_reference(data):
    k = data.draw(st.integers(1, 12))
    computed = np.array(data.draw(st.lists(st.integers(0, 40), min_size=k, max_size=k)))
    remaining = np.array(data.draw(st.lists(st.integers(1, 30), min_size=k, max_size=k)))
    held = -(-computed // BLOCK)
    free = data.draw(st.integers(0, 20))
    budget = data.draw(st.integers(1, 120))

    pool = BlockPool(int(held.sum()) + free)
    requests = Requests(
        arrival_s=np.zeros(k), prompt_tokens=computed + remaining, output_tokens=np.full(k, 5)
    )
    s = Scheduler(EngineConfig(block_tokens=BLOCK), requests, pool)
    for rid in range(k):
        if held[rid]:
            s.blocks[rid].append(pool.allocate(int(held[rid])))
    s.computed[:], s.held[:], s.status[:] = computed, held, RUNNING
    s.running = np.arange(k)

    ids, n, preempted = s._schedule_running(budget)
    got = [(int(r), int(t)) for r, t in zip(ids, n, strict=True) if t > 0]
    want, want_preempted = reference(range(k), remaining, computed, held, free, budget)
    assert got == want
    assert sorted(preempted.tolist()) == sorted(want_preempted)
    assert list(s.waiting) == sorted(want_preempted)  # head of the queue: earliest preempted
    assert pool.num_used == s.held.sum()
