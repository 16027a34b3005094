"""Taking a cached prefix: reference its blocks, and bring those in lower tiers home."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import simpy

from sim.kv.parts import KvParts
from sim.kv.prefix import PrefixHits
from sim.memory.blocks import DRAM, HBM, SSD
from sim.memory.tiers import Tier

Fill = Callable[[int], simpy.Event]
"""A handoff's source: ``fill(blocks)`` sends a request's KV into ``blocks`` new blocks;
the event fires when it landed."""


class PrefixLoads:
    """Prefix hits taken by admitted requests, and the loads of their lower-tier blocks
    (``in_flight``; ``kv.on_loaded(rid)`` when one lands)."""

    def __init__(self, kv: KvParts):
        self.kv = kv
        self.in_flight = 0
        self.admitted = np.zeros(len(kv.held), dtype=bool)  # took a prefix once
        # the farthest tier a request's first prefix hit read from (-1: none; 3: the pool)
        self.farthest = np.full(len(kv.held), -1, dtype=np.int8)

    def take(self, rid: int, hits: PrefixHits, fill: Fill | None = None) -> bool:
        """Reference the hit blocks; start loading lower-tier ones. True if the request waits
        aside for a load (``kv.prefix_loads: in_step``: the next step waits for it instead).

        ``fill``: the ``hits.remote`` blocks are a handoff's (a disaggregated request's KV,
        sent by its prefill instance: :meth:`_receive`), not the pool's."""
        kv = self.kv
        c, t, home = kv.counters, kv.table, kv.home
        if fill is None:
            self._count(rid, hits)
        elif kv.prefix:
            self._count(rid, PrefixHits(hits.blocks, hits.tiers))
        now = kv.now
        loads = self._reference(hits)
        on_ssd = [b for b in loads if not t.where[DRAM, b]]
        sources = self._pin_sources(loads)
        kv.cascade.make_room(home, len(loads))
        for b in loads:
            home.add(b, now, evictable=False)
        kv.blocks[rid] = hits.blocks.tolist()
        waits: list[simpy.Event] = []
        kv.index.registered[rid] = len(hits)
        if fill is not None:
            waits.append(self._receive(rid, hits, fill))
        elif hits.remote:
            waits.append(self._fetch_remote(rid, hits))
        kv.held[rid] = len(hits)
        c.prefix_hit_tokens += (len(hits) if fill is None else len(hits.blocks)) * kv.bt
        if kv.prefetch.active:
            kv.prefetch.admitted(rid, float(kv.arrival_s[rid]))
            in_hbm = hits.blocks[t.where[HBM, hits.blocks]].tolist()
            kv.prefetch.used(in_hbm)
            waits += kv.prefetch.waits(in_hbm)  # staged copies still on their way
        if not (loads or waits):
            return False
        self.in_flight += 1
        in_step = fill is None and kv.config.kv.prefix_loads == "in_step"
        load = kv.env.process(self._load(rid, loads, on_ssd, sources, waits, not in_step))
        if in_step:  # the step that schedules it waits for it (kv.prefix_loads)
            kv.copies.wait_for(load)
        return not in_step

    def _count(self, rid: int, hits: PrefixHits) -> None:
        """Count the lookup, and its hits as reuse or re-hits (:meth:`_reference` counts
        them per tier for every admission). A request's first admission counts
        as cross-request reuse (``reuse_*``): it holds no block of its own yet, so every block
        it finds another request wrote (a previous turn of its conversation included). Its
        later admissions (after a recompute preemption, or after giving back the blocks it
        loaded) count their hits as re-hits: blocks it wrote before it was preempted, or
        shared blocks it finds again; their lookups are not reuse lookups."""
        c = self.kv.counters
        lookups = self.kv.index.lookup_blocks(rid)
        c.lookup_blocks += lookups
        if self.admitted[rid]:
            c.rehit_blocks += len(hits)
            return
        self.admitted[rid] = True
        c.reuse_lookup_blocks += lookups
        c.reuse_pool_hits += hits.remote
        if len(hits.blocks):
            for i, n in enumerate(np.bincount(hits.tiers, minlength=len(c.hits)).tolist()):
                c.reuse_hits[i] += n
        if len(hits):
            self.farthest[rid] = 3 if hits.remote else int(hits.tiers.max())

    def _fetch_remote(self, rid: int, hits: PrefixHits) -> simpy.Event:
        """Blocks of ``rid`` for the ``hits.remote`` hashes the pool holds after its own hits:
        new blocks at home, findable under their hashes, filled over the NIC (the event)."""
        kv, own, k = self.kv, len(hits.blocks), hits.remote
        assert kv.remote is not None
        hashes = kv.index.hashes[rid][own : own + k]
        kv.cascade.make_room(kv.home, k)
        heat = kv.access.initial_heat() if k == 1 else kv.access.initial_heats(k)
        ids = kv.table.new_many(rid, own, heat)
        kv.home.add_pinned(ids)
        kv.table.register_many(ids, hashes)
        kv.blocks[rid].extend(ids)
        kv.counters.pool_hits += k
        return kv.remote.fetch(hashes)

    def _receive(self, rid: int, hits: PrefixHits, fill: Fill) -> simpy.Event:
        """New blocks at home for the ``hits.remote`` blocks after ``rid``'s own hits, filled
        by a handoff (``fill(blocks)``: the event fires when they landed); its full blocks
        are findable under their hashes, as the blocks it computed would be."""
        kv, own, k = self.kv, len(hits.blocks), hits.remote
        if not k:
            return fill(0)
        kv.cascade.make_room(kv.home, k)
        heat = kv.access.initial_heat() if k == 1 else kv.access.initial_heats(k)
        ids = kv.table.new_many(rid, own, heat)
        kv.home.add_pinned(ids)
        if kv.prefix:
            full = max(min(kv.index.lookup_blocks(rid), own + k) - own, 0)
            if full:
                kv.table.register_many(ids[:full], kv.index.hashes[rid][own : own + full])
            kv.index.registered[rid] = own + full
        kv.blocks[rid].extend(ids)
        return fill(k)

    def _reference(self, hits: PrefixHits) -> list[int]:
        """Count and reference the hit blocks, pin those at home; returns the others.

        NOTE: one at a time, each home block was pinned then touched; a touch after a pin
        does nothing (a pinned block is not evictable), so pinning them all is the same.
        """
        if not len(hits):
            return []
        kv = self.kv
        c, t, home = kv.counters, kv.table, kv.home
        for i, n in enumerate(np.bincount(hits.tiers, minlength=len(c.hits)).tolist()):
            c.hits[i] += n
        at = hits.blocks
        np.add.at(t.ref, at, 1)
        at_home = (hits.tiers == home.index) | t.where[home.index, at]
        home.pin_many(at[at_home].tolist())
        return at[~at_home].tolist()

    def _pin_sources(self, blocks: list[int]) -> list[tuple[Tier, int]]:
        """Pin the lower-tier copy each load reads (DRAM, else SSD), so that making room
        cannot evict it before the copy is done; returns what it pinned."""
        kv, pinned = self.kv, []
        for b in blocks:
            tier = kv.tiers[DRAM if kv.table.where[DRAM, b] else SSD]
            if b in tier.evictable:
                tier.pin(b)
                pinned.append((tier, b))
        return pinned

    def _load(
        self, rid: int, blocks: list[int], on_ssd: list[int], sources: list[tuple[Tier, int]],
        waits: list[simpy.Event], requeue: bool = True,
    ):  # fmt: skip
        """Bring lower-tier blocks home after the load's fixed cost (``link.load_overhead``):
        ``on_ssd`` ones SSD -> DRAM, then (offload) all DRAM -> HBM, in chunks of the copy
        layout; release the pinned ``sources``; wait for the prefetch copies of its blocks
        still in flight; then (``requeue``) hand the request back to the scheduler."""
        kv = self.kv
        dram, home = kv.tiers[DRAM], kv.home
        overhead = kv.config.hardware.link.load_overhead
        if blocks and overhead > 0:  # the connector's lookup, submission and completion event
            yield kv.env.timeout(overhead)
        if on_ssd:
            yield kv.links.ssd_read.transfer(len(on_ssd) * dram.block_bytes)
            if home is not dram:
                for b in on_ssd:
                    if not kv.table.where[DRAM, b]:
                        kv.cascade.insert(dram, b)
        if home.index == HBM and blocks:
            yield kv.links.h2d.transfer(len(blocks) * dram.block_bytes, kv.copies.piece_bytes)
        now = kv.now
        for tier, b in sources:
            if kv.table.where[tier.index, b]:
                tier.make_evictable(b, now)
        if waits:
            yield simpy.AllOf(kv.env, waits)
        self.in_flight -= 1
        if requeue:
            kv.on_loaded(rid)
