"""LRU: evict the least recently used key."""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Container, Sequence
from typing import TYPE_CHECKING

import numpy as np

from policies import fastpath
from policies.base import EvictionPolicy, PinnedMask
from policies.fifo import first_unpinned

if TYPE_CHECKING:
    from policies.pool import AccessTrace


class LRU(EvictionPolicy):
    """Least recently used. Eviction order: an ``OrderedDict`` from least to most recent."""

    name = "lru"
    access_is_insert = True

    def __init__(self) -> None:
        self._order: OrderedDict[int, None] = OrderedDict()

    def on_insert(self, key: int, now: float = 0.0) -> None:
        """``key`` is now the most recent."""
        self._order[key] = None

    def on_insert_many(self, keys: np.ndarray | list[int], now: float = 0.0) -> None:
        """:meth:`on_insert` each of ``keys``, in order."""
        # OrderedDict.update assigns in order, as one insert each (a known key keeps its place)
        self._order.update(dict.fromkeys(keys.tolist() if isinstance(keys, np.ndarray) else keys))

    def on_access(self, key: int, now: float = 0.0) -> None:
        """``key`` is now the most recent."""
        self._order.move_to_end(key)

    def on_access_many(self, keys: np.ndarray | list[int], now: float = 0.0) -> None:
        """:meth:`on_access` each of ``keys``, in order (one call per step, not per block)."""
        move = self._order.move_to_end
        for key in keys.tolist() if isinstance(keys, np.ndarray) else keys:
            move(key)

    def on_remove(self, key: int) -> None:
        """Forget ``key``."""
        del self._order[key]

    def on_remove_many(self, keys: Sequence[int]) -> None:
        """Forget each of ``keys``."""
        deque(map(self._order.__delitem__, keys), maxlen=0)  # one del each, looped in C

    on_evict_many = on_remove_many

    def insert_evicting(
        self, keys: Sequence[int], free: int, now: float = 0.0, pinned: PinnedMask = None,
        stop: Container[int] = (),
    ) -> tuple[int, list[int]]:  # fmt: skip
        """:meth:`EvictionPolicy.insert_evicting` in one pass (no key pinned: each victim is
        the least recent key at its turn)."""
        if pinned is not None:
            return super().insert_evicting(keys, free, now, pinned, stop)
        order = self._order
        pop = order.popitem
        victims: list[int] = []
        done = 0
        for key in keys:
            if free > 0:
                free -= 1
            else:
                victim = pop(False)[0]
                victims.append(victim)
                if victim in stop:
                    order[key] = None
                    return done + 1, victims
            order[key] = None
            done += 1
        return done, victims

    def victims(self, n: int, pinned: PinnedMask = None) -> list[int]:
        """The least recently used unpinned keys."""
        return first_unpinned(self._order, n, pinned)

    def fast_replay(self, trace: AccessTrace, capacity: int) -> np.ndarray:
        """Hit mask of a fresh demand-cached pool (fused loop, same hits as the interface)."""
        return fastpath.lru(trace.keys, capacity)
