"""Allocating for many requests at once (``sim/kv/allocation.py``) equals one
``KvManager.allocate`` call each, in order: whole runs against the loop, the id order of
``BlockTable.new_in_turn`` against drops and ``new`` calls one at a time, and a hand case of
the shortfalls."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim.kv.allocation
from sim.kv.allocation import shortfalls, victims_are_lost
from sim.kv.manager import KvManager
from sim.memory.blocks import BlockTable
from tests.test_bulk_paths import _engine, kv_state


def loop_allocate_each(self: KvManager, rids: np.ndarray, tokens: np.ndarray) -> None:
    """The reference: one ``allocate`` per request, in order."""
    for rid, n in zip(rids.tolist(), tokens.tolist(), strict=True):
        self.allocate(rid, n)


def _run(case: tuple, seed: int, reference: bool):
    """A whole run (bulk or loop): its result, its final state and the blocks each bulk
    call evicted (the small engines grow few requests at once: bulk from one on)."""
    evicting = []
    with pytest.MonkeyPatch.context() as m:
        m.setattr(sim.kv.allocation, "FEW_ALLOCATIONS", 1)
        if reference:
            m.setattr(KvManager, "allocate_each", loop_allocate_each)
        else:
            real = sim.kv.allocation.shortfalls

            def counting(counts, free):
                short = real(counts, free)
                evicting.append(sum(short))
                return short

            m.setattr(sim.kv.allocation, "shortfalls", counting)
        engine = _engine(*case, seed=seed)
        result = engine.run()
        result.summary.pop("wall_time_s")
        return result, kv_state(engine.kv), evicting


def _same(case: tuple, seed: int) -> list[int]:
    bulk, bulk_state, evicting = _run(case, seed, reference=False)
    loop, loop_state, _ = _run(case, seed, reference=True)
    pd.testing.assert_frame_equal(bulk.requests, loop.requests, check_exact=True)
    pd.testing.assert_frame_equal(bulk.timeline, loop.timeline, check_exact=True)
    assert bulk.summary == loop.summary
    assert bulk_state == loop_state
    return evicting


# (mode, eviction, DRAM blocks, SSD blocks, kv extras): tiers tight enough that allocations evict
BULK = [
    ("dram_centric", "lru", 150, 0, {}),
    ("dram_centric", "s3fifo", 140, 0, {"write_policy": "write_back"}),
    ("dram_centric", "arc", 150, 0, {"access": "full"}),
    ("hbm", "lru", 0, 0, {}),
    ("hbm", "sieve", 0, 0, {}),
]
LOOP = [  # victims copied below: one allocate call each
    ("dram_centric", "lru", 150, 40, {}),
    ("offload", "s3fifo", 60, 0, {}),
]


@pytest.mark.parametrize("case", BULK, ids=[f"{c[0]}-{c[1]}" for c in BULK])
def test_bulk_allocations_match_the_loop(case):
    """The same requests, timeline, summary and final state (block arrays, free-id order,
    tiers and their policies' orders), with bulk allocations that evicted."""
    evicting = [n for seed in (0, 1) for n in _same(case, seed)]
    assert sum(n > 0 for n in evicting) >= 5


@pytest.mark.parametrize("case", LOOP, ids=[f"{c[0]}-{c[1]}" for c in LOOP])
def test_victims_kept_below_take_the_loop(case):
    assert not victims_are_lost(_engine(*case, seed=0).kv)
    assert _same(case, 0) == []


@settings(max_examples=12, deadline=None)
@given(
    case=st.tuples(
        st.sampled_from(["dram_centric", "hbm"]),
        st.sampled_from(["lru", "fifo", "s3fifo", "lfu", "gds", "heat"]),
        st.sampled_from([100, 150, 300]),
        st.just(0),
        st.sampled_from([{}, {"access": "full"}, {"write_policy": "write_back"}]),
    ),
    seed=st.integers(0, 50),
)
def test_any_run_matches_the_loop(case, seed):
    _same(case, seed)


def test_shortfalls_by_hand():
    """6 free: 3 fit (3 left), 5 lack 2 (0 left), then 2 and 4 lack all theirs."""
    assert shortfalls([3, 5, 2, 4], 6) == [0, 2, 2, 4]
    assert shortfalls([1, 1], 5) == [0, 0]


@settings(max_examples=200, deadline=None)
@given(
    history=st.lists(st.tuples(st.booleans(), st.integers(0, 1000)), max_size=60),
    turns=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 4)), min_size=1, max_size=6),
)
def test_new_in_turn_takes_the_ids_of_drops_and_news_one_at_a_time(history, turns):
    """Two tables with the same past (blocks made and dropped); for each turn, one drops
    its freed ids and makes its blocks one ``drop`` and ``new`` at a time, the other took
    every drop at once and then ``new_in_turn``: the same ids, arrays, free list and size."""
    one, bulk = BlockTable(initial=4), BlockTable(initial=4)
    live: list[int] = []
    for make, pick in history:
        for t in (one, bulk):
            if make or not live:
                b = t.new(owner=pick, position=pick % 7, heat=0.5)
            else:
                t.drop(live[pick % len(live)])
        if make or not live:
            live.append(b)
        else:
            live.remove(live[pick % len(live)])
    owners, starts, counts, freed, mine = [], [], [], [], []
    heat = np.linspace(0.0, 1.0, sum(n for n, _ in turns))
    at = 0
    for j, (count, drops) in enumerate(turns):
        gone = [live.pop() for _ in range(min(drops, len(live)))]
        for b in gone:
            one.drop(b)
        mine.append([one.new(j, 10 + i, float(heat[at + i])) for i in range(count)])
        owners.append(j)
        starts.append(10)
        counts.append(count)
        freed.append(gone)
        at += count
    bulk.drop_many(np.asarray([b for ids in freed for b in ids], dtype=np.int64))
    assert bulk.new_in_turn(owners, starts, counts, freed, heat) == mine
    assert bulk._free_ids == one._free_ids and bulk.size == one.size
    n = one.size
    for name in ("ref", "owner", "position", "heat", "hash", "access_count", "dirty"):
        assert getattr(bulk, name)[:n].tolist() == getattr(one, name)[:n].tolist(), name
