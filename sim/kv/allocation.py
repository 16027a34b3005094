"""Blocks for many requests at once: :meth:`KvManager.allocate` for each, in bulk.

An allocation that finds the home tier short evicts what it lacks; its victims go down the
tiers (:mod:`sim.kv.cascade`) before its blocks are taken. Where every victim is simply
lost (no tier below keeps it, no pool hears of it, no prefetcher spares HBM blocks), the
victims of all the allocations, in order, are one eviction (the new blocks are in use, so
none of them is a victim of a later allocation), dropped at once; each allocation then takes
the ids it would have taken (:meth:`BlockTable.new_in_turn`), and the new blocks' heat is
drawn at once (the same draws, in the same order).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sim.memory.blocks import HBM

if TYPE_CHECKING:
    from sim.kv.manager import KvManager

FEW_ALLOCATIONS = 3  # fewer growing requests than this are allocated one call each


def allocate_each(kv: KvManager, rids: np.ndarray, tokens: np.ndarray) -> None:
    """``kv.allocate(rid, tokens)`` for each of ``rids`` (distinct) in order; the home tier
    can give them all (``available``)."""
    need = np.maximum(-(-tokens // kv.bt) - kv.held[rids], 0)
    grow = np.flatnonzero(need)
    if len(grow) < FEW_ALLOCATIONS or not victims_are_lost(kv):
        for rid, n in zip(rids[grow].tolist(), tokens[grow].tolist(), strict=True):
            kv.allocate(rid, n)
        return
    rids, counts = rids[grow].tolist(), need[grow].tolist()
    home, table = kv.home, kv.table
    short = shortfalls(counts, home.free_slots)
    victims = home.evict(sum(short))
    kv.cascade.demote_many(victims, home)
    ids = np.asarray(victims, dtype=np.int64)
    lost = table.owner[ids] < 0  # victims whose ids are free again
    ends = np.cumsum(short).tolist()
    freed = [ids[e - n : e][lost[e - n : e]].tolist() for n, e in zip(short, ends, strict=True)]
    held = kv.held
    starts = held[rids].tolist()
    heat = kv.access.initial_heats(sum(counts))
    blocks = table.new_in_turn(rids, starts, counts, freed, heat)
    home.add_pinned([b for ids in blocks for b in ids])
    lists = kv.blocks
    for rid, ids in zip(rids, blocks, strict=True):
        lists[rid].extend(ids)
    held[rids] += counts


def victims_are_lost(kv: KvManager) -> bool:
    """Whether the home tier's eviction victims are only dropped: none is copied below, no
    pool is told of it, no prefetcher spares blocks in it."""
    cascade, home = kv.cascade, kv.home
    if cascade.below(home) is not None or cascade.on_lost is not None:
        return False
    return home.index != HBM or kv.prefetch.spare is None


def shortfalls(counts: list[int], free: int) -> list[int]:
    """The blocks each of a run of allocations (``counts`` each, in order, from ``free``
    free slots) must evict: what its count lacks of the slots free at its turn."""
    out = []
    for n in counts:
        out.append(max(n - free, 0))
        free = max(free - n, 0)
    return out
