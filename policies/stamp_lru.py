"""LRU as per-key stamps in numpy: for a pool whose keys are read far more than evicted."""

from __future__ import annotations

import numpy as np

from policies.base import EvictionPolicy, PinnedMask


class StampLRU(EvictionPolicy):
    """Least recently used, kept as a stamp per key (a counter bumped by every insert and
    access) instead of an ``OrderedDict``.

    Eviction order: the same as :class:`policies.lru.LRU` (stamps are unique and grow with
    every use, so the least recent key has the smallest). A batch of accesses is one array
    write; ``victims()`` is one pass over the key space, so this suits a pool that reads
    thousands of its keys per eviction call (the HBM cache of ``dram_centric``).
    """

    name = "lru"
    access_is_insert = True

    def __init__(self) -> None:
        self._stamp = np.zeros(1024, dtype=np.int64)
        self._member = np.zeros(1024, dtype=bool)
        self._clock = 0
        self._top = 0  # every member key is below it

    def _reach(self, top: int) -> None:
        """Make room for keys below ``top``."""
        if top > len(self._stamp):
            size = max(top, 2 * len(self._stamp))
            self._stamp = np.concatenate((self._stamp, np.zeros(size - len(self._stamp), np.int64)))
            self._member = np.concatenate((self._member, np.zeros(size - len(self._member), bool)))
        self._top = max(self._top, top)

    def on_insert(self, key: int, now: float = 0.0) -> None:
        """``key`` is now the most recent."""
        if key >= self._top:
            self._reach(key + 1)
        self._stamp[key] = self._clock
        self._clock += 1
        self._member[key] = True

    def on_insert_many(self, keys: np.ndarray, now: float = 0.0) -> None:
        """:meth:`on_insert` each of ``keys`` (distinct), in order."""
        if len(keys) == 0:
            return
        self._reach(int(keys.max()) + 1)
        self._stamp[keys] = np.arange(self._clock, self._clock + len(keys))
        self._clock += len(keys)
        self._member[keys] = True

    def on_access(self, key: int, now: float = 0.0) -> None:
        """``key`` is now the most recent."""
        self._stamp[key] = self._clock
        self._clock += 1

    def on_access_many(self, keys: np.ndarray | list[int], now: float = 0.0) -> None:
        """:meth:`on_access` each of ``keys``, in order (a repeated key ends at its last)."""
        self._stamp[keys] = np.arange(self._clock, self._clock + len(keys))
        self._clock += len(keys)

    def on_remove(self, key: int) -> None:
        """Forget ``key``."""
        self._member[key] = False

    def victims(self, n: int, pinned: PinnedMask = None) -> list[int]:
        """The least recently used unpinned keys, least recent first."""
        if n <= 0:
            return []
        live = self._member[: self._top]
        if pinned is not None and len(pinned):
            m = min(len(pinned), len(live))
            live = live.copy()
            live[:m] &= ~pinned[:m]
        keys = np.flatnonzero(live)
        if n < len(keys):
            keys = keys[np.argpartition(self._stamp[keys], n - 1)[:n]]
        return keys[np.argsort(self._stamp[keys])].tolist()
