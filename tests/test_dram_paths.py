"""The quicker paths of a ``dram_centric`` step and of admission equal the code they replaced.

References, written plainly here: the step's read union and pinned mask (a sort and a mask
over the whole table), the prefix lookup (one dict lookup at a time, stopping at the first
miss), LRU's bulk inserts and removals (one call per key), and the block table's bulk drop.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim.kv.manager
import sim.kv.prefix
from policies.lru import LRU
from sim.kv.prefix import PrefixIndex
from sim.kv.reads import SORT_BELOW, union
from sim.memory.blocks import BlockTable
from sim.memory.tiers import Tier
from sim.run import Simulation
from sim.workload import build_requests
from tests.conftest import make_config
from tests.test_bulk_paths import TIGHT, _engine, _loop, _multi_turn, kv_state, ref_evict

DRAM_CASES = [case for case in TIGHT if case[0] == "dram_centric"]


def _small_hbm_engine(seed: int) -> Simulation:
    """``dram_centric`` with an HBM cache of 164 blocks: steps evict around pinned reads."""
    kv = {
        "mode": "dram_centric",
        "dram_capacity": "300MiB",
        "ssd_capacity": "120MiB",
        "access": {"kind": "sparse", "window_blocks": 4, "topk_blocks": 8},
    }
    config = make_config(
        "engine.max_num_seqs=12",
        "hardware.hbm.capacity=19.2GiB",
        "engine.max_batched_tokens=1024",
        f"seed={seed}",
        kv=kv,
        workload=_multi_turn(30),
    )
    requests = build_requests(config.workload, config.seed, Path("."), config.engine.block_tokens)
    return Simulation(config, requests)


def ref_union(reads: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    need = np.unique(reads)
    pinned = np.zeros(size, dtype=bool)
    pinned[need] = True
    return need, pinned


def ref_indexed_prefix(self: PrefixIndex, rid: int) -> list[int]:
    hashes = self.hashes[rid]
    limit = min(len(hashes), (int(self.lookup_tokens[rid]) - 1) // self.bt)
    ids = []
    for h in hashes[:limit].tolist():
        b = self.table.index.get(h)
        if b is None:
            break
        ids.append(b)
    return ids


def ref_lru_insert_many(self: LRU, keys, now: float = 0.0) -> None:
    for key in keys.tolist() if isinstance(keys, np.ndarray) else keys:
        self.on_insert(key, now)


def ref_lru_remove_many(self: LRU, keys) -> None:
    for key in keys:
        self.on_remove(key)


REFERENCES = [
    (sim.kv.manager, "union", ref_union),
    (PrefixIndex, "indexed_prefix", ref_indexed_prefix),
    (LRU, "on_insert_many", ref_lru_insert_many),
    (LRU, "on_remove_many", ref_lru_remove_many),
    (LRU, "on_evict_many", ref_lru_remove_many),
    (Tier, "evict", ref_evict),
    (BlockTable, "drop_many", _loop(BlockTable.drop)),
]


@settings(max_examples=100, deadline=None)
@given(
    keys=st.lists(st.integers(0, 30), max_size=40),
    known=st.lists(st.integers(0, 30), max_size=10, unique=True),
)
def test_lru_bulk_calls_match_one_call_per_key(keys, known):
    """Repeated keys and keys already known keep the order one call each gives."""
    bulk, loop = LRU(), LRU()
    for p in (bulk, loop):
        for k in known:
            p.on_insert(k)
    bulk.on_insert_many(np.asarray(keys, dtype=np.int64))
    ref_lru_insert_many(loop, np.asarray(keys, dtype=np.int64))
    assert list(bulk._order) == list(loop._order)
    gone = list(bulk._order)[::2]
    bulk.on_remove_many(gone)
    ref_lru_remove_many(loop, gone)
    assert list(bulk._order) == list(loop._order)


def test_union_is_the_sorted_distinct_reads_and_their_mark():
    kv = _engine(*DRAM_CASES[0], seed=0).kv
    for _ in range(40):
        kv.table.new(0, 0, 0.0)
    rng = np.random.default_rng(0)
    size = kv.table.size
    # none, few (sorted: under size / SORT_BELOW) and many (scanned) reads, with repeats
    for n in (0, 1, size // SORT_BELOW, size // SORT_BELOW + 1, 3 * size):
        flat = rng.integers(0, size, n)
        need, mark = union(flat, kv.table.size)
        want, pinned = ref_union(flat, kv.table.size)
        assert need.tolist() == want.tolist()
        assert mark.tolist() == pinned[: len(mark)].tolist() and not pinned[len(mark) :].any()


@settings(max_examples=60, deadline=None)
@given(
    hashes=st.lists(st.integers(1, 8), min_size=1, max_size=20),
    registered=st.sets(st.integers(1, 8)),
    prompt=st.integers(1, 400),
    first=st.sampled_from([1, 2, 3, 32]),
)
def test_indexed_prefix_stops_at_the_first_miss(hashes, registered, prompt, first):
    """Looked up ``first`` hashes at a time, then twice as many, and so on."""
    kv = _engine(*DRAM_CASES[0], seed=0).kv
    kv.index.hashes = [np.asarray(hashes, dtype=np.uint64)]
    kv.index.lookup_tokens = np.array([prompt])
    kv.table.index = {h: 100 + h for h in registered}
    with pytest.MonkeyPatch.context() as m:
        m.setattr(sim.kv.prefix, "FIRST_LOOKUPS", first)
        assert kv.index.indexed_prefix(0).tolist() == ref_indexed_prefix(kv.index, 0)


@settings(max_examples=60, deadline=None)
@given(
    hashes=st.lists(st.integers(1, 6), min_size=1, max_size=12),
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 11)), max_size=40),
)
def test_indexed_prefix_memo_follows_registrations_and_drops(hashes, ops):
    """The memoised prefix lookup, asked after each change of the index, gives a fresh one."""
    kv = _engine(*DRAM_CASES[0], seed=0).kv
    kv.index.hashes = [np.asarray(hashes, dtype=np.uint64)]
    kv.index.lookup_tokens = np.array([kv.bt * len(hashes) + 1])
    t = kv.table
    blocks = [t.new(0, i, 0.0) for i in range(len(hashes))]
    for register, i in ops:
        i %= len(hashes)
        if register:  # first writer wins: a repeated hash keeps its first block
            t.register(blocks[i], hashes[i])
        else:  # the block goes and its id comes back for the same place, unregistered
            t.drop(blocks[i])
            blocks[i] = t.new(0, i, 0.0)
        assert kv.index.indexed_prefix(0).tolist() == ref_indexed_prefix(kv.index, 0)


@pytest.mark.parametrize("case", [*DRAM_CASES, None], ids=[*(c[1] for c in DRAM_CASES), "small"])
@pytest.mark.parametrize("seed", [0, 7])
def test_dram_centric_runs_match_the_plain_code(case, seed):
    """Whole runs with every quicker path, and with each replaced by its reference."""
    runs = []
    for references in (False, True):
        with pytest.MonkeyPatch.context() as m:
            for owner, name, ref in REFERENCES if references else ():
                m.setattr(owner, name, ref)
            engine = _small_hbm_engine(seed) if case is None else _engine(*case, seed=seed)
            result = engine.run()
            runs.append((result, kv_state(engine.kv)))
    (fast, fast_state), (plain, plain_state) = runs
    pd.testing.assert_frame_equal(fast.requests, plain.requests, check_exact=True)
    pd.testing.assert_frame_equal(fast.timeline, plain.timeline, check_exact=True)
    fast.summary.pop("wall_time_s")
    plain.summary.pop("wall_time_s")
    assert fast.summary == plain.summary
    assert fast_state == plain_state
