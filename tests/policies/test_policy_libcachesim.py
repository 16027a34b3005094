"""Differential tests against libCacheSim (a test-only dependency: ``pip install libcachesim``).

Where both define the algorithm the same way the hits must be identical access by access:
FIFO, LRU, LFU, ARC, S3-FIFO, SIEVE and Belady. libCacheSim's LFUDA is a different
variant (see docs/policies.md) and is not compared.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_helpers import CONVERSATION, shared_trace

from policies import AccessTrace, make_eviction, replay
from policies.fastpath import next_uses
from sim.replay import read_trace

lcs = pytest.importorskip(
    "libcachesim",
    reason="libcachesim is not installed or does not load (pip install libcachesim)",
    exc_type=ImportError,
)

NEVER = 2**63 - 1
PAIRS = {
    "fifo": lcs.FIFO,
    "lru": lcs.LRU,
    "lfu": lcs.LFU,
    "arc": lcs.ARC,
    "s3fifo": lcs.S3FIFO,
    "sieve": lcs.Sieve,
    "opt": lcs.Belady,
}


def libcachesim_hits(name: str, keys: np.ndarray, capacity: int) -> np.ndarray:
    """libCacheSim's hit per access (one object of size 1 per key)."""
    # NOTE: the default hashpower (2**24 buckets) costs ~0.1 s per cache; size it to the keys
    hashpower = max(10, int(np.ceil(np.log2(len(np.unique(keys)) + 1))) + 1)
    cache, request = PAIRS[name](capacity, hashpower=hashpower), lcs.Request()
    request.obj_size = 1
    n = len(keys)
    hits = np.zeros(n, dtype=bool)
    for i, (key, nxt) in enumerate(zip(keys.tolist(), next_uses(keys).tolist(), strict=True)):
        request.obj_id = key
        request.next_access_vtime = nxt if nxt < n else NEVER
        hits[i] = cache.get(request)
    return hits


def ours(name: str, keys: np.ndarray, capacity: int) -> np.ndarray:
    trace = AccessTrace.from_requests([keys.tolist()])
    return replay(make_eviction(name, capacity=capacity, future=keys), trace, capacity)


@pytest.mark.parametrize("name", sorted(PAIRS))
@settings(max_examples=30, deadline=None)
@given(keys=st.lists(st.integers(0, 60), min_size=1, max_size=300), capacity=st.integers(20, 40))
def test_same_hits_as_libcachesim_on_random_sequences(name, keys, capacity):
    # capacity >= 20: libCacheSim's S3-FIFO admits nothing unless its small queue (10%) holds 2+
    array = np.array(keys, dtype=np.int64)
    assert ours(name, array, capacity).tolist() == libcachesim_hits(name, array, capacity).tolist()


@pytest.fixture(scope="module")
def mooncake_keys() -> np.ndarray:
    return read_trace(shared_trace(CONVERSATION)).keys


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_same_hits_as_libcachesim_on_mooncake(name, mooncake_keys):
    keys = mooncake_keys
    for capacity in (1000, 10_000):
        mine, theirs = ours(name, keys, capacity), libcachesim_hits(name, keys, capacity)
        first = int(np.argmax(mine != theirs)) if (mine != theirs).any() else -1
        assert first == -1, f"{name}@{capacity}: first difference at access {first}"
