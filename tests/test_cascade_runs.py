"""The cascade's runs (``Cascade._insert_runs`` for write-through registration,
``Cascade._demote_evicting`` for HBM victims copied into a full DRAM, both over
``Tier.add_evicting`` and ``EvictionPolicy.insert_evicting``) equal the per-block loop they
replace, kept here as the reference: ``Cascade.insert`` for each block (one eviction, the
victim demoted, then the add) and ``Cascade.demote`` for each HBM victim.

Whole runs (9 policies, with and without SSD: with one, both runs fall back to the loop),
each tier with every policy, S3-FIFO and LRU on random states, and two hand-built batches in
which a copy's victim is a block of the batch still to come.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.base import EvictionPolicy
from policies.fifo import FIFO
from policies.lru import LRU
from policies.s3fifo import S3FIFO
from sim.kv.cascade import Cascade
from sim.kv.copies import CopyQueue
from sim.memory.blocks import DRAM, HBM, BlockTable
from sim.memory.tiers import Tier
from tests.test_bulk_paths import (
    ONLINE,
    _tier_state,
    assert_same_runs,
    ended,
    policy,
)
from tests.test_s3fifo_bulk import _drive
from tests.test_s3fifo_bulk import _state as s3fifo_state

POLICIES = ["s3fifo", "lru", "fifo", "arc", "lfu", "sieve", "gds", "length_aware", "heat"]


# --- the reference: one block at a time ---------------------------------------------------------


def loop_insert_each(self: Cascade, tier: Tier, blocks: list[int], link: str) -> None:
    """``Cascade.insert_each`` before the runs: :meth:`Cascade.insert` each block in turn."""
    where, done = self.table.where[tier.index], 0
    for b in blocks:
        if not where[b] and self.insert(tier, b):
            if not done:
                self.copies.add(link, tier.block_bytes, blocking=False)
            done += 1
    if done > 1:
        self.copies.add_each(link, tier.block_bytes, done - 1, blocking=False)


def loop_demote_evicting(self: Cascade, ids: np.ndarray, below: Tier) -> None:
    """HBM victims past the copies that fit: :meth:`Cascade.demote` each in turn."""
    for b in ids.tolist():
        self.demote(b, self.tiers[HBM])


def loop_insert_evicting(
    policy: EvictionPolicy, keys: list[int], free: int, now: float, stop=()
) -> tuple[int, list[int]]:
    """A pool's inserts one at a time: once full, one victim (planned by ``victims``, then
    forgotten by ``on_evict``, as the protocol defines an eviction), then the insert."""
    victims: list[int] = []
    for i, key in enumerate(keys):
        out = [] if i < free else policy.victims(1)
        for v in out:
            policy.on_evict(v)
        victims.extend(out)
        policy.on_insert(key, now)
        if out and out[0] in stop:
            return i + 1, victims
    return len(keys), victims


def _reference(m: pytest.MonkeyPatch) -> None:
    m.setattr(Cascade, "insert_each", loop_insert_each)
    m.setattr(Cascade, "_demote_evicting", loop_demote_evicting)


# --- whole runs ---------------------------------------------------------------------------------


def _run(case: tuple, seed: int, reference: bool):
    """One whole run (runs or reference): its result, the manager's state at the end, and
    the victims the runs took (none in the reference)."""
    taken = []
    with pytest.MonkeyPatch.context() as m:
        if reference:
            _reference(m)
        else:
            real = Tier.add_evicting

            def counting(self, blocks, now, stop=()):
                done, victims = real(self, blocks, now, stop)
                taken.append(len(victims))
                return done, victims

            m.setattr(Tier, "add_evicting", counting)
        return ended(case, seed), sum(taken)


CASES = st.tuples(
    st.just("offload"),
    st.sampled_from(POLICIES),
    st.sampled_from([30, 60]),  # DRAM (blocks): full early, or later
    st.sampled_from([0, 0, 20]),  # SSD: none (DRAM's victims lost: the runs), or some
    st.just({}),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=CASES, seed=st.integers(0, 50))
def test_whole_runs_match_the_per_block_loop(case, seed):
    """The same requests, timeline, summary and final state (every block array, free-id
    order, tier, policy order and queued copy) as one block at a time."""
    runs, taken = _run(case, seed, reference=False)
    loop, _ = _run(case, seed, reference=True)
    if case[3] == 0 and case[2] == 30:
        assert taken > 0  # the runs evicted (with SSD they do not run)
    assert_same_runs(runs, loop)


# --- one tier, every policy ---------------------------------------------------------------------


def _full_tier(name: str, seed: int) -> Tier:
    """A tier of 24 blocks holding 24 of blocks 0..29 (evictable, held, in use) or, for
    odd seeds, 20 of them (room for 4); blocks 30..59 are not resident."""
    table = BlockTable(initial=64)
    for b in range(60):
        table.new(owner=b % 3, position=b, heat=0.0)
    tier = Tier(DRAM, "dram", 24, 1.0, policy(name), table)
    rng = np.random.default_rng(seed)
    for b in rng.permutation(30)[: 24 - 4 * (seed % 2)].tolist():
        tier.add(b, float(b), evictable=bool(rng.random() < 0.8))
    for b in rng.permutation(30)[:5].tolist():
        tier.pin(b)
        if rng.random() < 0.5:
            tier.make_evictable(b, 3.0)  # a use that ended (an access)
    return tier


def _loop_add_evicting(tier: Tier, blocks: list[int], now: float, stop) -> tuple[int, list[int]]:
    """:meth:`Tier.add_evicting` as ``Cascade.insert`` did it: one eviction, then the add."""
    victims: list[int] = []
    for i, b in enumerate(blocks):
        out = []
        if tier.resident >= tier.capacity:
            if not tier.evictable:
                return i, victims
            out = tier.evict(1)
            victims.extend(out)
        tier.add(b, now, evictable=True)
        if out and out[0] in stop:
            return i + 1, victims
    return len(blocks), victims


@pytest.mark.parametrize("name", ONLINE)
@pytest.mark.parametrize("seed", range(6))
def test_add_evicting_matches_one_at_a_time(name, seed):
    """Each policy: the blocks added, victims, residents, evictable and held sets, and the
    policy's eviction order; with a stop at a resident block (seeds 2..5)."""
    runs, loop = _full_tier(name, seed), _full_tier(name, seed)
    fresh = list(range(30, 30 + 8 + 4 * seed))
    stop = set(np.flatnonzero(runs.table.where[DRAM]).tolist()[::3]) if seed >= 2 else set()
    got = runs.add_evicting(fresh, 9.0, stop)
    assert got == _loop_add_evicting(loop, fresh, 9.0, stop)
    assert got[0] > 0 and (seed % 2 == 1 or got[1])
    assert _tier_state(runs) == _tier_state(loop)


