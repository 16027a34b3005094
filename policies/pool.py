"""A single demand-cached pool that drives a policy through its interface, and trace replay.

``Pool`` is the reference implementation of the call protocol in :mod:`policies.base`; a
tier follows the same order of calls. ``replay`` runs a whole access trace through one
pool, using the policy's fused loop when it has one: an optional method
``fast_replay(trace, capacity) -> hit mask``, called on a fresh policy, that must give
exactly the hits of ``replay_generic`` (the tests check each one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from policies.base import EvictionPolicy


@dataclass(frozen=True)
class AccessTrace:
    """Block accesses grouped in requests: ``keys[starts[r]:starts[r + 1]]`` is request ``r``.

    ``times[r]`` is request ``r``'s arrival time (seconds); requests are in arrival order.
    """

    keys: np.ndarray
    starts: np.ndarray
    times: np.ndarray

    @classmethod
    def from_requests(
        cls, requests: Sequence[Sequence[int]], times: Sequence[float] | None = None
    ) -> AccessTrace:
        """Build from lists of keys (times default to 0, 1, 2, ...)."""
        lengths = np.array([len(r) for r in requests], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        flat = [k for r in requests for k in r]
        keys = np.array(flat, dtype=np.int64)
        when = np.arange(len(requests), dtype=float) if times is None else np.asarray(times, float)
        return cls(keys=keys, starts=starts if len(requests) else starts[:0], times=when)

    def requests(self) -> list[list[int]]:
        """The keys of each request, as lists of ints."""
        bounds = [*self.starts.tolist(), len(self.keys)]
        flat = self.keys.tolist()
        return [flat[a:b] for a, b in pairwise(bounds)]


class Pool:
    """``capacity`` resident keys, a miss always inserted (demand caching), no pinned keys."""

    def __init__(self, policy: EvictionPolicy, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"pool capacity must be >= 1, got {capacity}")
        self.policy = policy
        self.capacity = capacity
        self.resident: set[int] = set()
        self.evicted: list[int] = []  # victims of the last access, in eviction order

    def access(self, key: int, now: float = 0.0) -> bool:
        """One access; True on a hit."""
        policy, resident = self.policy, self.resident
        self.evicted = []
        if key in resident:
            policy.on_access(key, now)
            return True
        policy.on_miss(key, now)
        excess = len(resident) + 1 - self.capacity
        if excess > 0:
            victims = policy.victims(excess)
            if len(victims) < excess or len(set(victims)) != len(victims):
                raise RuntimeError(f"{type(policy).__name__} returned {victims} for {excess}")
            for victim in victims:
                if victim not in resident:
                    raise RuntimeError(f"{type(policy).__name__} chose non-resident key {victim}")
                resident.remove(victim)
                policy.on_evict(victim)
                self.evicted.append(victim)
        policy.on_insert(key, now)
        resident.add(key)
        return False


def replay_generic(policy: EvictionPolicy, trace: AccessTrace, capacity: int) -> np.ndarray:
    """Hit mask of ``trace`` through a ``Pool`` (``on_request`` before each request)."""
    pool = Pool(policy, capacity)
    hits = bytearray(len(trace.keys))
    i = 0
    for keys, now in zip(trace.requests(), trace.times.tolist(), strict=True):
        policy.on_request(keys, now)
        for key in keys:
            if pool.access(key, now):
                hits[i] = 1
            i += 1
    return np.frombuffer(hits, dtype=np.uint8).astype(bool)


def replay(
    policy: EvictionPolicy, trace: AccessTrace, capacity: int, *, fast: bool = True
) -> np.ndarray:
    """Hit mask of ``trace`` through a fresh policy; the fused loop when it has one."""
    own = getattr(policy, "capacity", capacity)
    if own != capacity:
        raise ValueError(f"{policy.name or type(policy).__name__} was built for capacity {own}")
    fused = getattr(policy, "fast_replay", None) if fast else None
    if fused is not None:
        return fused(trace, capacity)
    return replay_generic(policy, trace, capacity)
