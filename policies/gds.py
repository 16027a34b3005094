"""GreedyDual-Size: evict the key that is cheapest to bring back (Cao and Irani, USITS'97)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from policies.base import EvictionPolicy, PinnedMask
from policies.heap import LazyHeap

CostSource = Callable[[int], float] | np.ndarray | None
"""Cost of a key: a function, an array indexed by key, or None (every key costs 1)."""


def cost_function(cost: CostSource) -> Callable[[int], float]:
    """A ``cost(key) -> float`` function from a cost source."""
    if cost is None:
        return lambda key: 1.0
    if isinstance(cost, np.ndarray):
        values = cost
        return lambda key: float(values[key])
    return cost


class GreedyDualSize(EvictionPolicy):
    """Each key holds ``H = L + cost(key) / size`` set on insertion and on every hit.

    Blocks have one size, so ``H = L + cost``. The victim has the smallest ``H`` (ties: least
    recently used); on eviction ``L`` becomes the victim's ``H``, which ages every other key
    (``on_remove`` does not). ``cost`` is what a miss on a key costs: the engine gives the
    prompt tokens a lost block takes with it (itself and the rest of its prefix chain).
    """

    name = "gds"

    def __init__(self, cost: CostSource = None) -> None:
        self._cost = cost_function(cost)
        self._heap = LazyHeap()
        self._inflation = 0.0
        self._tick = 0

    def _touch(self, key: int) -> None:
        self._tick += 1
        self._heap.set(key, (self._inflation + self._cost(key), self._tick))

    def on_insert(self, key: int, now: float = 0.0) -> None:
        """``H = L + cost``."""
        self._touch(key)

    def on_access(self, key: int, now: float = 0.0) -> None:
        """``H = L + cost`` again."""
        self._touch(key)

    def on_remove(self, key: int) -> None:
        """Forget ``key``."""
        self._heap.discard(key)

    def on_evict(self, key: int) -> None:
        """Forget ``key``; ``L`` becomes its ``H``."""
        self._inflation = self._heap.discard(key)[0]

    def victims(self, n: int, pinned: PinnedMask = None) -> list[int]:
        """Smallest ``H`` first."""
        return self._heap.smallest(n, pinned)