def test_add_evicting_adds_nothing_to_a_full_tier_of_blocks_in_use():
    table = BlockTable(initial=8)
    tier = Tier(DRAM, "dram", 2, 1.0, FIFO(), table)
    tier.add_pinned([table.new(0, i, 0.0) for i in range(2)])
    assert tier.add_evicting([table.new(0, 2, 0.0)], 0.0) == (0, [])
    assert tier.resident == 2 and not tier.evictable


# --- S3-FIFO and LRU in one pass ------------------------------------------------------------------

OPS = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 80)), max_size=150)


@settings(max_examples=300, deadline=None)
@given(
    ops=OPS,
    fresh=st.lists(st.integers(0, 160), unique=True, max_size=40),
    free=st.integers(0, 5),
    capacity=st.sampled_from([3, 8, 20]),  # ghosts of 2, 7 or 18 keys: overflowing, or not
    data=st.data(),
)
def test_s3fifo_insert_evicting_matches_single_calls(ops, fresh, free, capacity, data):
    """On states reached by random operations (before and after the first eviction, ghost
    hits among the keys, held keys): the same victims and state as evict(1)/on_insert."""
    one, loop = S3FIFO(capacity=capacity), S3FIFO(capacity=capacity)
    for p in (one, loop):
        _drive(p, ops)
    keys = [k for k in fresh if k not in one.freq]
    queued = list(one.small) + list(one.main)
    if not queued and free < len(keys):  # a pool with nothing to evict takes none
        free = len(keys)
    stop = set(data.draw(st.lists(st.sampled_from(queued), max_size=3))) if queued else set()
    got = one.insert_evicting(keys, free, 4.0, None, stop)
    assert got == loop_insert_evicting(loop, keys, free, 4.0, stop)
    assert s3fifo_state(one) == s3fifo_state(loop)
    assert one._version == loop._version


