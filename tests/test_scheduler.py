"""The running phase (fast path or preempting loop) matches vLLM's loop, written plainly."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.instance.scheduler import RUNNING
from sim.run import Simulation
from sim.workload.requests import Requests
from tests.conftest import make_config
from tests.test_tiering import check_accounting

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

    requests = Requests(
        arrival_s=np.zeros(k), prompt_tokens=computed + remaining, output_tokens=np.full(k, 5)
    )
    pool = int(held.sum()) + free
    if pool == 0:
        return
    config = make_config(f"engine.block_tokens={BLOCK}", f"engine.kv_pool_blocks={pool}")
    s = Simulation(config, requests).scheduler
    for rid in range(k):
        s.kv.allocate(rid, int(computed[rid]))
    s.computed[:], s.status[:] = computed, RUNNING
    s.running = np.arange(k)

    ids, n, preempted = s._schedule_running(budget)
    got = [(int(r), int(t)) for r, t in zip(ids, n, strict=True) if t > 0]
    want, want_preempted = reference(range(k), remaining, computed, held, free, budget)
    assert got == want
    assert sorted(preempted.tolist()) == sorted(want_preempted)
    assert list(s.waiting) == sorted(want_preempted)  # head of the queue: earliest preempted
    # the preempted requests' full blocks stay cached (evictable), the rest is held
    home = s.kv.home
    assert home.resident - len(home.evictable) == s.kv.held.sum() and home.resident <= pool


def test_loaded_requests_behind_a_preempted_head_give_their_blocks_back():
    # offload, a 256-block pool and shared documents: requests that loaded their prefix from
    # DRAM wait holding it while preempted requests are queued in front of them; once nothing
    # ran, the head could not fit and the run stopped ("no progress"). They now give the
    # blocks back to the cache, and every request finishes.
    from tests.test_tiering import shared_documents

    requests = shared_documents(n=60, docs=8, doc_tokens=2048, rate=20.0, seed=0, output=64)
    config = make_config("engine.kv_pool_blocks=256", kv={"mode": "offload"})
    engine = Simulation(config, requests)
    result = engine.run()
    assert result.summary["preemptions"] > 0 and result.summary["dram_hit_rate"] > 0
    assert result.requests.finish_s.notna().all()
    check_accounting(engine)
