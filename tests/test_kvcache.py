"""Small cases of the KV manager (sim/kv/manager.py) checked by hand or against a plain
reference: block counts, and the guards that choose its bulk paths."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from sim.kv.modes.dram_centric import distinct_ids
from sim.run import Simulation
from sim.workload.requests import Requests
from tests.conftest import make_config


def _kv(prompt: int = 100, n: int = 2):
    config = make_config()  # 16-token blocks
    requests = Requests(np.zeros(n), np.full(n, prompt), np.full(n, 4))
    return Simulation(config, requests).kv


@given(st.lists(st.integers(0, 6), max_size=8))
def test_distinct_is_true_exactly_when_no_id_repeats(ids):
    """The quick test for increasing ids must not take a repeat (``[3, 3]``) as distinct:
    the HBM cache adds the blocks of a distinct array in one call."""
    assert distinct_ids(np.asarray(ids, dtype=np.int64)) == (len(set(ids)) == len(ids))


def test_need_counts_the_blocks_missing_for_the_tokens_never_fewer_than_none():
    """16-token blocks: 33 tokens take 3 blocks; a request holding 3 needs 0 more for any
    count up to 48 tokens (not a negative count for fewer), and 1 more for 49."""
    kv = _kv()
    assert kv.bt == 16
    assert kv.need(0, 33) == 3 and kv.need(0, 0) == 0
    kv.allocate(0, 33)
    assert kv.held[0] == 3 and len(kv.blocks[0]) == 3
    assert [kv.need(0, t) for t in (1, 16, 17, 48, 49)] == [0, 0, 0, 0, 1]
    before = kv.available
    kv.allocate(0, 10)  # already held: nothing changes
    assert kv.held[0] == 3 and kv.available == before


def _prefix_kv(*overrides: str, prompt: int = 65, hashes=(11, 12, 13, 14), n: int = 2):
    """A manager with prefix caching: ``n`` requests with the same prompt hashes."""
    config = make_config("kv.prefix_caching=true", *overrides)
    h = [np.array(hashes, dtype=np.uint64) for _ in range(n)]
    requests = Requests(np.zeros(n), np.full(n, prompt), np.full(n, 4), prefix_hashes=h)
    return Simulation(config, requests).kv


def test_a_prefix_swapped_out_of_hbm_is_no_hit_in_hbm_mode():
    """``hbm`` mode looks prefixes up in HBM only: once the request that computed a prefix
    is swapped out (its blocks, still registered, now in DRAM), another request with the
    same prompt finds no hit, not even its first block."""
    kv = _prefix_kv()
    kv.allocate(0, 65)
    kv.register(0, 64)  # 4 full blocks, all hashed
    assert len(kv.match(1)) == 4
    assert kv.preempt(0, swap=True)
    assert len(kv.match(1)) == 0


def test_a_swap_out_copies_only_the_blocks_not_already_in_dram():
    """``offload`` with write-through keeps a DRAM copy of each registered block: swapping
    its request out sends only the other blocks over the device-to-host link."""
    kv = _prefix_kv("kv.mode=offload", "kv.write_policy=write_through")
    kv.allocate(0, 65)  # 5 blocks
    kv.register(0, 32)  # the first 2 are written through to DRAM
    kv.flush_copies()
    d2h = kv.links.d2h
    before = d2h.bytes_submitted
    assert kv.preempt(0, swap=True)
    assert d2h.bytes_submitted - before == 3 * kv.tiers[1].block_bytes


def _resident(kv, tier: int) -> list[int]:
    """The blocks the table places in ``tier``; the tier's own count must agree."""
    blocks = np.flatnonzero(kv.table.where[tier, : kv.table.size]).tolist()
    assert kv.tiers[tier].resident == len(blocks)
    return blocks


def test_swapping_out_a_request_that_shares_its_prefix_leaves_the_prefix_in_hbm():
    """Requests 0 and 1 share 4 prefix blocks (a hit of 1 on 0's registered prompt), and have
    a 5th block each. Swapped out first, 0 copies all 5 to DRAM, but the 4 shared ones stay
    in HBM for 1; swapped out next, 1 copies only its own block. Swapped in, 0 copies all 5
    back (the shared ones keep a DRAM copy for 1), and 1 then only its own: vLLM's swap,
    which frees a GPU block at its last reference."""
    kv = _prefix_kv()  # hbm mode, 16-token blocks
    kv.allocate(0, 65)
    kv.register(0, 64)
    kv.take(1, kv.match(1))
    kv.allocate(1, 65)
    shared, own0, own1 = kv.blocks[0][:4], kv.blocks[0][4], kv.blocks[1][4]
    assert kv.blocks[1][:4] == shared and own0 != own1
    block, d2h, h2d = kv.tiers[1].block_bytes, kv.links.d2h, kv.links.h2d

    assert kv.preempt(0, swap=True)
    assert _resident(kv, 0) == sorted([*shared, own1])
    assert _resident(kv, 1) == sorted([*shared, own0])
    assert d2h.bytes_submitted == 5 * block
    assert kv.preempt(1, swap=True)
    assert _resident(kv, 0) == []
    assert _resident(kv, 1) == sorted([*shared, own0, own1])
    assert d2h.bytes_submitted == 6 * block

    kv.swap_in(0)
    assert _resident(kv, 0) == sorted([*shared, own0])
    assert _resident(kv, 1) == sorted([*shared, own1])
    assert h2d.bytes_submitted == 5 * block
    kv.swap_in(1)
    assert _resident(kv, 0) == sorted([*shared, own0, own1])
    assert _resident(kv, 1) == []
    assert h2d.bytes_submitted == 6 * block
    assert kv.swap.holds == {} and kv.swapped == set()


