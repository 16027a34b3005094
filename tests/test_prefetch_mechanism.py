"""``sim.kv.prefetch.Prefetcher`` on hand-built states: the bookkeeping the engine runs only hit
in passing (hit marks, in-flight copies, the lookahead, the heat candidates, the budget, the
two-hop SSD staging and the eviction pins), each against a hand-computed answer."""

from collections import deque
from types import SimpleNamespace

import numpy as np
import simpy

from policies.base import PrefetchView
from sim.config.kv import SparseAccess
from sim.instance.scheduler import Batch
from sim.kv.access import AccessModel
from sim.kv.prefetch import Prefetcher
from sim.memory.blocks import DRAM, HBM, SSD

BB = 10  # bytes per block


class FakeLink:
    """A link whose every transfer takes ``seconds``; records the bytes asked."""

    def __init__(self, env, seconds):
        self.env, self.seconds, self.asked = env, seconds, []

    def transfer(self, nbytes, chunk=None):
        self.asked.append(nbytes)
        return self.env.timeout(self.seconds)


class FakeHbm:
    """``free_slots`` free slots; ``evict`` records its pin mask and frees nothing."""

    def __init__(self, where, free_slots):
        self.where, self.free_slots, self.pins = where, free_slots, []

    def add(self, b, now, evictable=True):
        self.where[HBM, b] = True
        self.free_slots -= 1

    def evict(self, n, pinned):
        self.pins.append(pinned.copy())
        return []


def fake_kv(capacity=8, free_slots=8, mode="dram_centric"):
    env = simpy.Environment()
    where = np.zeros((3, capacity), dtype=bool)
    table = SimpleNamespace(
        capacity=capacity, size=capacity, where=where, ref=np.zeros(capacity, dtype=np.int64)
    )
    inserted = []
    return SimpleNamespace(
        env=env,
        table=table,
        mode=SimpleNamespace(hbm_is_cache=mode == "dram_centric"),
        tiers={HBM: FakeHbm(where, free_slots), DRAM: SimpleNamespace(block_bytes=BB)},
        links=SimpleNamespace(h2d=FakeLink(env, 2.0), ssd_read=FakeLink(env, 1.0)),
        copies=SimpleNamespace(piece_bytes=BB),
        step_reads=np.zeros(0, dtype=np.int64),
        inserted=inserted,
        cascade=SimpleNamespace(
            insert=lambda tier, b: inserted.append(b), demote=lambda b, tier: None
        ),
    )


def test_used_counts_each_staged_block_once():
    """A staged block read twice is one hit; ids past the staged range (the table grew) and
    never-staged ids are no hits; the step's hit count follows the run's."""
    kv = fake_kv(capacity=4)
    kv.table.where[DRAM, [1, 2]] = True
    p = Prefetcher(kv, "queue_lookahead", None)
    p._send([1, 2])
    assert p.blocks == 2 and p.bytes == 2 * BB
    p.used([1, 3, 4, 9])  # 4 and 9: ids the staged range does not cover yet
    p.used(np.array([1, 2]))
    assert p.hits == 2 and p._step_hits == 2
    assert p.summary()["prefetch_wasted"] == 0


def test_forget_drops_the_mark_and_the_copy_in_flight():
    """A staged block that leaves HBM is no later hit, and no reader waits for its copy."""
    kv = fake_kv()
    kv.table.where[DRAM, [1, 2]] = True
    p = Prefetcher(kv, "queue_lookahead", None)
    p._send([1, 2])
    p.forget(1)
    assert p.waits([1]) == []
    assert len(p.waits([2])) == 1
    p.used([1, 2])
    assert p.hits == 1 and p.summary()["prefetch_wasted"] == 1


def test_ssd_staging_takes_both_hops_and_waits_list_each_copy_once():
    """DRAM blocks land after one H2D copy (2 s); SSD-only blocks after the SSD read (1 s)
    and then the H2D copy (2 s); only blocks still on SSD and not yet in DRAM are put in
    DRAM on the way; waits() gives each copy once, ignores other blocks, and ends empty."""
    kv = fake_kv()
    w = kv.table.where
    w[DRAM, [1, 2]] = True
    w[SSD, [3, 4, 5]] = True
    p = Prefetcher(kv, "queue_lookahead", None)
    p._send([1, 2, 3, 4, 5])
    assert kv.links.h2d.asked == [2 * BB]  # the SSD hop starts when the clock runs
    dram_copy, ssd_copy = p.inflight[1], p.inflight[3]
    assert p.inflight[2] is dram_copy and p.inflight[4] is p.inflight[5] is ssd_copy
    assert set(p.waits([0, 1, 2, 3, 4, 7])) == {dram_copy, ssd_copy}
    assert len(p.waits([0, 1, 2, 3, 4, 7])) == 2

    def meanwhile():  # during the SSD read: 4 reaches DRAM another way, 5 leaves the SSD
        yield kv.env.timeout(0.5)
        w[DRAM, 4] = True
        w[SSD, 5] = False

    kv.env.process(meanwhile())
    kv.env.run(until=dram_copy)
    assert kv.env.now == 2.0
    kv.env.run(until=ssd_copy)
    assert kv.env.now == 3.0
    assert kv.inserted == [3]
    assert kv.links.ssd_read.asked == [3 * BB] and kv.links.h2d.asked == [2 * BB, 3 * BB]
    assert p.waits([1, 2, 3, 4, 5]) == [] and not p.inflight


