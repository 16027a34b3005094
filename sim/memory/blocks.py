"""Block metadata for millions of KV blocks: numpy arrays indexed by block id.

A block is ``block_tokens`` tokens of one sequence over all layers. It may have copies in
several tiers at once (``where[tier, b]``). ``ref`` counts the live requests that use it;
a block whose prompt prefix is known carries a chained ``hash`` and, once its KV is
computed, is found through :attr:`BlockTable.index` by any request with the same prefix.
"""

from __future__ import annotations

from itertools import repeat

import numpy as np

HBM, DRAM, SSD = 0, 1, 2
TIER_NAMES = ("hbm", "dram", "ssd")
NO_HASH = 0


class BlockTable:
    """Structure of arrays over block ids; ids of dead blocks are recycled."""

    def __init__(self, initial: int = 1024):
        self.size = 0
        self._free_ids: list[int] = []
        self.where = np.zeros((3, initial), dtype=bool)
        self.ref = np.zeros(initial, dtype=np.int32)
        self.hash = np.zeros(initial, dtype=np.uint64)
        self.owner = np.full(initial, -1, dtype=np.int64)
        self.position = np.zeros(initial, dtype=np.int64)
        self.heat = np.zeros(initial)
        self.dirty = np.zeros(initial, dtype=bool)
        self.index: dict[int, int] = {}
        self.index_version = 0  # bumps whenever ``index`` changes

    @property
    def capacity(self) -> int:
        """Allocated length of the arrays."""
        return len(self.ref)

    def _grow(self) -> None:
        n = self.capacity
        self.where = np.concatenate((self.where, np.zeros((3, n), dtype=bool)), axis=1)
        for name in ("ref", "hash", "owner", "position", "heat"):
            old = getattr(self, name)
            fill = -1 if name == "owner" else 0
            setattr(self, name, np.concatenate((old, np.full(n, fill, dtype=old.dtype))))
        self.dirty = np.concatenate((self.dirty, np.zeros(n, dtype=bool)))

    def new(self, owner: int, position: int, heat: float) -> int:
        """A fresh block (no tier yet, ref 1) for ``owner``'s block number ``position``."""
        if self._free_ids:
            b = self._free_ids.pop()
        else:
            if self.size == self.capacity:
                self._grow()
            b = self.size
            self.size += 1
        self.ref[b] = 1
        self.owner[b] = owner
        self.position[b] = position
        self.heat[b] = heat
        self.hash[b] = NO_HASH
        self.dirty[b] = False
        return b

    def new_many(self, owner: int, position: int, heat: np.ndarray | float) -> list[int]:
        """``len(heat)`` fresh blocks (or one, for a float) for ``owner`` from ``position`` on.

        The same ids, in the same order, as that many :meth:`new` calls.
        """
        if isinstance(heat, float):
            return [self.new(owner, position, heat)]
        k = len(heat)
        if k <= 4:  # scalar stores beat fancy indexing on a few blocks
            return [self.new(owner, position + i, h) for i, h in enumerate(heat.tolist())]
        ids = self._take_ids(k)
        self._reset(np.asarray(ids, dtype=np.int64), owner, np.arange(position, position + k), heat)
        return ids

    def new_each(self, owners: np.ndarray, positions: np.ndarray) -> list[int]:
        """A fresh block (heat 0) for each (owner, position): the same ids, in the same order,
        as one :meth:`new` call for each."""
        ids = self._take_ids(len(owners))
        self._reset(np.asarray(ids, dtype=np.int64), owners, positions, 0.0)
        return ids

    def _take_ids(self, k: int) -> list[int]:
        """The next ``k`` ids :meth:`new` would use: recycled ones (last freed first), then
        fresh ones."""
        free = self._free_ids
        take = min(k, len(free))
        ids = free[: -take - 1 : -1] if take else []
        del free[len(free) - take :]
        fresh = k - take
        while self.size + fresh > self.capacity:
            self._grow()
        ids.extend(range(self.size, self.size + fresh))
        self.size += fresh
        return ids

    def _reset(
        self,
        at: np.ndarray,
        owner: int | np.ndarray,
        position: np.ndarray,
        heat: float | np.ndarray,
    ) -> None:
        """The metadata of fresh blocks ``at`` (ref 1, no hash, clean)."""
        self.ref[at] = 1
        self.owner[at] = owner
        self.position[at] = position
        self.heat[at] = heat
        self.hash[at] = NO_HASH
        self.dirty[at] = False

    def drop_many(self, blocks: np.ndarray) -> None:
        """:meth:`drop` each of ``blocks`` in order (none of them in a tier or referenced)."""
        hashes = self.hash[blocks]
        if hashes.any():
            named = hashes != NO_HASH
            index, keys, ids = self.index, hashes[named].tolist(), blocks[named].tolist()
            owners = list(map(index.pop, keys, repeat(None)))  # one pop each, looped in C
            if owners != ids:  # not every hash was its block's (the usual case is)
                self._undo_pops(keys, owners)
                owners = list(map(index.get, keys))  # all before any goes: as one at a time
                keys = [h for h, b, o in zip(keys, ids, owners, strict=True) if o == b]
                for h in keys:
                    del index[h]
            self.index_version += len(keys)
        self.hash[blocks] = NO_HASH
        self.owner[blocks] = -1
        self._free_ids.extend(blocks.tolist())

    def _undo_pops(self, keys: list[int], owners: list[int | None]) -> None:
        """Put back what popping ``keys`` in turn took (``owners``: each pop's value; a
        repeated key's later pops found nothing)."""
        for h, o in zip(keys, owners, strict=True):
            if o is not None:
                self.index[h] = o

    def register(self, b: int, block_hash: int) -> None:
        """Make a computed block findable by its prefix hash (first writer wins)."""
        if block_hash != NO_HASH and block_hash not in self.index:
            self.hash[b] = block_hash
            self.index[block_hash] = b
            self.index_version += 1

    def all_new(self, keys: list[int]) -> bool:
        """Whether registering ``keys`` one at a time would register every one: each a hash,
        none indexed yet, no two alike."""
        return (
            NO_HASH not in keys
            and self.index.keys().isdisjoint(keys)
            and len(set(keys)) == len(keys)
        )

    def register_many(self, blocks: list[int], hashes: np.ndarray) -> None:
        """:meth:`register` each of ``blocks`` (distinct) under its ``hashes`` entry, in order."""
        index, keys = self.index, hashes.tolist()
        if self.all_new(keys):
            self.register_new(blocks, hashes)
            return
        ids: list[int] = []
        at: list[int] = []
        for i, (b, h) in enumerate(zip(blocks, keys, strict=True)):
            if h != NO_HASH and h not in index:
                index[h] = b
                ids.append(b)
                at.append(i)
        if ids:
            self.hash[ids] = hashes[at]
            self.index_version += len(ids)

    def register_new(self, blocks: list[int], hashes: np.ndarray) -> None:
        """:meth:`register_many` where :meth:`all_new` holds (every one registers)."""
        self.index.update(zip(hashes.tolist(), blocks, strict=True))
        self.hash[blocks] = hashes
        self.index_version += len(blocks)

    def forget(self, blocks: np.ndarray) -> None:
        """``blocks`` can be found by no one any more: unregister their hashes."""
        for b, h in zip(blocks.tolist(), self.hash[blocks].tolist(), strict=True):
            if h != NO_HASH and self.index.get(h) == b:
                del self.index[h]
                self.index_version += 1
        self.hash[blocks] = NO_HASH

    def drop(self, b: int) -> None:
        """The block left every tier and no request uses it: forget it, recycle its id."""
        h = int(self.hash[b])
        if h != NO_HASH and self.index.get(h) == b:
            del self.index[h]
            self.index_version += 1
        self.hash[b] = NO_HASH
        self.owner[b] = -1
        self._free_ids.append(b)

    def in_no_tier(self, blocks: np.ndarray) -> np.ndarray:
        """Which of ``blocks`` have a copy in no tier."""
        where = self.where
        return ~(where[HBM, blocks] | where[DRAM, blocks] | where[SSD, blocks])

    def live(self) -> np.ndarray:
        """Ids of blocks in at least one tier or referenced."""
        n = self.size
        return np.flatnonzero(self.where[:, :n].any(axis=0) | (self.ref[:n] > 0))
