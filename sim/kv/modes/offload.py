"""``offload``: as ``hbm`` for running requests; cached prefix blocks also go down to DRAM
(written through when computed, or written back when evicted) and from DRAM to SSD; a
lower-tier hit is loaded, not recomputed."""

from __future__ import annotations

import numpy as np

from sim.kv.modes.base import Mode
from sim.memory.blocks import DRAM, NO_HASH, BlockTable


class OffloadMode(Mode):
    name = "offload"

    def register(self, blocks: list[int], hashes: np.ndarray, start: int, end: int) -> None:
        """Write-through: register ``blocks[start:end]`` one at a time, each copied to DRAM
        (whose evictions may drop a block and so free its hash for the next one); in bulk
        where every one registers whatever the copies drop (:func:`all_register`)."""
        kv = self.kv
        if kv.config.kv.write_policy != "write_through":
            super().register(blocks, hashes, start, end)
            return
        table, dram = kv.table, kv.tiers[DRAM]
        if all_register(table, hashes[start:end]):
            ids = blocks[start:end]
            table.register_many(ids, hashes[start:end])
            kv.cascade.insert_each(dram, ids, "d2h")
            return
        for i in range(start, end):
            b = blocks[i]
            table.register(b, int(hashes[i]))
            if not table.where[DRAM, b] and table.hash[b] and kv.cascade.insert(dram, b):
                kv.copies.add("d2h", dram.block_bytes, blocking=False)


def all_register(table: BlockTable, hashes: np.ndarray) -> bool:
    """Whether each of ``hashes`` registers, registered one at a time with copies between:
    each one a hash, new, and unlike the others (a copy's evictions only drop hashes)."""
    keys = hashes.tolist()
    return (
        NO_HASH not in keys and table.index.keys().isdisjoint(keys) and len(set(keys)) == len(keys)
    )
