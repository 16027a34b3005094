"""LFU: evict the least frequently used key, optionally with dynamic aging (LFU-DA)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from policies import fastpath
from policies.base import EvictionPolicy, PinnedMask, boolean, param_table
from policies.heap import LazyHeap

if TYPE_CHECKING:
    from policies.pool import AccessTrace


class LFU(EvictionPolicy):
    """Least frequently used; ties go to the least recently used key.

    A key's count starts at 1 on insertion and is forgotten on removal. Eviction order:
    smallest ``(count, last-access tick)``. With ``aging`` (LFU-DA, Arlitt et al. 2000)
    the priority is ``L + count`` where ``L`` is the priority of the last evicted key, so
    that old popular keys lose their advantage over time.
    """

    name = "lfu"
    params = param_table(aging=boolean(False))

    def __init__(self, aging: bool = False) -> None:
        self.aging = aging
        self._heap = LazyHeap()
        self._freq: dict[int, int] = {}
        self._tick = 0
        self._inflation = 0

    def _priority(self, key: int) -> tuple[Any, ...]:
        count = self._freq[key] + (self._inflation if self.aging else 0)
        return (count, self._tick)

    def on_insert(self, key: int, now: float = 0.0) -> None:
        """Count 1."""
        self._tick += 1
        self._freq[key] = 1
        self._heap.set(key, self._priority(key))

    def on_access(self, key: int, now: float = 0.0) -> None:
        """Count one more use."""
        self._tick += 1
        self._freq[key] += 1
        self._heap.set(key, self._priority(key))

    def on_remove(self, key: int) -> None:
        """Forget ``key`` and its count."""
        del self._freq[key]
        self._heap.discard(key)

    def on_evict(self, key: int) -> None:
        """Forget ``key``; with aging, its priority becomes the inflation value ``L``."""
        prio = self._heap.prio[key]
        if self.aging:
            self._inflation = prio[0]
        self.on_remove(key)

    def victims(self, n: int, pinned: PinnedMask = None) -> list[int]:
        """Smallest priority first."""
        return self._heap.smallest(n, pinned)

    def fast_replay(self, trace: AccessTrace, capacity: int) -> np.ndarray:
        """Hit mask of a fresh demand-cached pool (fused loop, same hits as the interface)."""
        if self.aging:
            return fastpath.lfu_aging(trace.keys, capacity)
        return fastpath.lfu(trace.keys, capacity)
