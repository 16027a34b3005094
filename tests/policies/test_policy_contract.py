"""The contract every registered eviction policy keeps (the victim rule in policies.base)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_helpers import ALL, FUSED, MAY_FALL_SHORT, build, drive, prefix_traces, traces

from policies import AccessTrace, Pool, replay, replay_generic

SETTINGS = settings(max_examples=40, deadline=None)


@pytest.mark.parametrize("name", ALL)
def test_empty_policy_has_no_victims(name):
    policy = build(name, 4, AccessTrace.from_requests([[1, 2]]))
    assert policy.victims(3) == []
    assert policy.victims(0) == []


@pytest.mark.parametrize("name", ALL)
@SETTINGS
@given(trace=traces(), capacity=st.integers(1, 6), data=st.data())
def test_victims_are_pure_resident_unpinned_and_ordered(name, trace, capacity, data):
    twin = build(name, capacity, trace)
    policy = build(name, capacity, trace)
    checked = []

    def probe(pool: Pool, key: int) -> None:
        resident = sorted(pool.resident)
        pinned = np.array(data.draw(st.lists(st.booleans(), max_size=14)), dtype=bool)
        n = data.draw(st.integers(0, capacity + 2))
        victims = pool.policy.victims(n, pinned)
        again = pool.policy.victims(n, pinned)
        assert victims == again, "victims() must not change state"
        assert len(set(victims)) == len(victims)
        assert set(victims) <= set(resident)
        assert not any(k < len(pinned) and pinned[k] for k in victims)
        unpinned = [k for k in resident if not (k < len(pinned) and pinned[k])]
        if name in MAY_FALL_SHORT:
            assert len(victims) <= min(n, len(unpinned))
        else:
            assert len(victims) == min(n, len(unpinned))
        if n > 1:
            assert pool.policy.victims(n - 1, pinned) == victims[: n - 1]
        checked.append(len(victims))

    assert drive(policy, trace, capacity, hook=probe) == drive(twin, trace, capacity)
    assert len(checked) == len(trace.keys)


PINNED = st.none() | st.lists(st.booleans(), max_size=14).map(lambda m: np.array(m, dtype=bool))


@pytest.mark.parametrize("name", ALL)
@SETTINGS
@given(trace=traces(), capacity=st.integers(1, 6), data=st.data())
def test_evict_is_victims_then_on_evict_each(name, trace, capacity, data):
    """``evict`` (S3-FIFO's takes its steps in place) picks what ``victims`` picks and leaves
    the policy as ``on_evict`` of each does: the twins then hit and evict alike."""
    one, two = build(name, capacity, trace), build(name, capacity, trace)
    pools = Pool(one, capacity), Pool(two, capacity)
    for keys, now in zip(trace.requests(), trace.times.tolist(), strict=True):
        one.on_request(keys, now)
        two.on_request(keys, now)
        for key in keys:
            hits = [pool.access(key, now) for pool in pools]
            assert hits[0] == hits[1] and pools[0].evicted == pools[1].evicted
            if data.draw(st.booleans()):
                n, pinned = data.draw(st.integers(0, capacity)), data.draw(PINNED)
                planned = two.victims(n, pinned)
                for v in planned:
                    two.on_evict(v)
                assert one.evict(n, pinned) == planned
                for pool in pools:
                    pool.resident.difference_update(planned)
    assert one.victims(capacity) == two.victims(capacity)


@pytest.mark.parametrize("name", ALL)
@SETTINGS
@given(trace=traces(), capacity=st.integers(1, 6), data=st.data())
def test_explicit_removals_keep_the_contract(name, trace, capacity, data):
    policy = build(name, capacity, trace)

    def remove_some(pool: Pool, key: int) -> None:
        if pool.resident and data.draw(st.booleans()):
            victim = data.draw(st.sampled_from(sorted(pool.resident)))
            pool.resident.remove(victim)
            pool.policy.on_remove(victim)
        assert set(pool.policy.victims(capacity)) <= pool.resident

    drive(policy, trace, capacity, hook=remove_some)


@pytest.mark.parametrize("name", FUSED)
@SETTINGS
@given(trace=traces(max_key=20, max_requests=30), capacity=st.integers(1, 10))
def test_fused_loop_gives_the_interface_hits(name, trace, capacity):
    fast = replay(build(name, capacity, trace), trace, capacity)
    slow = replay_generic(build(name, capacity, trace), trace, capacity)
    assert fast.tolist() == slow.tolist()


@SETTINGS
@given(trace=prefix_traces(), capacity=st.integers(1, 10))
def test_fused_loop_gives_the_interface_hits_on_prefix_trees(trace, capacity):
    fast = replay(build("prefix_lru", capacity, trace), trace, capacity)
    slow = replay_generic(build("prefix_lru", capacity, trace), trace, capacity)
    assert fast.tolist() == slow.tolist()


@pytest.mark.parametrize("name", ["lfu"])
@SETTINGS
@given(trace=traces(max_key=20, max_requests=30), capacity=st.integers(1, 10))
def test_fused_loop_gives_the_interface_hits_lfu_aging(name, trace, capacity):
    fast = replay(build(name, capacity, trace, aging=True), trace, capacity)
    slow = replay_generic(build(name, capacity, trace, aging=True), trace, capacity)
    assert fast.tolist() == slow.tolist()


@pytest.mark.parametrize("name", ALL)
def test_replay_with_a_different_capacity_is_refused_or_consistent(name):
    trace = AccessTrace.from_requests([[1, 2, 3], [1, 4]])
    policy = build(name, 2, trace)
    if hasattr(policy, "capacity"):
        with pytest.raises(ValueError, match="capacity 2"):
            replay(policy, trace, 3)
    else:
        assert replay(policy, trace, 3).sum() >= 1


def test_s3fifo_does_not_replay_a_plan_made_before_a_hit():
    """S3-FIFO memoises the steps :meth:`victims` planned; a hit after the plan changes
    what those steps would do, so evicting the planned key then removes just that key, as
    if no plan had been made (a twin policy with the same history evicts the same way)."""
    from policies.s3fifo import S3FIFO

    planned, twin = S3FIFO(20), S3FIFO(20)  # S holds 2
    for policy in (planned, twin):
        for key in range(6):
            policy.on_insert(key, float(key))
    (victim,) = planned.victims(1)
    for policy in (planned, twin):
        policy.on_access(victim)
        policy.on_access(victim)  # now at the move threshold: a scan would promote it
        policy.on_evict(victim)
    assert victim not in planned.freq
    assert planned.victims(6) == twin.victims(6)
