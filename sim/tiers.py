"""A memory tier: capacity in blocks, residents, and an eviction policy over the evictable ones."""

from __future__ import annotations

import numpy as np

from policies.base import EvictionPolicy
from sim.blocks import BlockTable


class Tier:
    """One tier (HBM, DRAM or SSD) of the block table.

    Invariant: ``resident == table.where[index].sum() <= capacity`` (HBM in ``dram_centric``
    may shrink below ``resident`` for an instant; the manager evicts back under it). The
    policy knows exactly the evictable residents (``evictable``); eviction picks among them.
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
        self.evictable: set[int] = set()
        self._positions = hasattr(policy, "set_position")  # length-aware eviction

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

    def remove(self, b: int) -> None:
        """``b`` leaves this tier (not an eviction: freed, or moved by the manager)."""
        self.pin(b)
        self.table.where[self.index, b] = False
        self.resident -= 1

    def make_evictable(self, b: int, now: float) -> None:
        """Tell the policy about ``b``: it may now be chosen as a victim."""
        if b not in self.evictable:
            self.evictable.add(b)
            if self._positions:
                self.policy.set_position(b, int(self.table.position[b]))  # type: ignore[attr-defined]
            self.policy.on_insert(b, now)

    def pin(self, b: int) -> None:
        """``b`` may not be evicted (in use); the policy forgets it."""
        if b in self.evictable:
            self.evictable.discard(b)
            self.policy.on_remove(b)

    def touch(self, b: int, now: float) -> None:
        """An evictable ``b`` was used (a hit)."""
        if b in self.evictable:
            self.policy.on_access(b, now)

    def evict(self, n: int, pinned: np.ndarray | None = None) -> list[int]:
        """Evict up to ``n`` evictable blocks chosen by the policy; returns them."""
        if n <= 0 or not self.evictable:
            return []
        victims = self.policy.victims(min(n, len(self.evictable)), pinned)
        for b in victims:
            self.evictable.discard(b)
            self.policy.on_evict(b)
            self.table.where[self.index, b] = False
            self.resident -= 1
        return list(victims)
