"""SIEVE: a FIFO with a visited bit and a moving hand (Zhang et al., NSDI'24)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from policies import fastpath
from policies.base import EvictionPolicy, PinnedMask, pinned_predicate

if TYPE_CHECKING:
    from policies.pool import AccessTrace

_END = -1  # sentinel of the intrusive ring (keys are non-negative)


class SIEVE(EvictionPolicy):
    """Keys in insertion order on an intrusive ring; a hit only sets the key's visited bit.

    The hand walks from the oldest key towards the newest, clearing visited bits, and the
    first unvisited (unpinned) key is the victim; the hand then rests on the victim's newer
    neighbour and wraps to the oldest key past the newest. Pinned keys are passed over
    like visited ones. ``on_evict`` re-walks the hand to the victim, clearing the bits
    ``victims()`` only cleared virtually.
    """

    name = "sieve"

    def __init__(self) -> None:
        self._newer: dict[int, int] = {_END: _END}  # _newer[_END] is the oldest key
        self._older: dict[int, int] = {_END: _END}  # _older[_END] is the newest key
        self._visited: dict[int, bool] = {}
        self._hand = _END  # _END: start at the oldest key

    def on_insert(self, key: int, now: float = 0.0) -> None:
        """Link ``key`` as the newest, unvisited."""
        newest = self._older[_END]
        self._older[key], self._newer[key] = newest, _END
        self._newer[newest] = self._older[_END] = key
        self._visited[key] = False

    def on_access(self, key: int, now: float = 0.0) -> None:
        """Set the visited bit."""
        self._visited[key] = True

    def on_remove(self, key: int) -> None:
        """Unlink ``key``; a hand resting on it moves to its newer neighbour."""
        older, newer = self._older.pop(key), self._newer.pop(key)
        self._newer[older], self._older[newer] = newer, older
        del self._visited[key]
        if self._hand == key:
            self._hand = newer

    def on_evict(self, key: int) -> None:
        """Walk the hand to ``key`` clearing visited bits, then unlink it."""
        if key not in self._visited:
            raise KeyError(key)
        cur = self._hand
        while cur != key or self._visited[key]:  # the virtual walk may pass key once
            if cur != _END:
                self._visited[cur] = False
            cur = self._newer[cur]
        self._hand = key
        self.on_remove(key)

    def victims(self, n: int, pinned: PinnedMask = None) -> list[int]:
        """Walk a virtual hand; visited keys are cleared virtually on the first pass."""
        is_pinned = pinned_predicate(pinned)
        out: list[int] = []
        chosen: set[int] = set()
        cleared: set[int] = set()
        cur = self._hand if self._hand != _END else self._newer[_END]
        for _ in range(2 * len(self._visited) + 2):
            if len(out) >= n:
                break
            if cur == _END:
                cur = self._newer[_END]
                continue
            if cur not in chosen:
                if self._visited[cur] and cur not in cleared:
                    cleared.add(cur)
                elif not is_pinned(cur):
                    out.append(cur)
                    chosen.add(cur)
            cur = self._newer[cur]
        return out

    def fast_replay(self, trace: AccessTrace, capacity: int) -> np.ndarray:
        """Hit mask of a fresh demand-cached pool (fused loop, same hits as the interface)."""
        return fastpath.sieve(trace.keys, capacity)
