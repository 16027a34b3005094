"""Room in a tier: evict, and send each victim down the tiers (a copy below, or lost).

A victim of a tier whose ``keeps_below`` is set is copied to the tier below if it is a
cached prefix block (hashed, unreferenced) and room can be made there (which may evict in
turn: the cascade); otherwise it is lost, and a block in no tier and in no request's hands
is dropped from the block table. The mode's hooks say what else a victim means
(:class:`sim.kv.modes.base.Mode`: ``hbm_victims``, ``left_home``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sim.kv.clock import PlanClock
from sim.kv.copies import CopyQueue
from sim.kv.hooks import ModeRules, PrefetchHooks
from sim.memory.blocks import DRAM, HBM, SSD, BlockTable
from sim.memory.tiers import Tier

FEW_VICTIMS = 8  # victims demoted one at a time (cheaper than arrays for so few)


class Cascade:
    """Evictions and demotions over the tiers of one block table."""

    def __init__(
        self, table: BlockTable, tiers: list[Tier], keeps_below: list[bool], prefix: bool,
        copies: CopyQueue, clock: PlanClock,
    ):  # fmt: skip
        self.table, self.tiers, self.keeps_below = table, tiers, keeps_below
        self.prefix = prefix  # cached prefix blocks exist (worth keeping below)
        self.copies, self.clock = copies, clock
        self.mode: ModeRules
        self.home: Tier  # the mode's home tier
        self.prefetch: PrefetchHooks
        self.on_lost: Callable[[np.ndarray], None] | None = None  # hashes of lost cached blocks

    def below(self, tier: Tier) -> Tier | None:
        """Where ``tier``'s eviction victims are copied (None: they are lost)."""
        return self.tiers[tier.index + 1] if self.keeps_below[tier.index] else None

    def make_room(self, tier: Tier, n: int, pinned: np.ndarray | None = None) -> None:
        """Evict until ``n`` blocks fit in ``tier`` (the caller checked ``available``).

        Blocks a prefetcher asks to keep (``prefetch.spare``) go last, when nothing else can.
        """
        spare = self.prefetch.spare
        if spare is not None and pinned is None and tier.index == HBM:
            self.demote_many(tier.evict(n - tier.free_slots, spare), tier)
        self.demote_many(tier.evict(n - tier.free_slots, pinned), tier)

    def insert(self, tier: Tier, b: int) -> bool:
        """Place a copy of ``b`` in a lower tier as an evictable block, if room can be made
        (:meth:`make_room` for one: in a full tier, one victim) and ``b`` still exists then:
        a victim's copy down evicts below it, and that may take ``b``'s last copy (an HBM
        victim also in SSD, say), which drops it."""
        if tier.resident >= tier.capacity:
            if not tier.evictable:
                return False
            if tier.index == HBM:
                self.make_room(tier, 1)
            else:
                for v in tier.evict(1):
                    self.demote(v, tier)
            if self.table.owner[b] < 0:  # the room made took ``b`` itself from a tier below
                return False
        tier.add(b, self.clock.now, evictable=True)
        return True

    def insert_each(self, tier: Tier, blocks: list[int], link: str) -> None:
        """:meth:`insert` each of ``blocks`` not resident in ``tier`` at its turn, in order,
        each copy queued on ``link`` (not blocking) as it goes in.

        NOTE: "at its turn": an earlier one's victim may be a later one (then copied back).
        The first copy is queued at once (it places the link in the queue's order), the
        others' float sum after the loop (:meth:`CopyQueue.add_each`: the same sum).
        """
        where, insert, done = self.table.where[tier.index], self.insert, 0
        for b in blocks:
            if not where[b] and insert(tier, b):
                if not done:
                    self.copies.add(link, tier.block_bytes, blocking=False)
                done += 1
        if done > 1:
            self.copies.add_each(link, tier.block_bytes, done - 1, blocking=False)

    def demote(self, b: int, tier: Tier) -> None:
        """After ``b`` was evicted from ``tier``: copy it down if worth keeping, else forget it."""
        t = self.table
        if t.owner[b] < 0:  # already dropped: room made below for an earlier victim took it
            return
        from_hbm = tier.index == HBM
        if from_hbm:
            if self.mode.hbm_victims([b]):
                return
            if self.prefetch.active:
                self.prefetch.forget(b)
        where = t.where
        if tier is self.home and where[HBM, b]:
            self.mode.left_home(np.array([b], dtype=np.int64))
        cached = t.ref[b] == 0  # (and hashed: a cached prefix block, worth keeping)
        below = self.below(tier)
        if (
            cached
            and below is not None
            and self.prefix
            and t.hash[b]
            and not where[below.index, b]
            and self.insert(below, b)
        ):
            # an HBM slot is reused only after its copy left: that copy blocks the step
            self.copies.add("d2h" if from_hbm else "ssd_write", below.block_bytes, from_hbm)
        if cached and t.owner[b] >= 0 and not (where[HBM, b] or where[DRAM, b] or where[SSD, b]):
            if self.on_lost is not None and t.hash[b]:
                self.on_lost(t.hash[b : b + 1])
            t.drop(b)

    def demote_many(self, victims: list[int], tier: Tier) -> None:
        """:meth:`demote` each of ``victims`` (just evicted from ``tier``), in order.

        NOTE: while the tier below has a free slot for each copy going down, no demotion
        evicts there, so none changes another victim's state: those victims go in bulk; from
        the first copy that would have to evict on, one at a time.
        """
        if not victims:
            return
        if tier.index == HBM and self.mode.hbm_victims(victims):
            return
        if len(victims) <= FEW_VICTIMS:
            for b in victims:
                self.demote(b, tier)
            return
        t = self.table
        ids = np.asarray(victims, dtype=np.int64)
        ids = ids[t.owner[ids] >= 0]
        below = self.below(tier)
        down = np.zeros(len(ids), dtype=bool)
        if self.prefix and below is not None and below.available >= 1:
            down = (t.hash[ids] != 0) & (t.ref[ids] == 0) & ~t.where[below.index, ids]
        cut = len(ids)
        going = np.flatnonzero(down)
        if below is not None and len(going) > below.free_slots:
            cut = int(going[below.free_slots])
        self._demote_bulk(ids[:cut], down[:cut], tier, below)
        for b in ids[cut:].tolist():
            self.demote(b, tier)

    def _demote_bulk(
        self, ids: np.ndarray, down: np.ndarray, tier: Tier, below: Tier | None
    ) -> None:
        """:meth:`demote` ``ids`` in bulk: ``down`` ones get a copy below, with no eviction."""
        t = self.table
        if tier.index == HBM and self.prefetch.active:
            for b in ids.tolist():
                self.prefetch.forget(b)
        if tier is self.home:
            self.mode.left_home(ids)
        if below is not None and down.any():
            going = ids[down]
            below.add_evictable_many(going, self.clock.now)
            link = "d2h" if tier.index == HBM else "ssd_write"
            self.copies.add_each(link, below.block_bytes, len(going), blocking=tier.index == HBM)
        where = t.where
        gone = ~(where[HBM, ids] | where[DRAM, ids] | where[SSD, ids]) & (t.ref[ids] == 0)
        if gone.any():
            lost = ids[gone]
            if self.on_lost is not None:
                hashes = t.hash[lost]
                self.on_lost(hashes[hashes != 0])
            t.drop_many(lost)
