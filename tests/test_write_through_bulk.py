"""Offload write-through in bulk (``OffloadMode.register``: the blocks registered at once, then
``Cascade.insert_each``) equals the loop that registers and copies one block at a time, kept
here as the reference with the single-block calls it made (``Cascade.insert`` through
``make_room``, S3-FIFO's inserts and releases one call each).

The withdrawn bulk path (commits c4177e7, ea059f3) chose the blocks to copy before the
first copy: a block of the batch already in DRAM was skipped, though an earlier copy's
eviction could take it out of DRAM before its turn, and the loop then copied it back
(``test_a_block_evicted_before_its_turn`` builds the case by hand). In whole runs the case
arose from a cascade bug, since fixed: an HBM victim also in SSD was copied into DRAM after
the room made there had dropped it from SSD, so its id, freed, was still in DRAM
(``test_a_victim_dropped_by_its_own_copy_down_is_not_copied``).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.fifo import FIFO
from policies.s3fifo import S3FIFO
from sim.kv.cascade import Cascade
from sim.kv.copies import CopyQueue
from sim.kv.modes.offload import OffloadMode
from sim.memory.blocks import DRAM, HBM, SSD, BlockTable
from sim.memory.tiers import Tier
from tests.test_bulk_paths import _engine, assert_same_runs, ended

POLICIES = ["s3fifo", "lru", "fifo", "arc", "lfu", "sieve", "gds", "length_aware", "heat"]


def loop_register(self: OffloadMode, blocks, hashes, start, end) -> None:
    """The per-block write-through (register, then copy to DRAM), as before the bulk path."""
    kv = self.kv
    if kv.config.kv.write_policy != "write_through":
        kv.table.register_many(blocks[start:end], hashes[start:end])
        return
    table, dram = kv.table, kv.tiers[DRAM]
    for i in range(start, end):
        b = blocks[i]
        table.register(b, int(hashes[i]))
        if not table.where[DRAM, b] and table.hash[b] and kv.cascade.insert(dram, b):
            kv.copies.add("d2h", dram.block_bytes, blocking=False)


def ref_insert(self: Cascade, tier: Tier, b: int) -> bool:
    """``Cascade.insert`` as it was: room made by ``make_room`` for one block (with the
    fix of a block the room made dropped)."""
    if tier.available < 1:
        return False
    self.make_room(tier, 1)
    if self.table.owner[b] < 0:  # (the cascade fix: the room made dropped ``b``)
        return False
    tier.add(b, self.clock.now, evictable=True)
    return True


def _reference(m: pytest.MonkeyPatch) -> None:
    """Every single-block call the bulk write-through and release replace."""
    m.setattr(OffloadMode, "register", loop_register)
    m.setattr(Cascade, "insert", ref_insert)
    m.delattr(S3FIFO, "on_insert_many")
    m.delattr(S3FIFO, "on_release_many")


def _run(case: tuple, seed: int, reference: bool):
    """One whole run (bulk or reference): its result and the manager's state at the end."""
    calls = []
    with pytest.MonkeyPatch.context() as m:
        if reference:
            _reference(m)
        else:
            real = Cascade.insert_each

            def counting(self, tier, blocks, link):
                calls.append(len(blocks))
                real(self, tier, blocks, link)

            m.setattr(Cascade, "insert_each", counting)
        return ended(case, seed), calls


CASES = st.tuples(
    st.just("offload"),
    st.sampled_from(POLICIES),
    st.sampled_from([30, 60, 150]),  # DRAM (blocks): full early, later, or never
    st.sampled_from([0, 20, 50]),  # SSD: none (DRAM's victims lost), small, larger
    st.just({}),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=CASES, seed=st.integers(0, 50))
def test_whole_runs_match_the_per_block_write_through(case, seed):
    """The same requests, timeline, summary and final state (every block array, free-id
    order, tier, policy order and queued copy) as the per-block loop."""
    bulk, calls = _run(case, seed, reference=False)
    loop, _ = _run(case, seed, reference=True)
    assert max(calls) > 1  # the bulk path ran on batches
    assert_same_runs(bulk, loop)


@pytest.mark.parametrize("seed", [2, 6, 7, 15])
def test_no_computed_block_is_in_dram_before_its_write_through(seed):
    """Seeds whose runs registered a block already in DRAM (an id freed while DRAM held it,
    before the cascade fix) register none now, and end as the loop's runs do."""
    case = ("offload", "lru", 60, 50, {})
    seen = []
    real = OffloadMode.register

    def watching(self, blocks, hashes, start, end):
        seen.extend(b for b in blocks[start:end] if self.kv.table.where[DRAM, b])
        real(self, blocks, hashes, start, end)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(OffloadMode, "register", watching)
        _engine(*case, seed=seed).run()
    assert seen == []
    (bulk, bulk_state), _ = _run(case, seed, reference=False)
    (loop, loop_state), _ = _run(case, seed, reference=True)
    pd.testing.assert_frame_equal(bulk.requests, loop.requests, check_exact=True)
    assert bulk_state == loop_state


def _cascade(dram_blocks: int, ssd_blocks: int, hbm_blocks: int = 8) -> Cascade:
    """HBM (8 blocks), DRAM and SSD, each FIFO, over one table; no mode hooks or prefetch."""
    table = BlockTable(initial=16)
    tiers = [
        Tier(i, name, blocks, 1.0, FIFO(), table)
        for i, (name, blocks) in enumerate(
            (("hbm", hbm_blocks), ("dram", dram_blocks), ("ssd", ssd_blocks))
        )
    ]
    clock = SimpleNamespace(now=1.0)
    cascade = Cascade(
        table, tiers, [True, ssd_blocks > 0, False], True, CopyQueue(None, 1.0), clock
    )
    cascade.mode = SimpleNamespace(hbm_victims=lambda victims: False, left_home=lambda b: None)
    cascade.prefetch = SimpleNamespace(spare=None, active=False)
    cascade.home = tiers[HBM]
    return cascade