def test_the_second_holder_of_a_prefix_needs_dram_room_for_its_own_blocks_only():
    """DRAM of 6 blocks: swapped-out 0 fills 5 of them, with the 4 prefix blocks it shares
    with 1. Swapping 1 out (5 blocks) takes the one slot left, for its own block, rather
    than falling back to recompute."""
    kv = _prefix_kv("kv.dram_capacity=12MiB")
    kv.allocate(0, 65)
    kv.register(0, 64)
    kv.take(1, kv.match(1))
    kv.allocate(1, 65)
    assert kv.preempt(0, swap=True)
    assert kv.tiers[1].available == 1
    assert kv.preempt(1, swap=True)
    assert _resident(kv, 1) == sorted({*kv.blocks[0], *kv.blocks[1]})
    assert kv.swapped == {0, 1}


def test_a_shared_prefix_leaves_hbm_when_its_last_running_holder_finishes():
    """Request 0 is swapped out while 1 shares its 4 prefix blocks in HBM; when 1 finishes,
    only the swapped-out 0 holds them, in DRAM, so they leave HBM (nothing is cached in use),
    and 0's swap-in copies all 5 of its blocks back."""
    kv = _prefix_kv()
    kv.allocate(0, 65)
    kv.register(0, 64)
    kv.take(1, kv.match(1))
    kv.allocate(1, 65)
    assert kv.preempt(0, swap=True)
    assert kv.swap_in_blocks(0) == 1
    kv.release(1)
    assert _resident(kv, 0) == []
    assert kv.swap_in_blocks(0) == 5
    kv.swap_in(0)
    assert _resident(kv, 0) == sorted(kv.blocks[0]) and _resident(kv, 1) == []
    assert kv.links.h2d.bytes_submitted == 5 * kv.tiers[1].block_bytes


def test_a_prefix_hit_on_a_swapped_out_request_needs_no_copy_at_its_swap_in():
    """``offload`` finds prefixes in DRAM: request 1 hits the 4 blocks that swapped-out 0
    keeps there and loads them into HBM; 0's swap-in then copies only its 5th block."""
    kv = _prefix_kv("kv.mode=offload")
    kv.allocate(0, 65)
    kv.register(0, 64)
    assert kv.preempt(0, swap=True)
    hits = kv.match(1)
    assert hits.blocks.tolist() == kv.blocks[0][:4] and (hits.tiers == 1).all()
    assert kv.take(1, hits)  # a load
    kv.env.run()
    block, h2d = kv.tiers[1].block_bytes, kv.links.h2d
    assert h2d.bytes_submitted == 4 * block
    kv.swap_in(0)
    assert h2d.bytes_submitted == 5 * block
    assert _resident(kv, 0) == sorted(kv.blocks[0])
    assert kv.table.ref[kv.blocks[0][:4]].tolist() == [2] * 4


def test_a_swap_out_keeps_its_own_written_through_copies_when_dram_is_full():
    """DRAM of 6 blocks holds 5 written-through copies, request 0's 3 (the oldest) and 1's
    2. Swapping 0 (5 blocks) out needs 2 more slots, so one copy is evicted: 1's oldest,
    not one of 0's own, which the swap-out keeps (DRAM then holds 0's 5 blocks and 1's
    other copy, full but not over)."""
    config = make_config(
        "kv.prefix_caching=true", "kv.mode=offload", "kv.write_policy=write_through",
        "kv.dram_capacity=12MiB",
    )  # fmt: skip
    h = [np.array([11, 12, 13], dtype=np.uint64), np.array([21, 22], dtype=np.uint64)]
    requests = Requests(np.zeros(2), np.array([65, 33]), np.full(2, 4), prefix_hashes=h)
    kv = Simulation(config, requests).kv
    assert kv.tiers[1].capacity == 6
    kv.allocate(0, 65)
    kv.register(0, 48)
    kv.allocate(1, 33)
    kv.register(1, 32)
    assert kv.preempt(0, swap=True)
    assert _resident(kv, 1) == sorted([*kv.blocks[0], kv.blocks[1][1]])


def test_prefix_lookups_count_only_the_blocks_a_request_has_hashes_for():
    """A trace may give hashes for only part of a prompt: lookups count the hashed blocks
    (2 here), not the prompt's 6 full blocks before its last token."""
    config = make_config("kv.prefix_caching=true")
    h = [np.array([5, 6], dtype=np.uint64)]
    requests = Requests(np.zeros(1), np.array([100]), np.array([3]), prefix_hashes=h)
    result = Simulation(config, requests).run()
    assert result.summary["prefix_lookup_blocks"] == 2
