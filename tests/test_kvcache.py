"""Small cases of the KV manager (sim/kvcache.py) checked by hand or against a plain
reference: block counts, and the guards that choose its bulk paths."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from sim.engine import Engine
from sim.kvcache import _distinct
from sim.workload.requests import Requests
from tests.conftest import make_config


def _kv(prompt: int = 100, n: int = 2):
    config = make_config()  # 16-token blocks
    requests = Requests(np.zeros(n), np.full(n, prompt), np.full(n, 4))
    return Engine(config, requests).kv


@given(st.lists(st.integers(0, 6), max_size=8))
def test_distinct_is_true_exactly_when_no_id_repeats(ids):
    """The quick test for increasing ids must not take a repeat (``[3, 3]``) as distinct:
    the HBM cache adds the blocks of a distinct array in one call."""
    assert _distinct(np.asarray(ids, dtype=np.int64)) == (len(set(ids)) == len(ids))


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
    return Engine(config, requests).kv


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


def test_prefix_lookups_count_only_the_blocks_a_request_has_hashes_for():
    """A trace may give hashes for only part of a prompt: lookups count the hashed blocks
    (2 here), not the prompt's 6 full blocks before its last token."""
    config = make_config("kv.prefix_caching=true")
    h = [np.array([5, 6], dtype=np.uint64)]
    requests = Requests(np.zeros(1), np.array([100]), np.array([3]), prefix_hashes=h)
    result = Engine(config, requests).run()
    assert result.summary["prefix_lookup_blocks"] == 2