@settings(max_examples=300, deadline=None)
@given(ops=OPS, n=st.integers(0, 30), capacity=st.sampled_from([3, 8, 20]))
def test_s3fifo_evict_matches_victims_then_on_evict(ops, n, capacity):
    """S3-FIFO's eviction in one pass: the victims its plan gives, and the same state after
    (including when it asks for more than the queues hold)."""
    one, plan = S3FIFO(capacity=capacity), S3FIFO(capacity=capacity)
    for p in (one, plan):
        _drive(p, ops)
    victims = plan.victims(n)
    for v in victims:
        plan.on_evict(v)
    assert one.evict(n) == victims
    assert s3fifo_state(one) == s3fifo_state(plan)


@settings(max_examples=200, deadline=None)
@given(
    start=st.lists(st.integers(0, 60), unique=True, min_size=1, max_size=30),
    fresh=st.lists(st.integers(61, 120), unique=True, max_size=40),
    free=st.integers(0, 5),
    data=st.data(),
)
def test_lru_insert_evicting_matches_single_calls(start, fresh, free, data):
    one, loop = LRU(), LRU()
    for p in (one, loop):
        for k in start:
            p.on_insert(k)
    stop = set(data.draw(st.lists(st.sampled_from(start), max_size=3)))
    got = one.insert_evicting(fresh, free, 1.0, None, stop)
    assert got == loop_insert_evicting(loop, fresh, free, 1.0, stop)
    assert list(one._order) == list(loop._order)


# --- batches whose victims are blocks of the batch ---------------------------------------------


def _cascade(hbm_blocks: int, dram_blocks: int) -> Cascade:
    """HBM and DRAM (FIFO each), no SSD (DRAM's victims are lost); no mode hooks."""
    table = BlockTable(initial=32)
    sizes = (("hbm", hbm_blocks), ("dram", dram_blocks), ("ssd", 0))
    tiers = [Tier(i, name, n, 1.0, FIFO(), table) for i, (name, n) in enumerate(sizes)]
    cascade = Cascade(
        table, tiers, [True, False, False], True, CopyQueue(None, 1.0), SimpleNamespace(now=1.0)
    )
    cascade.mode = SimpleNamespace(hbm_victims=lambda victims: False, left_home=lambda b: None)
    cascade.prefetch = SimpleNamespace(spare=None, active=False)
    cascade.home = tiers[HBM]
    return cascade


def _cached(t: BlockTable, n: int, first_hash: int) -> list[int]:
    """``n`` new blocks, hashed, used by no request."""
    ids = [t.new(owner=0, position=i, heat=0.0) for i in range(n)]
    for i, b in enumerate(ids):
        t.register(b, first_hash + i)
        t.ref[b] = 0
    return ids


