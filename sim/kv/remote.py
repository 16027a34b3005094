"""The cluster-wide KV pool (``cluster.kv_pool``) and an instance's way to it over its NIC.

The pool holds blocks by prefix hash, so any instance finds the blocks another wrote (as
Mooncake Store, LMCache's remote backend or Dynamo's KVBM remote tier do). It has a capacity
in blocks and an eviction policy over its slots; every byte in or out crosses the pool's
aggregate bandwidth (one fluid-shared link) and the instance's NIC (its own link per
direction). A transfer takes both at once and ends when the slower is done: where the two
are shared by different sets of transfers this is an approximation of max-min fairness
(docs/cluster.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import simpy

from policies.base import EvictionPolicy
from sim.memory.links import Link


class KvPoolStore:
    """The pool's blocks: ``hash -> slot``, a policy over slots, and the aggregate link."""

    def __init__(self, capacity: int, block_bytes: float, policy: EvictionPolicy, link: Link):
        self.capacity, self.block_bytes = capacity, block_bytes
        self.policy, self.link = policy, link
        self.slot_of: dict[int, int] = {}
        self.hash_of = np.zeros(capacity, dtype=np.uint64)
        self._free = list(range(capacity - 1, -1, -1))
        self.writing: dict[int, simpy.Event] = {}  # hashes on their way in: their write
        self.blocks_written = 0
        self.blocks_evicted = 0

    @property
    def resident(self) -> int:
        """Blocks in the pool."""
        return len(self.slot_of)

    def leading(self, hashes: np.ndarray) -> int:
        """How many of ``hashes``, from the first, the pool holds (a prefix match)."""
        slot_of = self.slot_of
        for n, h in enumerate(hashes.tolist()):
            if h not in slot_of:
                return n
        return len(hashes)

    def touch(self, hashes: np.ndarray, now: float) -> None:
        """The pool's copies of ``hashes`` were read (hits, for the eviction policy)."""
        for h in hashes.tolist():
            self.policy.on_access(self.slot_of[h], now)

    def missing(self, hashes: list[int]) -> list[int]:
        """Those of ``hashes`` neither in the pool nor on their way in (distinct, in order)."""
        writing, slot_of = self.writing, self.slot_of
        fresh = [h for h in hashes if h not in writing and h not in slot_of]
        return list(dict.fromkeys(fresh))  # distinct, first occurrence kept

    def claim(self, hashes: list[int], done: simpy.Event) -> None:
        """``hashes`` (missing ones) are on their way in until ``done`` fires, then land."""
        self.writing.update(dict.fromkeys(hashes, done))
        done.callbacks.append(lambda _: self.insert(hashes, done.env.now))

    def in_flight(self, hashes: list[int]) -> list[simpy.Event]:
        """The writes still carrying some of ``hashes`` (distinct)."""
        writing = self.writing
        return list({id(e): e for h in hashes if (e := writing.get(h)) is not None}.values())

    def insert(self, hashes: list[int], now: float) -> None:
        """Written blocks land: each takes a slot, evicting by the policy when full."""
        for h in hashes:
            self.writing.pop(h, None)
            if h in self.slot_of:
                continue
            if not self._free:
                (victim,) = self.policy.evict(1)
                del self.slot_of[int(self.hash_of[victim])]
                self._free.append(victim)
                self.blocks_evicted += 1
            slot = self._free.pop()
            self.slot_of[h] = slot
            self.hash_of[slot] = h
            self.policy.on_insert(slot, now)
            self.blocks_written += 1


@dataclass
class RemoteKv:
    """One instance's access to the pool: its NIC (``nic_in``, ``nic_out``) and counts."""

    env: simpy.Environment
    store: KvPoolStore
    nic_in: Link
    nic_out: Link
    now: Callable[[], float]
    blocks_fetched: int = 0
    blocks_put: int = 0

    def leading(self, hashes: np.ndarray) -> int:
        """How many of ``hashes``, from the first, the pool holds."""
        return self.store.leading(hashes)

    def fetch(self, hashes: np.ndarray) -> simpy.Event:
        """Read the pool's copies of ``hashes`` over the NIC; the event fires when all landed."""
        self.store.touch(hashes, self.now())
        self.blocks_fetched += len(hashes)
        return self.move(len(hashes) * self.store.block_bytes, self.nic_in)

    def put(self, hashes: np.ndarray) -> None:
        """Write the blocks of ``hashes`` the pool lacks (write-through or an eviction); they
        are found there once the copy has landed."""
        new = self.store.missing(hashes.tolist())
        if new:
            self.claim(new, self.move(len(new) * self.store.block_bytes, self.nic_out))

    def claim(self, new: list[int], landed: simpy.Event) -> None:
        """``new`` (hashes the pool lacks) are written by this instance: found in the pool
        once ``landed`` fires, and counted as put."""
        self.blocks_put += len(new)
        self.store.claim(new, landed)

    def move(self, size: float, nic: Link) -> simpy.Event:
        """``size`` bytes across ``nic`` and the pool's link at once."""
        return simpy.AllOf(self.env, [nic.transfer(size), self.store.link.transfer(size)])
