"""S3-FIFO: a small FIFO, a main FIFO with 2-bit CLOCK, and a ghost FIFO (Yang et al., SOSP'23)."""

from __future__ import annotations

from collections import ChainMap, deque
from collections.abc import Callable, Container, MutableMapping, Sequence
from itertools import compress, filterfalse
from operator import not_
from typing import TYPE_CHECKING

import numpy as np

from policies import fastpath
from policies.base import (
    EvictionPolicy,
    PinnedMask,
    fraction,
    non_negative,
    param_table,
    pinned_predicate,
    positive_int,
)
from policies.queues import Fifo, Queue, Shadow

if TYPE_CHECKING:
    from policies.pool import AccessTrace


class S3FIFO(EvictionPolicy):
    """New keys enter the small queue S (``small_fraction`` of capacity), ghost hits enter M.

    One eviction step: if ``|M| > capacity - |S|target`` or S is empty, scan M (a key with
    count > 0 goes back to M's new end with ``min(count, 3) - 1``; a count-0 key is the
    victim); otherwise scan S (a key with count >= ``move_threshold`` moves to M with count
    0; else it is the victim and its id enters the ghost G, bounded by ``ghost_fraction``
    of capacity). Hits count up to 3. As in libCacheSim, until the first eviction a new
    key goes to M once S is full. Pinned keys are rotated to the new end of their queue.
    ``victims()`` runs the steps on shadow queues and memoises the plan; ``on_evict``
    replays it on the real queues.
    """

    name = "s3fifo"
    hold_hooks = True  # a tier takes a block in use out of the queues (on_hold/on_release)
    params = param_table(
        small_fraction=fraction(0.1),
        ghost_fraction=non_negative(0.9),
        move_threshold=positive_int(2),
    )

    def __init__(
        self,
        capacity: int,
        small_fraction: float = 0.1,
        ghost_fraction: float = 0.9,
        move_threshold: int = 2,
    ) -> None:
        self.capacity = capacity
        self.small_size = max(1, int(capacity * small_fraction))
        self.main_size = capacity - self.small_size
        self.ghost_size = int(capacity * ghost_fraction)
        self.threshold = move_threshold
        self.small, self.main, self.ghost = Fifo(), Fifo(), Fifo()
        self.freq: dict[int, int] = {}
        self._evicted = False
        self._ghost_hit = False  # the last on_miss removed its key from the ghost
        self._version = 0
        self._plan: tuple[int, list[int], set[int]] | None = None
        self._held: dict[int, bool] = {}  # key in use -> whether it was in S

    def on_miss(self, key: int, now: float = 0.0) -> None:
        """A ghost hit leaves the ghost now, before an eviction can push it out."""
        self._ghost_hit = key in self.ghost
        if self._ghost_hit:
            del self.ghost[key]

    def on_insert(self, key: int, now: float = 0.0) -> None:
        """Ghost hits enter M, other keys S (or M while filling)."""
        self._version += 1
        if self._ghost_hit or key in self.ghost:
            self.ghost.pop(key, None)
            self._ghost_hit = False
            self.main.push(key)
        elif not self._evicted and len(self.small) >= self.small_size:
            self.main.push(key)
        else:
            self.small.push(key)
        self.freq[key] = 0

    def on_insert_many(self, keys: np.ndarray | list[int], now: float = 0.0) -> None:
        """:meth:`on_insert` each of ``keys`` (new ones), in order; in one go when each
        enters S (after the first eviction, no ghost hit)."""
        keys = keys.tolist() if isinstance(keys, np.ndarray) else keys
        if self._ghost_hit or not self._evicted:
            for key in keys:
                self.on_insert(key, now)
            return
        self._version += len(keys)
        small, main, ghost, freq = self.small, self.main, self.ghost, self.freq
        hits = ghost.keys() & keys
        if not hits:
            small.update(dict.fromkeys(keys))  # (in order, as one push each)
        else:  # (pushes to M and to S commute: each queue's in the keys' order)
            deque(map(ghost.__delitem__, hits), maxlen=0)
            main.update(dict.fromkeys(filter(hits.__contains__, keys)))
            small.update(dict.fromkeys(filterfalse(hits.__contains__, keys)))
        freq.update(dict.fromkeys(keys, 0))

    def on_access(self, key: int, now: float = 0.0) -> None:
        """Count the hit (capped at 3)."""
        self._version += 1
        self.freq[key] = min(self.freq[key] + 1, 3)

    def on_remove(self, key: int) -> None:
        """Forget ``key`` (held or queued) without a ghost entry."""
        self._version += 1
        del self.freq[key]
        if key in self._held:
            del self._held[key]
        else:
            del (self.small if key in self.small else self.main)[key]

    def on_hold(self, key: int) -> None:
        """``key`` is in use again: out of its queue, its count and queue remembered."""
        self._version += 1
        in_small = key in self.small
        del (self.small if in_small else self.main)[key]
        self._held[key] = in_small

    def on_hold_many(self, keys: list[int]) -> None:
        """:meth:`on_hold` each of ``keys`` (queued ones), in order."""
        self._version += len(keys)
        small = self.small
        in_small = list(map(small.__contains__, keys))
        # (deletions commute: from either queue, in any order)
        deque(map(small.__delitem__, compress(keys, in_small)), maxlen=0)
        deque(map(self.main.__delitem__, compress(keys, map(not_, in_small))), maxlen=0)
        self._held.update(zip(keys, in_small, strict=True))

    def on_release(self, key: int, now: float = 0.0) -> None:
        """The use ended: back at the new end of its queue, the use counted as a hit."""
        self._version += 1
        (self.small if self._held.pop(key) else self.main).push(key)
        self.freq[key] = min(self.freq[key] + 1, 3)

    def on_release_many(self, keys: list[int], now: float = 0.0) -> None:
        """:meth:`on_release` each of ``keys`` (held ones), in order."""
        self._version += len(keys)
        held, freq = self._held, self.freq
        in_small = list(map(held.pop, keys))
        # (pushes to S and to M commute: each queue's in the keys' order)
        self.small.update(dict.fromkeys(compress(keys, in_small)))
        self.main.update(dict.fromkeys(compress(keys, map(not_, in_small))))
        counts = [c + 1 if c < 3 else 3 for c in map(freq.__getitem__, keys)]
        freq.update(zip(keys, counts, strict=True))

    def on_evict(self, key: int) -> None:
        """Apply the planned steps up to ``key``; a victim from S enters the ghost."""
        plan = self._plan
        if plan is not None and plan[0] == self._version and plan[1] and plan[1][0] == key:
            plan[1].pop(0)
            victim, from_small = self._step(self.small, self.main, self.freq, plan[2].__contains__)
            assert victim == key, "S3-FIFO plan diverged from its replay"
        else:  # not planned: evict it where it stands
            self._plan = None
            from_small = key in self.small
            del (self.small if from_small else self.main)[key]
        self._forget_victim(key, from_small)

    def evict(self, n: int, pinned: PinnedMask = None) -> list[int]:
        """:meth:`victims` and :meth:`on_evict` each, with no key pinned: the steps taken on
        the real queues, as the replay of the plan would take them."""
        if pinned is not None:  # (a step that finds no victim must leave the queues as they were)
            return super().evict(n, pinned)
        self._plan = None
        return self._steps(n, None, ())

    def insert_evicting(
        self, keys: Sequence[int], free: int, now: float = 0.0, pinned: PinnedMask = None,
        stop: Container[int] = (),
    ) -> tuple[int, list[int]]:  # fmt: skip
        """:meth:`EvictionPolicy.insert_evicting` in one pass (:meth:`_steps`)."""
        if pinned is not None or self._ghost_hit or free >= len(keys):
            return super().insert_evicting(keys, free, now, pinned, stop)
        if free > 0:
            self.on_insert_many(list(keys[:free]), now)
        self._plan = None
        victims = self._steps(len(keys) - free, keys[free:], stop)
        self._version += len(victims)
        return free + len(victims), victims

    def _steps(self, n: int, keys: Sequence[int] | None, stop: Container[int]) -> list[int]:
        """Up to ``n`` eviction steps on the real queues, no key pinned (as :meth:`_step`
        then :meth:`_forget_victim`; none once both queues are empty), each victim followed,
        when ``keys`` are given, by the insert of the next key (as :meth:`on_insert` after
        an eviction: into S, or into M on a ghost hit); the victims, stopping after one in
        ``stop``. Taken inline: this is the cascade's inner loop."""
        small, main, ghost, freq = self.small, self.main, self.ghost, self.freq
        main_size, threshold, ghost_size = self.main_size, self.threshold, self.ghost_size
        pop_small, pop_main, pop_ghost = small.popitem, main.popitem, ghost.popitem
        victims: list[int] = []
        for i in range(n):
            victim = -1
            if small and len(main) <= main_size:  # scan S first (its oldest is the usual victim)
                victim = pop_small(False)[0]
                if freq[victim] >= threshold:
                    freq[victim] = 0
                    main[victim] = None
                    victim = -1
                    for _ in range(len(small)):
                        k = pop_small(False)[0]
                        if freq[k] >= threshold:
                            freq[k] = 0
                            main[k] = None
                        else:
                            victim = k
                            break
            if victim >= 0:  # from S: into the ghost
                if ghost_size > 0:
                    ghost[victim] = None
                    if len(ghost) > ghost_size:
                        pop_ghost(False)
            elif not main:  # both queues empty: the step changed nothing
                break
            else:  # scan M (every count reaches 0 within four rounds)
                while True:
                    k = pop_main(False)[0]
                    count = freq[k]
                    if count > 0:
                        freq[k] = count - 1 if count <= 3 else 2
                        main[k] = None
                    else:
                        victim = k
                        break
            del freq[victim]
            victims.append(victim)
            if keys is not None:
                key = keys[i]
                if key in ghost:
                    del ghost[key]
                    main[key] = None
                else:
                    small[key] = None
                freq[key] = 0
                if victim in stop:
                    break
        if victims:
            self._evicted = True
        return victims

    def _forget_victim(self, key: int, from_small: bool) -> None:
        """An evicted ``key`` (out of its queue) is forgotten; a victim from S enters the ghost."""
        del self.freq[key]
        self._evicted = True
        if from_small and self.ghost_size > 0:
            ghost = self.ghost
            ghost[key] = None
            if len(ghost) > self.ghost_size:
                ghost.popitem(False)

    def victims(self, n: int, pinned: PinnedMask = None) -> list[int]:
        """Run ``n`` eviction steps on shadows of S and M; remember the plan."""
        check, seen_pinned = pinned_predicate(pinned), set[int]()

        def is_pinned(key: int) -> bool:
            if check(key):
                seen_pinned.add(key)
                return True
            return False

        small, main = Shadow(self.small), Shadow(self.main)
        freq: MutableMapping[int, int] = ChainMap({}, self.freq)
        out: list[int] = []
        while len(out) < n:
            key, _ = self._step(small, main, freq, is_pinned)
            if key is None:
                break
            out.append(key)
        self._plan = (self._version, list(out), seen_pinned)
        return out

    def _step(
        self,
        small: Queue,
        main: Queue,
        freq: MutableMapping[int, int],
        is_pinned: Callable[[int], bool],
    ) -> tuple[int | None, bool]:
        """One eviction step: (victim or None, whether it came from S)."""
        main_first = len(main) > self.main_size or len(small) == 0
        # (popitem and item assignment: a Fifo's own C calls, no wrapper call per key)
        for from_small in (False, True) if main_first else (True, False):
            if from_small:
                for _ in range(len(small)):
                    key = small.popitem(False)[0]
                    if freq[key] >= self.threshold:
                        freq[key] = 0
                        main[key] = None
                    elif is_pinned(key):
                        small[key] = None
                    else:
                        return key, True
            else:
                for _ in range(4 * len(main)):  # counts <= 3: four rounds reach every count 0
                    key = main.popitem(False)[0]
                    count = freq[key]
                    if count > 0 or is_pinned(key):
                        freq[key] = max(min(count, 3) - 1, 0)
                        main[key] = None
                    else:
                        return key, False
        return None, False

    def fast_replay(self, trace: AccessTrace, capacity: int) -> np.ndarray:
        """Hit mask of a fresh demand-cached pool (fused loop, same hits as the interface)."""
        return fastpath.s3fifo(
            trace.keys, capacity, self.small_size, self.ghost_size, self.threshold
        )