def test_a_registered_block_evicted_before_its_turn_is_copied_back():
    """DRAM (4, FIFO) holds x (a block of the batch, in use) oldest, then cached c0..c2.
    Registering the batch a0..a4, x, a5..a8 (10 blocks): a0 evicts x, a1..a3 evict c0..c2
    (lost: dropped in that order), a4 evicts a0 (in use: kept in HBM); at its turn x is not
    in DRAM, so it is copied back, evicting a1; a5..a8 evict a2, a3, a4, x."""
    cascade = _cascade(hbm_blocks=16, dram_blocks=4)
    t, (hbm, dram, _) = cascade.table, cascade.tiers
    x = t.new(owner=0, position=0, heat=0.0)
    c = _cached(t, 3, 100)
    a = [t.new(owner=1, position=i, heat=0.0) for i in range(9)]
    batch = [*a[:5], x, *a[5:]]
    hbm.add_pinned(batch)
    dram.add(x, 0.0, evictable=True)
    for b in c:
        dram.add(b, 0.0, evictable=True)
    t.register_many(batch, np.arange(1, 11, dtype=np.uint64))
    cascade.insert_each(dram, batch, "d2h")
    assert dram.policy.victims(4) == a[5:]
    assert t._free_ids == c and (t.owner[c] == -1).all()
    assert t.where[HBM, batch].all() and not t.where[DRAM, [*a[:5], x]].any()
    assert cascade.copies.queued == {("d2h", False): 10.0}


def test_hbm_victims_whose_dram_copy_goes_first_are_dropped_at_once():
    """HBM (10, FIFO) holds cached h0..h9; DRAM (3, FIFO) holds h3, then cached d0, d1.
    Making room for 10 in HBM evicts h0..h9; the copies down: h0 evicts h3 (a victim still
    to come: lost, dropped now), h1 and h2 evict d0 and d1 (dropped), h3 was dropped (its
    turn does nothing), h4..h9 evict h0, h1, h2, h4, h5, h6 (each dropped). Each drop tells
    ``on_lost`` its hash in a call of its own, as one at a time does."""
    cascade = _cascade(hbm_blocks=10, dram_blocks=3)
    lost: list[list[int]] = []
    cascade.on_lost = lambda hashes: lost.append(hashes.tolist())
    t, (hbm, dram, _) = cascade.table, cascade.tiers
    h = _cached(t, 10, 1)
    d = _cached(t, 2, 50)
    for b in h:
        hbm.add(b, 0.0, evictable=True)
    for b in (h[3], *d):
        dram.add(b, 0.0, evictable=True)
    cascade.make_room(hbm, 10)
    assert dram.policy.victims(3) == h[7:]
    assert t._free_ids == [h[3], *d, *h[:3], *h[4:7]]
    assert lost == [[4], [50], [51], [1], [2], [3], [5], [6], [7]]  # one call a drop, hashes
    assert cascade.copies.queued == {("d2h", True): 9.0}
    assert hbm.resident == 0 and dram.resident == 3


def test_a_victim_still_to_come_taken_by_the_last_copy_is_not_told_to_the_prefetcher():
    """HBM (10) holds cached h0..h9; DRAM (9) holds h9 (oldest), then h1..h8. Of the victims
    h0..h9 only h0 is copied down; its copy evicts h9, dropped at once: at its turn h9 is
    gone, so the prefetcher hears of h0..h8 only, as one at a time."""
    cascade = _cascade(hbm_blocks=10, dram_blocks=9)
    forgotten: list[int] = []
    cascade.prefetch = SimpleNamespace(spare=None, active=True, forget=forgotten.append)
    t, (hbm, dram, _) = cascade.table, cascade.tiers
    h = _cached(t, 10, 1)
    for b in h:
        hbm.add(b, 0.0, evictable=True)
    for b in (h[9], *h[1:9]):
        dram.add(b, 0.0, evictable=True)
    cascade.make_room(hbm, 10)
    assert forgotten == h[:9]
    assert dram.policy.victims(9) == [*h[1:9], h[0]]
    assert t._free_ids == [h[9]]
