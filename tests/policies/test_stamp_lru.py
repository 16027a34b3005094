"""StampLRU (LRU as numpy stamps, the HBM cache of dram_centric) evicts exactly as LRU."""

from __future__ import annotations

import numpy as np
import pytest

from policies.lru import LRU
from policies.stamp_lru import SCALAR_STEPS, StampLRU


@pytest.mark.parametrize("seed", range(20))
def test_stamp_lru_matches_lru_on_random_operations(seed):
    rng = np.random.default_rng(seed)
    ref, fast = LRU(), StampLRU()
    members: list[int] = []
    for _ in range(400):
        op = rng.integers(6)
        if op == 0 or not members:  # insert one
            key = int(rng.integers(3000))
            if key not in members:
                ref.on_insert(key)
                fast.on_insert(key)
                members.append(key)
        elif op == 1:  # insert several
            keys = [k for k in rng.choice(3000, 5, replace=False).tolist() if k not in members]
            for k in keys:
                ref.on_insert(k)
            fast.on_insert_many(np.asarray(keys, dtype=np.int64))
            members.extend(keys)
        elif op == 2:  # a step's accesses (may repeat a key)
            keys = rng.choice(members, min(len(members), 6)).tolist()
            ref.on_access_many(keys)
            fast.on_access_many(np.asarray(keys, dtype=np.int64))
        elif op == 3:
            key = members.pop(int(rng.integers(len(members))))
            ref.on_remove(key)
            fast.on_remove(key)
        else:  # victims, with or without a pinned mask, then evict some of them
            pinned = rng.random(int(rng.integers(0, 3500))) < 0.3 if op == 4 else None
            n = int(rng.integers(0, 8))
            victims = ref.victims(n, pinned)
            assert fast.victims(n, pinned) == victims
            for v in victims[: int(rng.integers(len(victims) + 1))]:
                ref.on_evict(v)
                fast.on_evict(v)
                members.remove(v)


@pytest.mark.parametrize("stale", [0, 1, SCALAR_STEPS - 1, SCALAR_STEPS, 3 * SCALAR_STEPS])
def test_one_victim_past_a_stale_head_is_lrus(stale):
    """One victim is looked for one entry at a time, then by a pass: either way LRU's."""
    ref, fast = LRU(), StampLRU()
    keys = list(range(stale + 3))
    for k in keys:
        ref.on_insert(k)
    fast.on_insert_many(np.asarray(keys, dtype=np.int64))
    for p in (ref, fast):
        p.on_access_many(keys[:stale])  # the oldest ``stale`` log entries go stale
    for _ in range(len(keys)):
        victim = ref.victims(1)
        assert fast.victims(1) == victim
        ref.on_evict(victim[0])
        fast.on_evict(victim[0])
    assert fast.victims(1) == [] == ref.victims(1)
