"""``offload``: as ``hbm`` for running requests; cached prefix blocks also go down to DRAM
(written through when computed, or written back when evicted) and from DRAM to SSD; a
lower-tier hit is loaded, not recomputed."""

from __future__ import annotations

import numpy as np

from sim.kv.modes.base import Mode
from sim.memory.blocks import DRAM


class OffloadMode(Mode):
    name = "offload"

    def register(self, blocks: list[int], hashes: np.ndarray, start: int, end: int) -> None:
        """Write-through: register ``blocks[start:end]`` one at a time, each copied to DRAM
        (whose evictions may drop a block and so free its hash for the next one); in bulk
        where every one registers whatever the copies drop (:meth:`BlockTable.all_new`)."""
        kv = self.kv
        if kv.config.kv.write_policy != "write_through":
            super().register(blocks, hashes, start, end)
            return
        table, dram = kv.table, kv.tiers[DRAM]
        # (a copy's evictions only drop hashes: each registers when all are new at the start)
        if table.all_new(hashes[start:end].tolist()):
            ids = blocks[start:end]
            table.register_new(ids, hashes[start:end])
            kv.cascade.insert_each(dram, ids, "d2h")
            return
        for i in range(start, end):
            b = blocks[i]
            table.register(b, int(hashes[i]))
            if not table.where[DRAM, b] and table.hash[b] and kv.cascade.insert(dram, b):
                kv.copies.add("d2h", dram.block_bytes, blocking=False)
