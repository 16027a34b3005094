"""LRU as per-key stamps in numpy: for a pool whose keys are read far more than evicted."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from policies.base import EvictionPolicy, PinnedMask

MIN_CHUNK = 256  # log entries ``victims()`` checks in its first pass
SCALAR_STEPS = 8  # log entries one victim is looked for in one at a time, before a pass


class StampLRU(EvictionPolicy):
    """Least recently used, kept as a stamp per key (a counter bumped by every insert and
    access) instead of an ``OrderedDict``.

    Eviction order: the same as :class:`policies.lru.LRU` (stamps are unique and grow with
    every use, so the least recent key has the smallest). A batch of accesses is one array
    write. Every stamp given is also appended to a log of (key, stamp), which is therefore in
    stamp order; an entry is live while its key is a member with that stamp, and once stale
    it stays stale (stamps only grow). ``victims()`` reads the log from its oldest live
    entry, so it costs about the victims asked for, not the key space (the HBM cache of
    ``dram_centric`` reads thousands of its keys per eviction call).
    """

    name = "lru"
    access_is_insert = True

    def __init__(self) -> None:
        self._stamp = np.zeros(1024, dtype=np.int64)
        self._member = np.zeros(1024, dtype=bool)
        self._clock = 0
        self._top = 0  # every member key is below it
        self._log_key = np.zeros(1024, dtype=np.int64)
        self._log_stamp = np.zeros(1024, dtype=np.int64)
        self._head = 0  # log entries before it are stale
        self._tail = 0

    def _reach(self, top: int) -> None:
        """Make room for keys below ``top``."""
        if top > len(self._stamp):
            size = max(top, 2 * len(self._stamp))
            self._stamp = np.concatenate((self._stamp, np.zeros(size - len(self._stamp), np.int64)))
            self._member = np.concatenate((self._member, np.zeros(size - len(self._member), bool)))
        self._top = max(self._top, top)

    def _live(self, start: int, end: int) -> np.ndarray:
        """Which log entries in ``[start, end)`` are live."""
        keys = self._log_key[start:end]
        return self._member[keys] & (self._stamp[keys] == self._log_stamp[start:end])

    def _log(self, keys: np.ndarray | int, first: int, n: int) -> None:
        """Append ``n`` entries: ``keys`` stamped ``first``, ``first + 1``, ..."""
        if self._tail + n > len(self._log_key):
            self._compact(n)
        end = self._tail + n
        self._log_key[self._tail : end] = keys
        self._log_stamp[self._tail : end] = np.arange(first, first + n) if n > 1 else first
        self._tail = end

    def _compact(self, extra: int) -> None:
        """Keep only the live log entries (in order), with room for ``extra`` more and for
        twice as many as it keeps (so that compacting costs O(1) per entry logged)."""
        live = self._live(self._head, self._tail)
        keys = self._log_key[self._head : self._tail][live]
        stamps = self._log_stamp[self._head : self._tail][live]
        size = len(self._log_key)
        while len(keys) + extra > size // 4:
            size *= 2
        if size != len(self._log_key):
            self._log_key = np.zeros(size, dtype=np.int64)
            self._log_stamp = np.zeros(size, dtype=np.int64)
        self._log_key[: len(keys)] = keys
        self._log_stamp[: len(keys)] = stamps
        self._head, self._tail = 0, len(keys)

    def on_insert(self, key: int, now: float = 0.0) -> None:
        """``key`` is now the most recent."""
        if key >= self._top:
            self._reach(key + 1)
        self._stamp[key] = self._clock
        self._member[key] = True
        self._log(key, self._clock, 1)
        self._clock += 1

    def on_insert_many(self, keys: np.ndarray, now: float = 0.0) -> None:
        """:meth:`on_insert` each of ``keys`` (distinct), in order."""
        if len(keys) == 0:
            return
        self._reach(int(keys.max()) + 1)
        self._stamp[keys] = np.arange(self._clock, self._clock + len(keys))
        self._member[keys] = True
        self._log(keys, self._clock, len(keys))
        self._clock += len(keys)

    def on_access(self, key: int, now: float = 0.0) -> None:
        """``key`` is now the most recent."""
        self._stamp[key] = self._clock
        self._log(key, self._clock, 1)
        self._clock += 1

    def on_access_many(self, keys: np.ndarray | list[int], now: float = 0.0) -> None:
        """:meth:`on_access` each of ``keys``, in order (a repeated key ends at its last)."""
        if len(keys) == 0:
            return
        keys = np.asarray(keys, dtype=np.int64)
        self._stamp[keys] = np.arange(self._clock, self._clock + len(keys))
        self._log(keys, self._clock, len(keys))
        self._clock += len(keys)

    def on_remove(self, key: int) -> None:
        """Forget ``key``."""
        self._member[key] = False

    def on_remove_many(self, keys: Sequence[int]) -> None:
        """Forget each of ``keys``."""
        if len(keys) == 1:  # (an eviction's usual one: a scalar store)
            self._member[keys[0]] = False
        else:
            self._member[np.asarray(keys, dtype=np.int64)] = False

    on_evict_many = on_remove_many

    def _first_live(self) -> int | None:
        """The key of the log's first live entry, found by scalar steps from its head if
        it is among the first ``SCALAR_STEPS`` (None: not found so; the head moves past
        the stale entries stepped over)."""
        keys, stamps, member, stamp = self._log_key, self._log_stamp, self._member, self._stamp
        at, end = self._head, min(self._head + SCALAR_STEPS, self._tail)
        while at < end:
            key = int(keys[at])
            if member[key] and stamp[key] == stamps[at]:
                self._head = at
                return key
            at += 1
        self._head = at
        return None

    def victims(self, n: int, pinned: PinnedMask = None) -> list[int]:
        """The least recently used unpinned keys, least recent first.

        NOTE: skipping the stale head of the log for later calls changes no eviction order.
        """
        if n == 1 and pinned is None:  # the usual eviction: the log's first live entry
            first = self._first_live()
            if first is not None:
                return [first]
        out: list[int] = []
        start, chunk = self._head, max(2 * n, MIN_CHUNK)
        leading = True  # every entry so far was stale
        while len(out) < n and start < self._tail:
            end = min(start + chunk, self._tail)
            live = self._live(start, end)
            if leading:
                skip = int(np.argmax(live)) if live.any() else len(live)
                self._head, leading = start + skip, skip == len(live)
            keys = self._log_key[start:end]
            if pinned is not None and len(pinned):
                inside = keys < len(pinned)
                live[inside] &= ~pinned[keys[inside]]
            out.extend(keys[live][: n - len(out)].tolist())
            start, chunk = end, 2 * chunk
        return out
