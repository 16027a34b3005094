"""Prefix-aware LRU: evict leaves of the prefix tree before their parents (SGLang radix cache)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from itertools import pairwise
from typing import TYPE_CHECKING

import numpy as np

from policies import fastpath
from policies.base import EvictionPolicy, PinnedMask, pinned_predicate

if TYPE_CHECKING:
    from policies.pool import AccessTrace


class PrefixLRU(EvictionPolicy):
    """LRU among *leaves*: resident keys that no resident key names as its parent.

    A key's parent is registered with ``set_parent`` or, by ``on_request``, as the block
    before it in a request (the first registration wins; one that would close a cycle is
    ignored). Evicting a leaf may turn its parent into a leaf, which ``victims(n)`` then
    considers too, as the radix cache does. Pinned leaves keep their ancestors resident.
    Eviction order: a lazy heap of ``(last-access tick, key)`` filtered to leaves.
    """

    name = "prefix_lru"

    def __init__(self) -> None:
        self._parent: dict[int, int] = {}
        self._children: dict[int, int] = {}  # resident children per key
        self._tick: dict[int, int] = {}  # last-access tick of resident keys
        self._clock = 0
        self._heap: list[tuple[int, int]] = []
        self._is_parent: set[int] = set()

    def set_parent(self, key: int, parent: int) -> None:
        """Register ``parent`` as the block before ``key`` (first registration wins)."""
        if key in self._parent or key == parent:
            return
        up: int | None = parent if key in self._is_parent else None  # else key has no subtree
        while up is not None:
            if up == key:
                return  # would close a cycle
            up = self._parent.get(up)
        self._parent[key] = parent
        self._is_parent.add(parent)
        if key in self._tick:
            self._children[parent] = self._children.get(parent, 0) + 1

    def on_request(self, keys: Sequence[int], now: float = 0.0) -> None:
        """Each block's parent is the block before it."""
        for parent, key in pairwise(keys):
            self.set_parent(key, parent)

    def _touch(self, key: int) -> None:
        self._clock += 1
        self._tick[key] = self._clock
        heapq.heappush(self._heap, (self._clock, key))
        if len(self._heap) > 2 * len(self._tick) + 64:  # drop stale entries
            self._heap = [(t, k) for k, t in self._tick.items() if k not in self._children]
            heapq.heapify(self._heap)

    def on_insert(self, key: int, now: float = 0.0) -> None:
        """``key`` is the most recent; its parent gains a resident child."""
        self._touch(key)
        parent = self._parent.get(key)
        if parent is not None:
            self._children[parent] = self._children.get(parent, 0) + 1

    def on_access(self, key: int, now: float = 0.0) -> None:
        """``key`` is the most recent."""
        self._touch(key)

    def on_remove(self, key: int) -> None:
        """Forget ``key``; its parent may become a leaf."""
        del self._tick[key]
        parent = self._parent.get(key)
        if parent is not None:
            self._children[parent] -= 1
            if self._children[parent] == 0:
                del self._children[parent]
                if parent in self._tick:
                    heapq.heappush(self._heap, (self._tick[parent], parent))

    def victims(self, n: int, pinned: PinnedMask = None) -> list[int]:
        """Least recently used leaves; parents freed by earlier victims join the candidates."""
        is_pinned = pinned_predicate(pinned)
        heap, tick, children = self._heap, self._tick, self._children
        out: list[int] = []
        keep: list[tuple[int, int]] = []
        freed: list[tuple[int, int]] = []  # parents that became leaves in this plan
        gone: dict[int, int] = {}  # resident children removed in this plan
        seen: set[int] = set()
        while len(out) < n and (heap or freed):
            source = freed if freed and (not heap or freed[0] < heap[0]) else heap
            entry = heapq.heappop(source)
            key = entry[1]
            if tick.get(key) != entry[0] or key in seen:
                continue  # stale or duplicate
            if children.get(key, 0) - gone.get(key, 0) > 0:
                continue  # not a leaf now; it is pushed again when it becomes one
            seen.add(key)
            if source is heap:
                keep.append(entry)
            if is_pinned(key):
                continue
            out.append(key)
            parent = self._parent.get(key)
            if parent is not None and parent in tick:
                gone[parent] = gone.get(parent, 0) + 1
                if children[parent] == gone[parent]:
                    heapq.heappush(freed, (tick[parent], parent))
        for entry in keep:
            heapq.heappush(heap, entry)
        return out

    def fast_replay(self, trace: AccessTrace, capacity: int) -> np.ndarray:
        """Hit mask of a fresh demand-cached pool (fused loop, same hits as the interface)."""
        return fastpath.prefix_lru(trace.keys, trace.starts, capacity)
