"""Properties across policies (OPT bound, LRU stack property) and worked examples."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_helpers import ALL, build, drive, traces

from policies import AccessTrace, Pool, make_eviction, replay

SETTINGS = settings(max_examples=40, deadline=None)


@SETTINGS
@given(trace=traces(max_key=15, max_requests=25), capacity=st.integers(1, 8))
def test_opt_hits_at_least_as_often_as_every_policy(trace, capacity):
    best = replay(build("opt", capacity, trace), trace, capacity).sum()
    for name in ALL:
        assert replay(build(name, capacity, trace), trace, capacity).sum() <= best, name


@SETTINGS
@given(trace=traces(max_key=15, max_requests=25))
def test_lru_hits_never_decrease_with_capacity(trace):
    hits = [replay(build("lru", c, trace), trace, c).sum() for c in range(1, 18)]
    assert hits == sorted(hits)
    assert hits[-1] == len(trace.keys) - len(set(trace.keys.tolist()))


def steps(policy, keys, capacity):
    """(hit, victim) per access of a one-key-per-request sequence."""
    trace = AccessTrace.from_requests([[k] for k in keys])
    return [
        (hit, victims[0] if victims else None) for hit, victims in drive(policy, trace, capacity)
    ]


def test_arc_worked_example():
    # Megiddo & Modha (FAST'03) Fig. 4 by hand, c = 3, p = 0:
    # 1 2 3 fill T1; 1 hits -> T2=[1]; 4: case IV(B), |T1|=2 > p, evict 2 -> B1=[2];
    # 5: case IV(A) (|L1| = 3): drop 2 from B1, evict 3 -> B1=[3];
    # 3: B1 hit, p = 0 + max(0/1, 1) = 1, |T1|=2 > 1: evict 4 -> B1=[4], T2=[1, 3];
    # 6: |T1|=1 = p and 6 is not in B2: evict T2's LRU 1 -> B2=[1];
    # 1: B2 hit, p = 1 - max(1/1, 1) = 0, evict 5 -> B1=[4, 5], T2=[3, 1];
    # 4: B1 hit, p = 0 + max(0/2, 1) = 1, |T1|=1 = p: evict 3 -> B2=[3], T2=[1, 4].
    arc = make_eviction("arc", capacity=3)
    got = steps(arc, [1, 2, 3, 1, 4, 5, 3, 6, 1, 4], 3)
    victims = [None, None, None, None, 2, 3, 4, 1, 5, 3]
    hits = [False, False, False, True, False, False, False, False, False, False]
    assert got == list(zip(hits, victims, strict=True))
    assert arc.p == 1.0
    assert (list(arc.t1), list(arc.t2), list(arc.b1), list(arc.b2)) == ([6], [1, 4], [5], [3])


def test_s3fifo_worked_example():
    # Yang et al. (SOSP'23) Algorithm 1 with libCacheSim's choices, c = 4, |S| = 1, |G| <= 3:
    # 1 enters S; 2 3 4 enter M (S is full before the first eviction); 1 hits twice (count 2);
    # 5: |M| = 3 is not above 3 and S is not empty: scan S, 1 (count 2 >= 2) moves to M with
    #    count 0; S is empty, so scan M: 2 (count 0) is evicted; 5 enters S;
    # 6: scan S: 5 (count 0) is evicted into the ghost; 6 enters S;
    # 5: ghost hit; scan S: 6 is evicted into the ghost; 5 enters M (quick demotion undone);
    # 3 hits (count 1); 7: |M| = 4 > 3: scan M: 3 goes back with count 0, 4 is evicted.
    s3 = make_eviction({"name": "s3fifo", "small_fraction": 0.25}, capacity=4)
    got = steps(s3, [1, 2, 3, 4, 1, 1, 5, 6, 5, 3, 7], 4)
    victims = [None] * 6 + [2, 5, 6, None, 4]
    hits = [False] * 4 + [True, True, False, False, False, True, False]
    assert got == list(zip(hits, victims, strict=True))
    assert (list(s3.small), list(s3.main), list(s3.ghost)) == ([7], [1, 5, 3], [6])


@pytest.mark.parametrize("name", ALL)
def test_pinned_keys_are_never_victims(name):
    trace = AccessTrace.from_requests([[k] for k in [0, 1, 2, 3, 0, 2, 4, 5]])
    policy = build(name, 8, trace)
    pool = Pool(policy, 8)
    for key in trace.keys.tolist():
        pool.access(key)
    pinned = np.zeros(4, dtype=bool)
    pinned[[0, 2]] = True
    victims = policy.victims(10, pinned)
    assert not {0, 2} & set(victims)
    assert set(victims) <= {1, 3, 4, 5}
    all_pinned = np.ones(6, dtype=bool)
    assert policy.victims(3, all_pinned) == []


def test_prefix_lru_evicts_leaves_before_parents():
    policy = make_eviction("prefix_lru")
    pool = Pool(policy, 4)
    for request in ([0, 1, 2], [0, 3]):
        policy.on_request(request)
        for key in request:
            pool.access(key)
    # LRU would evict 0 (the oldest); 0 and 1 are parents, so the leaves go first.
    assert policy.victims(4) == [2, 1, 3, 0]
    pinned = np.array([False, False, True])
    assert policy.victims(4, pinned) == [3]  # 2 pinned keeps 1 and 0


def test_gds_keeps_costly_keys_and_ages_the_rest():
    cost = np.array([1.0, 5.0, 1.0, 1.0])
    gds = make_eviction("gds", cost=cost)
    pool = Pool(gds, 2)
    assert [pool.access(k) for k in [0, 1, 2]] == [False, False, False]
    assert pool.evicted == [0]  # H(0) = 1 < H(1) = 5
    pool.access(3)
    assert pool.evicted == [2]  # L = 1: H(2) = 2 < H(1) = 5
    assert gds.victims(1) == [3]  # H(3) = L + 1 = 2 after L became 1


def test_heat_prefers_recently_hot_keys():
    heat = make_eviction({"name": "heat", "half_life": 1.0})
    for key in (0, 1):
        heat.on_insert(key, now=0.0)
    for now in (0.1, 0.2, 0.3):
        heat.on_access(0, now)
    assert heat.victims(1) == [1]  # 0 is hotter
    heat.on_access(1, now=10.0)  # 0's heat (about 4) has halved ten times since
    assert heat.victims(1) == [0]


def test_scheduler_aware_protects_upcoming_keys_until_nothing_else_is_left():
    policy = make_eviction({"name": "scheduler_aware", "base": "lru"})
    for key in range(4):
        policy.on_insert(key)
    policy.set_upcoming([0, 1])
    assert policy.victims(1) == [2]
    assert policy.victims(4) == [2, 3, 0, 1]
    policy.set_upcoming([])
    assert policy.victims(1) == [0]


def test_lfu_aging_lets_old_popular_keys_go():
    # Capacity 2; 0 is used three times, then a stream of new keys. Plain LFU keeps 0 for
    # ever; LFU-DA raises L to each victim's priority (1, 2, then 3) and 0 (priority 3,
    # older than 3's) goes when 4 arrives.
    resident = {}
    for spec in ("lfu", {"name": "lfu", "aging": True}):
        pool = Pool(make_eviction(spec), 2)
        for key in [0, 0, 0, 1, 2, 3, 4, 5]:
            pool.access(key)
        resident[str(spec)] = pool.resident
    assert resident["lfu"] == {0, 5}
    assert resident[str({"name": "lfu", "aging": True})] == {4, 5}
