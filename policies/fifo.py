"""FIFO: evict the key that became resident first; hits change nothing."""

from __future__ import annotations

from collections import OrderedDict
from itertools import islice
from typing import TYPE_CHECKING

import numpy as np

from policies import fastpath
from policies.base import EvictionPolicy, PinnedMask, pinned_predicate

if TYPE_CHECKING:
    from policies.pool import AccessTrace


def first_unpinned(order: OrderedDict[int, None], n: int, pinned: PinnedMask) -> list[int]:
    """The first ``n`` unpinned keys of ``order``, oldest first."""
    if n <= 0:
        return []
    if pinned is None:
        return list(islice(order, n))
    is_pinned = pinned_predicate(pinned)
    out: list[int] = []
    for key in order:
        if not is_pinned(key):
            out.append(key)
            if len(out) == n:
                break
    return out


class FIFO(EvictionPolicy):
    """First in, first out. Eviction order: insertion order (an ``OrderedDict``)."""

    name = "fifo"

    def __init__(self) -> None:
        self._order: OrderedDict[int, None] = OrderedDict()

    def on_insert(self, key: int, now: float = 0.0) -> None:
        """Append ``key`` at the new end."""
        self._order[key] = None

    def on_access(self, key: int, now: float = 0.0) -> None:
        """A hit leaves FIFO order unchanged."""

    def on_remove(self, key: int) -> None:
        """Forget ``key``."""
        del self._order[key]

    def victims(self, n: int, pinned: PinnedMask = None) -> list[int]:
        """The oldest unpinned keys."""
        return first_unpinned(self._order, n, pinned)

    def fast_replay(self, trace: AccessTrace, capacity: int) -> np.ndarray:
        """Hit mask of a fresh demand-cached pool (fused loop, same hits as the interface)."""
        return fastpath.fifo(trace.keys, capacity)
