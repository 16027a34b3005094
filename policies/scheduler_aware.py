"""Scheduler-aware eviction: never evict blocks the waiting queue will use soon (AttentionStore)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from policies.base import EvictionPolicy, Param, PinnedMask, param_table


def _union(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out = np.zeros(max(len(a), len(b)), dtype=bool)
    out[: len(a)] |= a
    out[: len(b)] |= b
    return out


class SchedulerAware(EvictionPolicy):
    """Wraps a base policy; keys announced by ``set_upcoming`` are evicted only as a last resort.

    After AttentionStore (Gao et al., USENIX ATC'24): the scheduler knows which requests
    wait and which blocks they will read. Victims come from the base policy with the
    upcoming keys treated as pinned; only if that gives fewer than ``n`` does it take
    upcoming keys too, in the base policy's order. ``base`` is a policy spec (a name or a
    ``{name: ..., ...}`` mapping), built by the registry with the same context.
    """

    name = "scheduler_aware"
    params = param_table(
        base=Param("lru", "an eviction policy name or mapping", lambda v: isinstance(v, str | dict))
    )

    def __init__(self, base: EvictionPolicy) -> None:
        self.base = base
        self._upcoming = np.zeros(0, dtype=bool)
        self._any = False

    def set_upcoming(self, keys: Iterable[int]) -> None:
        """Replace the set of keys the waiting queue will use soon."""
        arr = np.fromiter(keys, dtype=np.int64)
        self._upcoming = np.zeros(int(arr.max()) + 1 if arr.size else 0, dtype=bool)
        self._upcoming[arr] = True
        self._any = bool(arr.size)

    def on_insert(self, key: int, now: float = 0.0) -> None:
        """Delegate."""
        self.base.on_insert(key, now)

    def on_access(self, key: int, now: float = 0.0) -> None:
        """Delegate."""
        self.base.on_access(key, now)

    def on_remove(self, key: int) -> None:
        """Delegate."""
        self.base.on_remove(key)

    def on_evict(self, key: int) -> None:
        """Delegate."""
        self.base.on_evict(key)

    def on_miss(self, key: int, now: float = 0.0) -> None:
        """Delegate."""
        self.base.on_miss(key, now)

    def on_request(self, keys: Sequence[int], now: float = 0.0) -> None:
        """Delegate."""
        self.base.on_request(keys, now)

    def victims(self, n: int, pinned: PinnedMask = None) -> list[int]:
        """Base victims avoiding upcoming keys, then upcoming ones if needed."""
        if not self._any:
            return self.base.victims(n, pinned)
        guarded = self._upcoming if pinned is None else _union(pinned, self._upcoming)
        out = self.base.victims(n, guarded)
        if len(out) < n:
            taken = set(out)
            more = [k for k in self.base.victims(n, pinned) if k not in taken]
            out += more[: n - len(out)]
        return out