def test_turn_ended_tells_the_policy_about_session_zero():
    """Session ids start at 0 (-1: no session); a finished turn of session 0 is kept, with
    only its hashed (shareable) blocks."""
    table = SimpleNamespace(hash=np.array([0, 7, 9, 0, 5], dtype=np.uint64))
    kv = SimpleNamespace(table=table, env=SimpleNamespace(now=4.0))
    p = Prefetcher(kv, "next_turn", np.array([0, -1]))
    p.turn_ended(1, [1, 2])  # no session: nothing to keep
    assert len(p.policy.protected(4.0)) == 0
    p.turn_ended(0, [0, 1, 2, 3])
    assert sorted(p.policy.protected(4.0).tolist()) == [1, 2]


def test_waiting_looks_at_the_first_lookahead_requests_only():
    """The first ``depth`` waiting requests count, held or swapped ones included in that
    count but skipped; each listed request gives its prefix blocks below HBM, and those in
    HBM are kept."""
    capacity = 40
    where = np.zeros((3, capacity), dtype=bool)
    where[HBM, [11, 31]] = True
    prefixes = {5: [1, 2], 6: [3], 7: [10, 11, 12], 8: [20], 9: [30, 31]}
    kv = SimpleNamespace(
        table=SimpleNamespace(where=where),
        swapped={6},
        held={5: 2, 6: 0, 7: 0, 8: 0, 9: 0},
        match=lambda rid: SimpleNamespace(blocks=np.array(prefixes[rid], dtype=np.int64)),
    )
    p = Prefetcher(kv, {"name": "queue_lookahead", "depth": 4}, None)
    waiting, keep = p._waiting(SimpleNamespace(waiting=deque([5, 6, 7, 8, 9])))
    assert [w.tolist() for w in waiting] == [[10, 12], [20]]
    assert keep == [11]


def test_heat_candidates_are_the_next_decode_steps_middles():
    """Per sequence that decodes again next step: the middle of its blocks then (sink 1,
    window 2) and min(top-k, middle). Sequence 1: 111 + 1 tokens now, 113 next step, 8
    blocks of 16: middle 101..105, k 3. Sequence 2: 62 tokens next, 4 blocks: middle [201],
    k 1. Sequence 3 samples no token; sequence 4 has generated its last."""
    spec = SparseAccess(kind="sparse", sink_blocks=1, window_blocks=2, topk_blocks=3)
    kv = SimpleNamespace(
        access=AccessModel(spec, np.random.default_rng(0)),
        bt=16,
        blocks={r: list(range(100 * r, 100 * r + 12)) for r in range(5)},
    )
    p = Prefetcher(kv, "heat", None)
    batch = Batch(
        ids=np.array([1, 2, 3, 4]),
        new_tokens=np.array([1, 1, 1, 1]),
        context=np.array([111, 60, 70, 70]),
        samples=np.array([True, True, False, True]),
        preempted=np.zeros(4, dtype=bool),
    )
    scheduler = SimpleNamespace(generated=np.array([0, 0, 0, 0, 5]), output=np.full(5, 6))
    cands, ks = p._batch(scheduler, batch)
    assert [c.tolist() for c in cands] == [[101, 102, 103, 104, 105], [201]]
    assert ks == [3, 1]


def test_wanted_skips_dead_resident_and_repeated_keys_within_the_budget():
    """Best priority first (ties in proposal order): a key in HBM, outside the table or
    proposed again is skipped, and a 30-byte budget takes three 10-byte blocks."""
    kv = fake_kv(capacity=6)
    w = kv.table.where
    w[HBM, 0] = w[DRAM, [1, 2, 3, 4]] = w[SSD, 5] = True
    p = Prefetcher(kv, {"name": "queue_lookahead", "max_bytes_per_step": 3 * BB}, None)
    proposed = [(0, 9.0), (6, 8.0), (-1, 8.5), (1, 1.0), (2, 5.0), (2, 5.0), (3, 4.0)]
    proposed += [(4, 3.0), (5, 7.0)]
    assert p._wanted(proposed) == [5, 2, 3]


def test_staging_never_evicts_this_steps_reads_the_lookaheads_or_spared_blocks():
    """With HBM full, staging asks eviction for room with this step's reads, the wanted
    blocks, the lookahead's HBM prefix and the blocks spared for sessions all pinned; what
    it cannot free is not staged."""
    kv = fake_kv(capacity=8, free_slots=1)
    w = kv.table.where
    w[DRAM, [4, 5]] = True
    kv.step_reads = np.array([0], dtype=np.int64)
    p = Prefetcher(kv, "queue_lookahead", None)
    p._keep = [1]
    p.spare = np.zeros(8, dtype=bool)
    p.spare[2] = True
    view = PrefetchView(now=0.0, waiting=[], batch=[], topk=[], heat=None)
    assert p._stage([(4, 1.0), (5, 0.5)], view) == 1
    (pins,) = kv.tiers[HBM].pins
    assert np.flatnonzero(pins).tolist() == [0, 1, 2, 4, 5]
    assert w[HBM].nonzero()[0].tolist() == [4] and p.blocks == 1