def test_a_block_evicted_before_its_turn():
    """DRAM (2 blocks, FIFO) holds x, a block of the batch (in HBM, in use), then y (cached).
    Copying the batch [a, x]: a evicts x (in use: not copied down, still in HBM); at x's
    turn x is not in DRAM, so it is copied back, evicting y, which goes down to SSD."""
    cascade = _cascade(dram_blocks=2, ssd_blocks=2)
    t, (hbm, dram, _) = cascade.table, cascade.tiers
    a, x, y = (t.new(owner=0, position=i, heat=0.0) for i in range(3))
    t.register(y, 99)
    t.ref[y] = 0
    hbm.add_pinned([a, x])
    dram.add(x, 0.0, evictable=True)
    dram.add(y, 0.0, evictable=True)
    t.register_many([a, x], np.array([11, 12], dtype=np.uint64))
    cascade.insert_each(dram, [a, x], "d2h")
    assert dram.policy.victims(2) == [a, x]  # x went out first, then back in after a
    assert np.flatnonzero(t.where[SSD]).tolist() == [y]
    assert t.where[HBM, [a, x]].all() and not t.where[HBM, y]
    assert cascade.copies.queued == {("ssd_write", False): 1.0, ("d2h", False): 2.0}


def test_a_victim_dropped_by_its_own_copy_down_is_not_copied():
    """HBM victim b is also in SSD (FIFO, one block: b). Copying b into a full DRAM sends
    DRAM's v down to SSD, whose eviction takes b: b is in no tier, so it is dropped (its id
    freed); b is then not copied into DRAM after all, and nothing is queued for it."""
    cascade = _cascade(dram_blocks=1, ssd_blocks=1)
    t, (hbm, dram, ssd) = cascade.table, cascade.tiers
    b, v = (t.new(owner=0, position=i, heat=0.0) for i in range(2))
    for block, block_hash in ((b, 5), (v, 6)):
        t.register(block, block_hash)
        t.ref[block] = 0
    hbm.add(b, 0.0, evictable=True)
    ssd.add(b, 0.0, evictable=True)
    dram.add(v, 0.0, evictable=True)
    assert hbm.evict(1) == [b]
    cascade.demote(b, hbm)
    assert not t.where[:, b].any() and t.owner[b] < 0  # dropped, its id free
    assert t.where[SSD, v] and dram.resident == 0
    assert cascade.copies.queued == {("ssd_write", False): 1.0}


def test_no_copy_when_dram_is_full_of_blocks_in_use():
    """A full DRAM with nothing evictable takes no copy (and queues none)."""
    cascade = _cascade(dram_blocks=1, ssd_blocks=0)
    t, (hbm, dram, _) = cascade.table, cascade.tiers
    a, x = (t.new(owner=0, position=i, heat=0.0) for i in range(2))
    hbm.add_pinned([a])
    dram.add_pinned([x])
    cascade.insert_each(dram, [a], "d2h")
    assert not t.where[DRAM, a] and cascade.copies.queued == {}


def test_copies_queued_in_the_loops_order():
    """The first copy to DRAM is queued before the SSD write its second copy causes (the
    queue's order is the transfers' start order)."""
    cascade = _cascade(dram_blocks=2, ssd_blocks=2)
    t, (hbm, dram, _) = cascade.table, cascade.tiers
    old, a, b = (t.new(owner=0, position=i, heat=0.0) for i in range(3))
    t.register(old, 7)
    t.ref[old] = 0
    dram.add(old, 0.0, evictable=True)
    hbm.add_pinned([a, b])
    t.register_many([a, b], np.array([8, 9], dtype=np.uint64))
    cascade.insert_each(dram, [a, b], "d2h")
    assert list(cascade.copies.queued.items()) == [
        (("d2h", False), 2.0),
        (("ssd_write", False), 1.0),
    ]


def test_lost_victims_are_told_one_call_each_in_bulk_as_one_at_a_time():
    """Twelve cached HBM victims (more than ``FEW_VICTIMS``: the bulk path) with no room
    below are lost: ``on_lost`` (the cluster pool's put, a transfer a call) hears of each in
    a call of its own, in order, as demoting them one at a time tells it."""
    told = {}
    for name in ("bulk", "loop"):
        cascade = _cascade(dram_blocks=1, ssd_blocks=0, hbm_blocks=12)
        t, (hbm, dram, _) = cascade.table, cascade.tiers
        dram.add_pinned([t.new(owner=0, position=0, heat=0.0)])  # DRAM full, nothing evictable
        for i in range(12):
            b = t.new(owner=1, position=i, heat=0.0)
            t.register(b, 100 + i)
            t.ref[b] = 0
            hbm.add(b, 0.0, evictable=True)
        calls = told[name] = []
        cascade.on_lost = lambda hashes, calls=calls: calls.append(hashes.tolist())
        victims = hbm.evict(12)
        if name == "bulk":
            cascade.demote_many(victims, hbm)
        else:
            for b in victims:
                cascade.demote(b, hbm)
    assert told["bulk"] == told["loop"] == [[100 + i] for i in range(12)]
