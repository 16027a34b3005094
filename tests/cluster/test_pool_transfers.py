"""Pool fetches and writes, timed by hand: bytes / bandwidth + latency over the NIC, two
fetches sharing a NIC take twice as long, and the pool's aggregate bandwidth caps them all."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from policies.registry import make_eviction
from sim.kv.remote import KvPoolStore, RemoteKv
from sim.memory.links import Link

BLOCK = 2 * 2**20  # bytes per block
NIC, LATENCY = 25e9, 10e-6


def cluster(pool_bandwidth: float = 1e15, capacity: int = 64, instances: int = 2):
    env = simpy.Environment()
    policy = make_eviction("lru", capacity=capacity)
    store = KvPoolStore(capacity, BLOCK, policy, Link(env, "kv_pool", pool_bandwidth))
    remotes = [
        RemoteKv(env, store, Link(env, f"in{i}", NIC, LATENCY), Link(env, f"out{i}", NIC, LATENCY),
                 now=lambda: env.now)
        for i in range(instances)
    ]  # fmt: skip
    return env, store, remotes


def hashes(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.uint64)


def landed(env: simpy.Environment, event: simpy.Event) -> list[float]:
    times: list[float] = []
    event.callbacks.append(lambda _: times.append(env.now))
    return times


def test_one_fetch_takes_bytes_over_the_nic_plus_its_latency():
    env, store, (a, _) = cluster()
    store.insert([1, 2, 3, 4], 0.0)
    done = landed(env, a.fetch(hashes(1, 2, 3, 4)))
    env.run()
    assert done == [pytest.approx(LATENCY + 4 * BLOCK / NIC)]


def test_two_fetches_sharing_a_nic_each_take_twice_as_long():
    env, store, (a, b) = cluster()
    store.insert([1, 2, 3], 0.0)
    first, second = landed(env, a.fetch(hashes(1, 2))), landed(env, a.fetch(hashes(2, 3)))
    other = landed(env, b.fetch(hashes(1, 2)))  # another NIC: not shared
    env.run()
    both = LATENCY + 2 * (2 * BLOCK) / NIC
    assert first == [pytest.approx(both)] and second == [pytest.approx(both)]
    assert other == [pytest.approx(LATENCY + 2 * BLOCK / NIC)]


def test_the_pool_bandwidth_caps_fetches_from_every_nic():
    pool_bandwidth = 10e9  # below one NIC: the pool is the bottleneck
    env, store, (a, b) = cluster(pool_bandwidth)
    store.insert([1, 2], 0.0)
    ta, tb = landed(env, a.fetch(hashes(1, 2))), landed(env, b.fetch(hashes(1, 2)))
    env.run()
    expected = 2 * (2 * BLOCK) / pool_bandwidth  # two fetches share the pool's link
    assert ta == [pytest.approx(expected)] and tb == [pytest.approx(expected)]


def test_a_put_is_found_only_once_it_has_landed_and_only_once():
    env, store, (a, b) = cluster()
    a.put(hashes(7, 8))
    b.put(hashes(8, 9))  # 8 is on its way already: only 9 goes
    assert store.leading(hashes(7, 8)) == 0
    env.run()
    assert store.leading(hashes(7, 8, 9)) == 3
    assert (a.blocks_put, b.blocks_put) == (2, 1)
    assert a.nic_out.bytes_delivered == 2 * BLOCK and b.nic_out.bytes_delivered == BLOCK


def test_a_full_pool_evicts_by_its_policy():
    _, store, (a, _) = cluster(capacity=2)
    store.insert([1, 2], 0.0)
    a.fetch(hashes(1))  # 1 read: with LRU, 2 goes first
    store.insert([3], 1.0)
    assert store.leading(hashes(1)) == 1 and store.leading(hashes(2)) == 0
    assert store.leading(hashes(3)) == 1 and store.blocks_evicted == 1


def test_leading_stops_at_the_first_missing_hash():
    _, store, _ = cluster()
    store.insert([1, 2, 4], 0.0)
    assert store.leading(hashes(1, 2, 3, 4)) == 2
    assert store.leading(hashes(3, 1)) == 0
