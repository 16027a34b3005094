"""ARC: adaptive replacement cache (Megiddo and Modha, FAST'03)."""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

from policies import fastpath
from policies.base import EvictionPolicy, PinnedMask, pinned_predicate

if TYPE_CHECKING:
    from policies.pool import AccessTrace


class ARC(EvictionPolicy):
    """Two LRU lists (seen once: T1, seen twice or more: T2) and their ghosts B1, B2.

    The target size ``p`` of T1 (a real number, as in the paper and libCacheSim) adapts on
    ghost hits: ``p += max(|B2| / |B1|, 1)`` on a B1 hit, ``p -= max(|B1| / |B2|, 1)`` on a
    B2 hit, within ``[0, capacity]``.
    REPLACE evicts the LRU of T1 if ``|T1| > p`` (or ``|T1| == p`` and the missed key is
    in B2), else the LRU of T2; the victim goes to the ghost of its list (``on_evict``).
    ``on_insert`` trims the ghosts as the paper's case IV does; since moving a victim to
    its ghost keeps ``|T1| + |B1|`` and the total unchanged, trimming after the eviction
    is the same as trimming before it. ``on_miss`` must precede ``victims()`` for the
    adaptation to happen before REPLACE (otherwise it happens in ``on_insert``).
    """

    name = "arc"

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.p = 0.0
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()
        self._adapted: int | None = None  # the missed key whose ghost hit already moved p

    def on_miss(self, key: int, now: float = 0.0) -> None:
        """Adapt ``p`` if ``key`` is a ghost hit (before REPLACE, as in the paper)."""
        self._adapted = None
        b1, b2 = len(self.b1), len(self.b2)
        if key in self.b1:
            self.p = min(self.p + max(b2 / b1, 1.0), float(self.capacity))
        elif key in self.b2:
            self.p = max(self.p - max(b1 / b2, 1.0), 0.0)
        else:
            return
        self._adapted = key

    def on_insert(self, key: int, now: float = 0.0) -> None:
        """A ghost hit enters T2; a new key enters T1 after the case IV ghost trimming."""
        if (key in self.b1 or key in self.b2) and self._adapted != key:
            self.on_miss(key, now)
        self._adapted = None
        if key in self.b1 or key in self.b2:
            ghost = self.b1 if key in self.b1 else self.b2
            del ghost[key]
            self.t2[key] = None
            return
        in_l1 = len(self.t1) + len(self.b1)
        if in_l1 >= self.capacity:
            if self.b1:
                self.b1.popitem(last=False)
        elif in_l1 + len(self.t2) + len(self.b2) >= 2 * self.capacity and self.b2:
            self.b2.popitem(last=False)
        self.t1[key] = None

    def on_access(self, key: int, now: float = 0.0) -> None:
        """A hit moves ``key`` to the MRU end of T2."""
        if key in self.t1:
            del self.t1[key]
            self.t2[key] = None
        else:
            self.t2.move_to_end(key)

    def on_remove(self, key: int) -> None:
        """Forget ``key`` without a ghost entry."""
        if key in self.t1:
            del self.t1[key]
        else:
            del self.t2[key]

    def on_evict(self, key: int) -> None:
        """Move the victim to the ghost of its list."""
        if key in self.t1:
            del self.t1[key]
            self.b1[key] = None
        else:
            del self.t2[key]
            self.b2[key] = None

    def victims(self, n: int, pinned: PinnedMask = None) -> list[int]:
        """REPLACE repeated ``n`` times on a virtual copy of the list sizes."""
        is_pinned = pinned_predicate(pinned)
        lists = {1: iter(self.t1), 2: iter(self.t2)}
        sizes = {1: len(self.t1), 2: len(self.t2)}
        tie_to_t1 = self._adapted is not None and self._adapted in self.b2
        out: list[int] = []
        while len(out) < n:
            t1 = sizes[1]
            first = 1 if t1 > 0 and (t1 > self.p or (t1 == self.p and tie_to_t1)) else 2
            for side in (first, 3 - first):
                key = next((k for k in lists[side] if not is_pinned(k)), None)
                if key is not None:
                    out.append(key)
                    sizes[side] -= 1
                    break
            else:
                break
        return out

    def fast_replay(self, trace: AccessTrace, capacity: int) -> np.ndarray:
        """Hit mask of a fresh demand-cached pool (fused loop, same hits as the interface)."""
        return fastpath.arc(trace.keys, capacity)
