"""Each policy against a plainly written reference: the same hits and the same victims."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_helpers import build, cost, drive, prefix_traces, traces
from policy_refs import (
    RefARC,
    RefFIFO,
    RefGDS,
    RefHeat,
    RefLengthAware,
    RefLFU,
    RefLRU,
    RefOPT,
    RefPrefixLRU,
    RefS3FIFO,
    RefSchedulerAware,
    RefSIEVE,
)

from policies import AccessTrace, Pool
from policies.registry import EVICTION

SETTINGS = settings(max_examples=40, deadline=None)

REFERENCES = {
    "fifo": ({}, lambda c, t: RefFIFO(c)),
    "lru": ({}, lambda c, t: RefLRU(c)),
    "lfu": ({}, lambda c, t: RefLFU(c)),
    "lfu-aging": ({"aging": True}, lambda c, t: RefLFU(c, aging=True)),
    "arc": ({}, lambda c, t: RefARC(c)),
    "s3fifo": ({}, lambda c, t: RefS3FIFO(c)),
    "s3fifo-wide": (
        {"small_fraction": 0.3, "ghost_fraction": 2.0, "move_threshold": 1},
        lambda c, t: RefS3FIFO(c, 0.3, 2.0, 1),
    ),
    "sieve": ({}, lambda c, t: RefSIEVE(c)),
    "gds": ({}, lambda c, t: RefGDS(c, cost)),
    "heat": ({"half_life": 4.0}, lambda c, t: RefHeat(c, 4.0)),
    "prefix_lru": ({}, lambda c, t: RefPrefixLRU(c)),
    "length_aware": ({}, lambda c, t: RefLengthAware(c)),
    "opt": ({}, lambda c, t: RefOPT(c, t.keys.tolist())),
}


def reference_run(ref, trace: AccessTrace) -> list[tuple[bool, tuple]]:
    out = []
    for keys, now in zip(trace.requests(), trace.times.tolist(), strict=True):
        if hasattr(ref, "request"):
            ref.request(keys)
        for key in keys:
            hit, victim = ref.access(key, now)
            out.append((hit, () if victim is None else (victim,)))
    return out


def test_every_policy_has_a_reference():
    covered = {case.split("-")[0] for case in REFERENCES} | {"scheduler_aware"}
    assert covered == set(EVICTION)


@pytest.mark.parametrize("case", sorted(REFERENCES))
@SETTINGS
@given(trace=traces(), capacity=st.integers(1, 7))
def test_same_hits_and_victims_as_the_reference(case, trace, capacity):
    params, make_ref = REFERENCES[case]
    policy = build(case.split("-")[0], capacity, trace, **params)
    assert drive(policy, trace, capacity) == reference_run(make_ref(capacity, trace), trace)


@pytest.mark.parametrize("case", ["prefix_lru", "length_aware", "lru", "arc"])
@SETTINGS
@given(trace=prefix_traces(), capacity=st.integers(1, 8))
def test_same_hits_and_victims_on_prefix_trees(case, trace, capacity):
    params, make_ref = REFERENCES[case]
    policy = build(case, capacity, trace, **params)
    assert drive(policy, trace, capacity) == reference_run(make_ref(capacity, trace), trace)


@SETTINGS
@given(trace=traces(), capacity=st.integers(1, 6), data=st.data())
def test_scheduler_aware_matches_lru_that_skips_upcoming_keys(trace, capacity, data):
    policy = build("scheduler_aware", capacity, trace)
    pool, ref = Pool(policy, capacity), RefSchedulerAware(capacity)
    for keys in trace.requests():
        upcoming = data.draw(st.frozensets(st.integers(0, 12), max_size=6))
        policy.set_upcoming(sorted(upcoming))
        ref.upcoming = upcoming
        for key in keys:
            hit = pool.access(key)
            assert (hit, pool.evicted[0] if pool.evicted else None) == ref.access(key)
