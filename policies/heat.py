"""Heat EMA: evict the coldest key by an exponentially decaying access count."""

from __future__ import annotations

import math

from policies.base import EvictionPolicy, PinnedMask, param_table, positive
from policies.heap import LazyHeap


class HeatEMA(EvictionPolicy):
    """Heat decays by half every ``half_life`` (units of ``now``) and gains 1 per access.

    The Omni Cache "token heat": an exponential moving average of accesses. Comparing
    ``h(now)`` across keys is comparing the time-invariant score
    ``log2(h(t)) + t / half_life`` (``t``: the key's last access), so a lazy heap on the
    score orders keys by current heat. Victim: lowest heat (ties: least recently used).
    """

    name = "heat"
    params = param_table(half_life=positive(10.0))

    def __init__(self, half_life: float = 10.0) -> None:
        self.half_life = half_life
        self._heap = LazyHeap()
        self._tick = 0

    def _set(self, key: int, heat: float, now: float) -> None:
        self._tick += 1
        self._heap.set(key, (math.log2(heat) + now / self.half_life, self._tick))

    def on_insert(self, key: int, now: float = 0.0) -> None:
        """Heat 1."""
        self._set(key, 1.0, now)

    def on_access(self, key: int, now: float = 0.0) -> None:
        """Decay the heat to ``now``, then add 1."""
        score = self._heap.prio[key][0]
        self._set(key, 2.0 ** (score - now / self.half_life) + 1.0, now)

    def on_remove(self, key: int) -> None:
        """Forget ``key``."""
        self._heap.discard(key)

    def victims(self, n: int, pinned: PinnedMask = None) -> list[int]:
        """Coldest first."""
        return self._heap.smallest(n, pinned)
