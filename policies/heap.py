"""A min-heap over keys with lazy deletion, shared by the priority-based policies."""

from __future__ import annotations

import heapq
from typing import Any

from policies.base import PinnedMask, pinned_predicate

_MISSING = object()


class LazyHeap:
    """Keys with a priority each; ``smallest()`` lists them in priority order.

    Invariant: a heap entry ``(prio, key)`` is live iff ``self.prio[key] == prio``; every
    other entry is stale and dropped when it surfaces. Priorities must be totally ordered
    (ties broken inside the priority, e.g. by an access tick).
    """

    def __init__(self) -> None:
        self._heap: list[tuple[Any, int]] = []
        self.prio: dict[int, Any] = {}

    def __len__(self) -> int:
        return len(self.prio)

    def __contains__(self, key: int) -> bool:
        return key in self.prio

    def set(self, key: int, prio: Any) -> None:
        """Give ``key`` a (new) priority."""
        self.prio[key] = prio
        heapq.heappush(self._heap, (prio, key))
        if len(self._heap) > 2 * len(self.prio) + 64:
            self._heap = [(p, k) for k, p in self.prio.items()]
            heapq.heapify(self._heap)

    def discard(self, key: int) -> Any:
        """Forget ``key``; returns its last priority (None if unknown)."""
        return self.prio.pop(key, None)

    def smallest(self, n: int, pinned: PinnedMask = None) -> list[int]:
        """Up to ``n`` unpinned keys with the smallest priorities, smallest first."""
        is_pinned = pinned_predicate(pinned)
        heap, prio = self._heap, self.prio
        out: list[int] = []
        keep: list[tuple[Any, int]] = []
        seen: set[int] = set()
        while heap and len(out) < n:
            entry = heapq.heappop(heap)
            key = entry[1]
            if prio.get(key, _MISSING) != entry[0] or key in seen:
                continue  # stale or duplicate: dropping it changes nothing observable
            seen.add(key)
            keep.append(entry)
            if not is_pinned(key):
                out.append(key)
        for entry in keep:
            heapq.heappush(heap, entry)
        return out
