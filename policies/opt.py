"""Belady's OPT (MIN): evict the key whose next use is farthest in the known future."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from policies import fastpath
from policies.base import EvictionPolicy, PinnedMask
from policies.fastpath import next_uses
from policies.heap import LazyHeap

if TYPE_CHECKING:
    from policies.pool import AccessTrace


class OPT(EvictionPolicy):
    """Offline optimum for demand caching (Belady 1966): built with the whole access sequence.

    Every ``on_insert`` and ``on_access`` consumes the next position of ``future`` and must
    name the key found there. Victim: the resident key used farthest in the future; keys
    never used again come first, smallest key first. A lazy heap on ``-next use`` orders them.
    """

    name = "opt"

    def __init__(self, future: np.ndarray) -> None:
        self.future = np.asarray(future, dtype=np.int64)
        if self.future.ndim != 1:
            raise ValueError("opt: future must be a 1-D sequence of keys")
        self._next = next_uses(self.future).tolist()
        self._keys = self.future.tolist()
        self._cursor = 0
        self._heap = LazyHeap()

    def _consume(self, key: int) -> None:
        i = self._cursor
        if i >= len(self._keys) or self._keys[i] != key:
            expected = self._keys[i] if i < len(self._keys) else "the end of the sequence"
            raise ValueError(f"opt: access #{i} is key {key} but the future says {expected}")
        self._cursor = i + 1
        self._heap.set(key, -self._next[i])

    def on_insert(self, key: int, now: float = 0.0) -> None:
        """Consume one position of the future."""
        self._consume(key)

    def on_access(self, key: int, now: float = 0.0) -> None:
        """Consume one position of the future."""
        self._consume(key)

    def on_remove(self, key: int) -> None:
        """Forget ``key``."""
        self._heap.discard(key)

    def victims(self, n: int, pinned: PinnedMask = None) -> list[int]:
        """Farthest next use first."""
        return self._heap.smallest(n, pinned)

    def fast_replay(self, trace: AccessTrace, capacity: int) -> np.ndarray:
        """Hit mask of a fresh demand-cached pool (fused loop, same hits as the interface)."""
        if not np.array_equal(trace.keys, self.future):
            raise ValueError("opt: the replayed keys differ from the future it was built with")
        return fastpath.opt(trace.keys, capacity)
