"""``dram_centric`` (Omni Cache): DRAM is every block's home and bounds admission; HBM
caches hot blocks in whatever weights, activations and staging leave, and each step fetches
the blocks it reads that are not cached."""

from __future__ import annotations

import math
from functools import cached_property

import numpy as np
import simpy

from sim.config.parallel import kv_share
from sim.kv.modes.base import Mode, StepIO
from sim.memory.blocks import DRAM, HBM
from sim.memory.tiers import Tier


def distinct_ids(ids: np.ndarray) -> bool:
    """Whether ``ids`` has no repeats (a quick test first: increasing ids are distinct)."""
    if bool((ids[1:] > ids[:-1]).all()):
        return True
    return len(set(ids.tolist())) == len(ids)


class DramCentricMode(Mode):
    name = "dram_centric"
    home_index = DRAM
    hbm_is_cache = True
    can_swap = False  # preemption releases (the blocks stay at home in DRAM)

    @cached_property
    def cap_blocks(self) -> int | float:
        """Blocks ``kv.hbm.capacity`` holds (per GPU, over its share of a block); inf: auto."""
        config = self.kv.config
        capacity = config.kv.hbm.capacity
        if capacity == "auto":
            return math.inf
        share = kv_share(config.model, config.tensor_parallel_size)
        return int(capacity // (self.kv.tiers[HBM].block_bytes * share))

    @cached_property
    def fetch_piece(self) -> float:
        """Bytes of one contiguous chunk of a step's fetch: the copy layout's, and, fetched
        layer by layer, at most one layer's slice of a block."""
        kv = self.kv
        piece = kv.copies.piece_bytes
        if kv.config.kv.layerwise or kv.config.engine.layer_events:
            piece = min(piece, kv.tiers[DRAM].block_bytes / kv.layers)
        return piece

    def hbm_victims(self, victims: list[int]) -> bool:
        """Blocks evicted from the HBM cache are still at home: write back the dirty ones."""
        kv, t = self.kv, self.kv.table
        ids = np.asarray(victims, dtype=np.int64)
        ids = ids[t.owner[ids] >= 0]
        if kv.prefetch.active:
            for b in ids.tolist():
                kv.prefetch.forget(b)
        dirty = ids[t.dirty[ids]]
        kv.copies.add_each("d2h", kv.tiers[DRAM].block_bytes, len(dirty), blocking=True)
        t.dirty[dirty] = False
        return True

    def left_home(self, blocks: np.ndarray) -> None:
        """HBM caches DRAM: blocks leaving home leave the cache."""
        self.kv.tiers[HBM].remove_many(blocks)

    def reads_counted(self) -> bool:
        return False

    def place_reads(
        self, need: np.ndarray, pinned: np.ndarray, batch: tuple[np.ndarray, ...],
        room_bytes: float, blocking: list[simpy.Event], attended: np.ndarray,
    ) -> StepIO:  # fmt: skip
        """Fit the HBM cache into ``room_bytes``: hits stay, misses are fetched (and cached
        unless read directly), the blocks the step writes are cached."""
        kv, t = self.kv, self.kv.table
        hbm, dram = kv.tiers[HBM], kv.tiers[DRAM]
        in_hbm = t.where[HBM, need]
        misses, present = need[~in_hbm], need[in_hbm]
        kv.counters.access_hbm_hits += len(present)
        if kv.prefetch.active:
            kv.prefetch.used(present)
            blocking.extend(kv.prefetch.waits(present.tolist()))  # staged, still arriving
        hbm.touch_many(present, kv.now)
        direct = kv.config.kv.direct_read
        staging = 0.0 if direct else 2.0 * len(misses) * hbm.block_bytes / kv.layers
        # NOTE: a fetch whose double buffer exceeds the HBM left streams through what is left
        staging = min(staging, max(room_bytes, 0.0))
        hbm.capacity = min(max(int((room_bytes - staging) // hbm.block_bytes), 0), self.cap_blocks)
        self._shrink(hbm, pinned)
        if not direct:
            self._cache(hbm, misses, pinned)
        ids, context, new = batch
        write_policy = kv.config.kv.write_policy
        self._cache(hbm, self._produced(ids, context, new), pinned, write_policy == "write_back")
        if write_policy == "write_through":
            per_token = dram.block_bytes / kv.bt
            kv.links.d2h.transfer(float(new.sum()) * per_token, kv.copies.piece_bytes)
        kv.copies.flush()
        blocking.extend(kv.copies.take_blocking())
        fetch = len(misses) * dram.block_bytes
        decompress = len(misses) * hbm.block_bytes if dram.block_bytes != hbm.block_bytes else 0.0
        # a direct read loads cache lines in place (coherent link): no per-chunk copy cost
        chunk = fetch if direct else self.fetch_piece
        return StepIO(fetch, chunk, blocking, staging, attended, decompress)

    def _produced(self, ids: np.ndarray, context: np.ndarray, new: np.ndarray) -> np.ndarray:
        """Blocks this step starts writing (its new tokens' blocks not yet holding KV)."""
        bt, lists = self.kv.bt, self.kv.blocks
        first, end = -(-context // bt), -(-(context + new) // bt)
        out = []
        for i in np.flatnonzero(end > first).tolist():  # most decodes start no block
            out.extend(lists[ids[i]][first[i] : end[i]])
        return np.asarray(out, dtype=np.int64)

    def _shrink(self, hbm: Tier, pinned: np.ndarray) -> None:
        """Evict the HBM cache down to its capacity, unpinned blocks first."""
        over = hbm.resident - hbm.capacity
        for mask in (pinned, None):
            if over <= 0:
                return
            self.kv.cascade.demote_many(hbm.evict(over, mask), hbm)
            over = hbm.resident - hbm.capacity

    def _cache(
        self, hbm: Tier, blocks: np.ndarray, pinned: np.ndarray, dirty: bool = False
    ) -> None:
        """Insert ``blocks`` into the HBM cache while room can be made from unpinned blocks.

        NOTE: inserting the blocks one at a time, each evicting the oldest unpinned block,
        evicts the same blocks as one eviction of all the room needed up front, as long as
        the blocks resident before suffice (inserted ones are newer than all of them); the
        rest, if any, goes one at a time.
        """
        kv, t = self.kv, self.kv.table
        now = kv.now
        todo = blocks[~t.where[HBM, blocks]]
        if len(todo) > 1 and distinct_ids(todo):
            short = len(todo) - hbm.free_slots
            victims = hbm.evict(short, pinned)
            self.hbm_victims(victims)
            fits = len(todo) - max(short - len(victims), 0)
            hbm.add_evictable_many(todo[:fits], now)
            t.dirty[todo[:fits]] = dirty
            blocks = todo[fits:]
        for b in blocks.tolist():
            if t.where[HBM, b]:
                continue
            if hbm.free_slots < 1:
                victims = hbm.evict(1, pinned)
                if not victims:
                    return
                kv.cascade.demote(victims[0], hbm)
            hbm.add(b, now, evictable=True)
            t.dirty[b] = dirty

    def kv_bytes(self) -> tuple[float, float]:
        t, hbm = self.kv.table, self.kv.tiers[HBM]
        n = t.size
        running = np.count_nonzero(t.where[HBM, :n] & (t.ref[:n] > 0))
        return running * hbm.block_bytes, (hbm.resident - running) * hbm.block_bytes
