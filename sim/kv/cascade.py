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
        others' float sum after the loop (:meth:`CopyQueue.add_each`: the same sum). Blocks
        in use (none can be dropped) go into a last tier in runs (:meth:`_insert_runs`).
        """
        t = self.table
        if (
            tier.index != HBM
            and tier is not self.home
            and self.below(tier) is None
            and len(blocks) > FEW_VICTIMS
            and (t.ref[blocks] > 0).all()
        ):
            self._insert_runs(tier, blocks, link)
            return
        where, insert, done = t.where[tier.index], self.insert, 0
        for b in blocks:
            if not where[b] and insert(tier, b):
                if not done:
                    self.copies.add(link, tier.block_bytes, blocking=False)
                done += 1
        if done > 1:
            self.copies.add_each(link, tier.block_bytes, done - 1, blocking=False)

    def _insert_runs(self, tier: Tier, blocks: list[int], link: str) -> None:
        """:meth:`insert_each` for blocks in use, into a tier whose victims are lost (not
        HBM, not home, nothing below it): the blocks not resident go in as one run
        (:meth:`Tier.add_evicting`), then the run's victims are demoted in order.

        NOTE: as one at a time: a victim's demotion (a drop, or nothing) reads and changes
        only the victim's own state, which no later insert of the run changes (a block in
        use is never dropped), unless the victim is a resident block of the batch (one at
        a later turn would be copied back): a run stops after such a victim, and the next
        starts after it. (With a tier below, a victim's copy there could evict a block
        whose residence here a later insert changes: one at a time.) The first victim (a
        full tier) is demoted before the first copy is queued, as its insert does.
        """
        where, now, first = self.table.where[tier.index], self.clock.now, True
        rest = np.asarray(blocks, dtype=np.int64)
        while len(rest):
            here = where[rest]
            going = np.flatnonzero(~here)
            free, stop = tier.free_slots, set(rest[here].tolist())
            done, victims = tier.add_evicting(rest[going].tolist(), now, stop)
            if done == 0:  # full, nothing evictable: no later one goes in either
                return
            last = done == len(going) and not (done > free and victims[-1] in stop)
            count = done
            if first:
                if free == 0:
                    self.demote(victims.pop(0), tier)
                self.copies.add(link, tier.block_bytes, blocking=False)
                first, count = False, done - 1
            self.demote_many(victims, tier)
            self.copies.add_each(link, tier.block_bytes, count, blocking=False)
            if last:
                return
            rest = rest[going[done - 1] + 1 :]

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
        if cut == len(ids):
            return
        if (
            tier.index == HBM
            and below is not None
            and self.below(below) is None
            and below is not self.home
        ):
            self._demote_evicting(ids[cut:], below)
            return
        for b in ids[cut:].tolist():
            self.demote(b, tier)

    def _demote_evicting(self, ids: np.ndarray, below: Tier) -> None:
        """:meth:`demote` each of ``ids`` (HBM's victims, in order) where the copies down
        evict in ``below`` and its victims are lost (nothing under it; not the home tier):
        the copies go in as a run (:meth:`Tier.add_evicting`), then the losses are dropped
        in the order one at a time drops them (a victim at its copy's turn, a block neither
        copied nor in a tier at its own).

        NOTE: a victim of ``below`` is dropped or kept at once; what each of ``ids`` does
        at its turn depends on its own state, which a copy's eviction changes only for a
        block resident in ``below``: a run stops after such a victim (the next one starts
        after it, on the state then). The mode's ``hbm_victims`` declined the whole list
        (:meth:`demote_many`), as it does each one of it.
        """
        t, now, where = self.table, self.clock.now, self.table.where
        while len(ids):
            alive = t.owner[ids] >= 0  # (dropped earlier in the batch: nothing to do)
            cached = t.ref[ids] == 0
            here = where[below.index, ids]
            going = np.flatnonzero(alive & cached & (t.hash[ids] != 0) & ~here)
            lost = alive & cached & t.in_no_tier(ids)
            free, stop = below.free_slots, set(ids[here].tolist())
            done, victims = below.add_evicting(ids[going].tolist(), now, stop)
            stopped = done > free and victims[-1] in stop
            end = int(going[done - 1]) + 1 if stopped or 0 < done < len(going) else len(ids)
            if self.prefetch.active:
                for b in ids[:end][alive[:end]].tolist():
                    self.prefetch.forget(b)
            self.copies.add_each("d2h", below.block_bytes, done, blocking=True)
            lost[going[:done]] = False  # copied: in ``below`` at its turn
            out = np.asarray(victims, dtype=np.int64)
            out_lost = (t.ref[out] == 0) & t.in_no_tier(out)
            turns = np.concatenate(
                (going[free : free + len(out)][out_lost], np.flatnonzero(lost[:end]))
            )
            gone = np.concatenate((out[out_lost], ids[:end][lost[:end]]))[np.argsort(turns)]
            if len(gone):
                self._tell_lost(t.hash[gone])
                t.drop_many(gone)
            ids = ids[end:]

    def _tell_lost(self, hashes: np.ndarray) -> None:
        """Tell ``on_lost``, if set, of lost blocks (their ``hashes``, in drop order; unhashed
        ones are not told): one call a block, as :meth:`demote` makes (the cluster's pool
        starts a transfer a call)."""
        if self.on_lost is None:
            return
        for i in np.flatnonzero(hashes).tolist():
            self.on_lost(hashes[i : i + 1])

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
        gone = t.in_no_tier(ids) & (t.ref[ids] == 0)
        if gone.any():
            lost = ids[gone]
            self._tell_lost(t.hash[lost])
            t.drop_many(lost)
