"""Swap preemption: a preempted request's KV goes to DRAM and comes back (vLLM v0's swap).

A block shared with a request still in HBM stays there: the swapped request takes a DRAM
copy of every block, and an HBM block is freed at its last reference only. DRAM keeps a
block while any swapped-out request holds it (``holds``).
"""

from __future__ import annotations

import numpy as np

from sim.kv.parts import KvParts
from sim.memory.blocks import DRAM, HBM


class SwapSpace:
    """Which requests are swapped out, and how many of them hold each block."""

    def __init__(self, kv: KvParts):
        self.kv = kv
        self.swapped: set[int] = set()
        self.holds: dict[int, int] = {}  # block -> swapped-out requests holding it

    def swap_out(self, rid: int) -> bool:
        """Copy ``rid``'s blocks to DRAM and free them in HBM, if DRAM can take them.

        Its blocks already in DRAM (written through) are pinned before room is made for the
        others, so that no eviction takes them.
        """
        kv = self.kv
        dram, hbm, t = kv.tiers[DRAM], kv.tiers[HBM], kv.table
        blocks = kv.blocks[rid]
        there = t.where[DRAM, blocks]
        moving = [b for b, x in zip(blocks, there.tolist(), strict=True) if not x]
        copies = np.asarray(blocks)[there].tolist()
        if dram.available - int(np.count_nonzero(dram.evictable.members(copies))) < len(moving):
            return False
        dram.pin_many(copies)
        kv.cascade.make_room(dram, len(moving))
        now, holds = kv.now, self.holds
        for b in blocks:
            if t.ref[b] - 1 == holds.get(b, 0) and t.where[HBM, b]:  # nobody else in HBM
                hbm.remove(b)
            if not t.where[DRAM, b]:
                dram.add(b, now, evictable=False)
            holds[b] = holds.get(b, 0) + 1
        kv.copies.wait_for(
            kv.links.d2h.transfer(len(moving) * dram.block_bytes, kv.copies.piece_bytes)
        )
        self.swapped.add(rid)
        kv.counters.swaps += 1
        return True

    def swap_in(self, rid: int) -> None:
        """Bring a swapped request's blocks back to HBM (the step waits for the copy). A block
        still in HBM (shared with a request there) needs no copy; a block another swapped-out
        request holds keeps its DRAM copy."""
        kv = self.kv
        blocks, t, holds, home = kv.blocks[rid], kv.table, self.holds, kv.home
        coming = self.blocks_in(rid)
        kv.cascade.make_room(home, coming)
        now, dram = kv.now, kv.tiers[DRAM]
        for b in blocks:
            holds[b] -= 1
            if not holds[b]:
                del holds[b]
                dram.remove(b)
            if not t.where[HBM, b]:  # (one there is in use by another request: pinned)
                home.add(b, now, evictable=False)
        kv.copies.wait_for(kv.links.h2d.transfer(coming * dram.block_bytes, kv.copies.piece_bytes))
        self.swapped.discard(rid)

    def blocks_in(self, rid: int) -> int:
        """Blocks of swapped-out ``rid`` that :meth:`swap_in` copies (those not in HBM)."""
        blocks = self.kv.blocks[rid]
        return len(blocks) - int(np.count_nonzero(self.kv.table.where[HBM, blocks]))

    def leave_hbm(self, blocks: np.ndarray) -> None:
        """Blocks (in use) that only swapped-out requests hold now leave HBM: they have their
        DRAM copies, and come back with them (vLLM frees a GPU block at its last reference)."""
        t, hbm, holds = self.kv.table, self.kv.tiers[HBM], self.holds
        for b in blocks.tolist():
            if t.where[HBM, b] and t.ref[b] == holds.get(b, 0):
                hbm.remove(b)
