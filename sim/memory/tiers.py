"""A memory tier: capacity in blocks, residents, and an eviction policy over the evictable ones."""

from __future__ import annotations

from collections.abc import Container
from itertools import pairwise

import numpy as np

from policies.base import EvictionPolicy
from sim.memory.blocks import BlockTable
from sim.memory.keyset import KeySet


class Tier:
    """One tier (HBM, DRAM or SSD) of the block table.

    Invariant: ``resident == table.where[index].sum() <= capacity`` (HBM in ``dram_centric``
    may shrink below ``resident`` for an instant; the manager evicts back under it). The
    policy knows exactly the residents that are ``evictable`` or ``held``, and picks victims
    among the evictable ones. A held block is a known block in use again (a prefix hit, a
    copy being read): the policy keeps its history, and sees the use as an access when it
    ends, so frequency-aware policies (LFU, ARC, S3-FIFO, SIEVE) count reuse; LRU order is
    release order, as in vLLM's free-block queue.
    """

    def __init__(
        self, index: int, name: str, capacity: int, block_bytes: float,
        policy: EvictionPolicy, table: BlockTable,
    ):  # fmt: skip
        self.index = index
        self.name = name
        self.capacity = capacity
        self.block_bytes = block_bytes
        self.policy = policy
        self.table = table
        self.resident = 0
        self.evictable = KeySet()
        self.held = KeySet()  # its mask is the pinned mask victims() takes
        self._positions = hasattr(policy, "set_position")  # length-aware eviction
        # held blocks leave the policy's order (re-inserted when their use ends): victims()
        # then needs no held mask, and need not skip them
        self._hooks = policy.hold_hooks
        self._held_out = policy.access_is_insert or self._hooks
        # a hold-hooks policy that releases and inserts runs of blocks in one call each
        self._bulk_hooks = (
            self._hooks
            and not self._positions
            and _has(policy, "on_release_many", "on_insert_many")
        )

    @property
    def free_slots(self) -> int:
        """Blocks that fit without evicting anything."""
        return max(self.capacity - self.resident, 0)

    @property
    def available(self) -> int:
        """Blocks that fit after evicting every evictable resident."""
        return self.free_slots + len(self.evictable)

    @property
    def used_bytes(self) -> float:
        """Bytes of resident blocks."""
        return self.resident * self.block_bytes

    def add(self, b: int, now: float, evictable: bool) -> None:
        """``b`` becomes resident here (the caller made room)."""
        if self.resident >= self.capacity:
            raise RuntimeError(f"{self.name} tier full ({self.capacity} blocks): no room for {b}")
        self.table.where[self.index, b] = True
        self.resident += 1
        if evictable:
            self.make_evictable(b, now)

    def add_evictable_many(self, blocks: np.ndarray, now: float) -> None:
        """:meth:`add` each of ``blocks`` (distinct, none resident here) as evictable, in order."""
        if self.resident + len(blocks) > self.capacity:
            raise RuntimeError(
                f"{self.name} tier full ({self.capacity} blocks): no room for {len(blocks)} more"
            )
        many = getattr(self.policy, "on_insert_many", None)
        if many is None or self._positions:
            for b in blocks.tolist():
                self.add(b, now, evictable=True)
            return
        self.table.where[self.index, blocks] = True
        self.resident += len(blocks)
        self.evictable.update(blocks)
        many(blocks, now)

    def add_evicting(
        self, blocks: list[int], now: float, stop: Container[int] = ()
    ) -> tuple[int, list[int]]:
        """:meth:`add` each of ``blocks`` (distinct, none resident here) as evictable, in
        order, each first evicting one victim (:meth:`evict`) when the tier is full: the
        policy's inserts and evictions interleaved as one at a time would take them (a
        victim may be a block added earlier in the run). Stops after the block whose victim
        is in ``stop``; adds none when the tier is full with nothing evictable (the later
        ones then fit no more than the first: each one added is evictable).

        Returns (how many of ``blocks`` were added, the victims in order): the first
        ``free_slots`` evicted none, each later one exactly one.
        """
        free = self.free_slots
        if not blocks or (free == 0 and not self.evictable):
            return 0, []
        if free >= len(blocks):
            self.add_evictable_many(np.asarray(blocks, dtype=np.int64), now)
            return len(blocks), []
        if self._positions or self.resident > self.capacity:  # (a position before each insert)
            return self._add_evicting_each(blocks, now, stop)
        pinned = self._with_held(None) if self.held and not self._held_out else None
        done, victims = self.policy.insert_evicting(blocks, free, now, pinned, stop)
        added = blocks[:done]
        where = self.table.where[self.index]
        where[added] = True
        where[victims] = False  # (after: a block added, then evicted, is not resident)
        self.resident += done - len(victims)
        self.evictable.update(added)
        self.evictable.difference_update(victims)
        return done, victims

    def _add_evicting_each(
        self, blocks: list[int], now: float, stop: Container[int]
    ) -> tuple[int, list[int]]:
        """:meth:`add_evicting` one block at a time."""
        victims: list[int] = []
        for i, b in enumerate(blocks):
            out = self.evict(1) if self.resident >= self.capacity else []
            victims.extend(out)
            self.add(b, now, evictable=True)
            if out and out[0] in stop:
                return i + 1, victims
        return len(blocks), victims

    def add_pinned(self, blocks: list[int]) -> None:
        """:meth:`add` each of ``blocks`` as in use (not evictable)."""
        if len(blocks) == 1 and self.resident < self.capacity:
            self.table.where[self.index, blocks[0]] = True
            self.resident += 1
            return
        if self.resident + len(blocks) > self.capacity:
            raise RuntimeError(
                f"{self.name} tier full ({self.capacity} blocks): no room for {len(blocks)} more"
            )
        self.table.where[self.index, blocks] = True
        self.resident += len(blocks)

    def remove_many(self, blocks: np.ndarray) -> None:
        """:meth:`remove` each of ``blocks`` that is resident here, in order."""
        if self.resident == 0:
            return
        where = self.table.where[self.index]
        here = blocks[where[blocks]]
        if not len(here):  # (e.g. a DRAM victim the HBM cache of dram_centric does not hold)
            return
        if self.evictable or self.held:
            if self.held.isdisjoint(here):  # each one evictable or unknown to the policy
                gone = self.evictable.among(here)
                self.evictable.difference_update(gone)
                self.policy.on_remove_many(gone)
            else:
                for b in here.tolist():
                    self._forget(b)
        where[here] = False
        self.resident -= len(here)

    def remove(self, b: int) -> None:
        """``b`` leaves this tier (not an eviction: freed, or moved by the manager)."""
        self._forget(b)
        self.table.where[self.index, b] = False
        self.resident -= 1

    def make_evictable(self, b: int, now: float) -> None:
        """``b`` may now be chosen as a victim: a new block is inserted in the policy, a
        held one's use ends with an access."""
        if b in self.held:
            self.held.discard(b)
            self.evictable.add(b)
            if self._hooks:
                self.policy.on_release(b, now)  # type: ignore[attr-defined]
            elif self._held_out:
                self.policy.on_insert(b, now)
            else:
                self.policy.on_access(b, now)
        elif b not in self.evictable:
            self.evictable.add(b)
            if self._positions:
                self.policy.set_position(b, int(self.table.position[b]))  # type: ignore[attr-defined]
            self.policy.on_insert(b, now)

    def make_evictable_many(self, blocks: np.ndarray, now: float) -> None:
        """:meth:`make_evictable` each of ``blocks`` (distinct), in order.

        In one policy call where each would insert: a policy with ``on_insert_many`` that
        takes held blocks out of its order (or none is held), and no length-aware one.
        """
        many = getattr(self.policy, "on_insert_many", None)
        if self._bulk_hooks:
            self._release_or_insert(blocks, now)
            return
        keys = blocks.tolist()
        held = self.held.among(blocks) if self.held else []
        if many is None or self._positions or self._hooks or (held and not self._held_out):
            for b in keys:
                self.make_evictable(b, now)
            return
        if held:
            self.held.difference_update(held)
        new = blocks[~self.evictable.members(blocks)]  # held ones are not in it
        if len(new):
            self.evictable.update(new)
            many(new, now)

    def _release_or_insert(self, blocks: np.ndarray, now: float) -> None:
        """:meth:`make_evictable_many` for a policy with hold hooks and ``on_insert_many``:
        each run of held keys released in one call, each run of new ones inserted in one."""
        held, evictable, policy = self.held, self.evictable, self.policy
        known = evictable.members(blocks)
        is_held = held.members(blocks) if held else np.zeros(len(blocks), dtype=bool)
        if not is_held.any():
            new = blocks[~known].tolist()
            if new:
                evictable.update(new)
                policy.on_insert_many(new, now)  # type: ignore[attr-defined]
            return
        keys, n = blocks.tolist(), len(blocks)
        kinds = np.where(is_held, 2, np.where(known, 0, 1))  # 0: evictable already
        edges = (np.flatnonzero(kinds[1:] != kinds[:-1]) + 1).tolist()
        for start, end in pairwise([0, *edges, n]):
            k = kinds[start]
            if k == 0:  # evictable already: nothing to do
                continue
            run = keys[start:end]
            evictable.update(run)
            if k == 2:
                held.difference_update(run)
                policy.on_release_many(run, now)  # type: ignore[attr-defined]
            else:
                policy.on_insert_many(run, now)  # type: ignore[attr-defined]

    def pin_many(self, blocks: list[int]) -> None:
        """:meth:`pin` each of ``blocks`` (distinct), in order."""
        evictable = self.evictable
        taken = evictable.among(blocks) if evictable else []
        if not taken:
            return
        evictable.difference_update(taken)
        self.held.update(taken)
        if self._hooks:
            many = getattr(self.policy, "on_hold_many", None)
            if many is not None:
                many(taken)
            else:
                for b in taken:
                    self.policy.on_hold(b)  # type: ignore[attr-defined]
        elif self._held_out:
            self.policy.on_remove_many(taken)

    def pin(self, b: int) -> None:
        """``b`` may not be evicted while in use; a known block stays known (``held``)."""
        if b in self.evictable:
            self.evictable.discard(b)
            self.held.add(b)
            if self._hooks:
                self.policy.on_hold(b)  # type: ignore[attr-defined]
            elif self._held_out:
                self.policy.on_remove(b)

    def _forget(self, b: int) -> None:
        """The policy forgets ``b`` (it leaves the tier)."""
        if b in self.evictable:
            self.evictable.discard(b)
            self.policy.on_remove(b)
        elif b in self.held:
            self.held.discard(b)
            if self._hooks or not self._held_out:
                self.policy.on_remove(b)

    def _with_held(self, pinned: np.ndarray | None) -> np.ndarray:
        """``pinned`` (keys past its end unpinned) with the held blocks pinned too."""
        held = self.held.mask
        if pinned is None:
            return held
        out = np.zeros(max(len(pinned), len(held)), dtype=bool)
        out[: len(pinned)] = pinned
        out[: len(held)] |= held
        return out

    def touch(self, b: int, now: float) -> None:
        """An evictable ``b`` was used (a hit)."""
        if b in self.evictable:
            self.policy.on_access(b, now)

    def touch_many(self, blocks: np.ndarray, now: float) -> None:
        """:meth:`touch` each of ``blocks`` (all resident here), in order."""
        evictable = self.evictable
        if not evictable:
            return
        many = getattr(self.policy, "on_access_many", None)
        if many is not None:  # a policy that takes a step's accesses in one call
            every = len(evictable) == self.resident  # e.g. the HBM cache of dram_centric
            many(blocks if every else blocks[evictable.members(blocks)].tolist(), now)
            return
        on_access = self.policy.on_access
        for b in blocks.tolist():
            if b in evictable:
                on_access(b, now)

    def evict(self, n: int, pinned: np.ndarray | None = None) -> list[int]:
        """Evict up to ``n`` evictable blocks chosen by the policy; returns them."""
        if n <= 0 or not self.evictable:
            return []
        if self.held and not self._held_out:
            pinned = self._with_held(pinned)
        victims = list(self.policy.evict(min(n, len(self.evictable)), pinned))
        self.evictable.difference_update(victims)
        if len(victims) == 1:  # (the usual eviction: a scalar store is quicker)
            self.table.where[self.index, victims[0]] = False
        else:
            self.table.where[self.index, victims] = False
        self.resident -= len(victims)
        return victims


def _has(policy: EvictionPolicy, *methods: str) -> bool:
    """Whether ``policy`` defines each of ``methods``."""
    return all(hasattr(policy, name) for name in methods)
