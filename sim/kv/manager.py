"""The KV cache manager: blocks of every request across HBM, DRAM and SSD, per ``kv.mode``.

The scheduler asks it for room (``available``, ``need``, ``allocate``), prefix hits
(``match``/``take``) and releases; the step executor asks it what a step must move
(``plan_step``). Its jobs live in parts named for them: the mode's placement rules
(:mod:`sim.kv.modes`), the prefix index (:mod:`sim.kv.prefix`), evictions and demotions
(:mod:`sim.kv.cascade`), the copy queue (:mod:`sim.kv.copies`), swap (:mod:`sim.kv.swap`),
what a step reads (:mod:`sim.kv.reads`) and prefetch (:mod:`sim.kv.prefetch`).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise

import numpy as np
import simpy

from sim.config.run import RunConfig
from sim.kv.access import AccessModel
from sim.kv.cascade import Cascade
from sim.kv.clock import PlanClock
from sim.kv.copies import CopyQueue
from sim.kv.loads import PrefixLoads
from sim.kv.modes import MODES, StepIO
from sim.kv.parts import Counters
from sim.kv.pools import HostPool, hbm_pool
from sim.kv.prefetch import Prefetcher
from sim.kv.prefix import NO_HITS, PrefixHits, PrefixIndex
from sim.kv.reads import Holdings, ReadsObserver, read_sets, union
from sim.kv.remote import RemoteKv
from sim.kv.swap import SwapSpace
from sim.memory.blocks import DRAM, HBM, SSD, BlockTable
from sim.memory.links import Links
from sim.memory.tiers import Tier
from sim.workload.requests import Requests

FEW_BLOCKS = 8  # fewer new blocks than this are allocated one call each

__all__ = ["NO_HITS", "Counters", "KvManager", "PrefixHits", "StepIO"]


class KvManager:
    """One instance's KV: its HBM pool, and its blocks in the host's pool below."""

    def __init__(
        self, config: RunConfig, requests: Requests, clock: PlanClock, links: Links,
        table: BlockTable, host: HostPool, hbm_blocks: int, rng: np.random.Generator,
        remote: RemoteKv | None = None,
    ):  # fmt: skip
        kv = config.kv
        self.remote = remote  # the cluster's KV pool, if it has one
        self.config, self.clock, self.links, self.table = config, clock, links, table
        self.env = clock.env
        self.bt = config.engine.block_tokens
        self.layers = config.model.layers
        self.mode = MODES[kv.mode](self)
        self.access = AccessModel(kv.access, rng)
        self.index = PrefixIndex(
            table, requests, self.bt, kv.prefix_caching, self.mode.lookup_tiers
        )
        self.prefix = self.index.enabled
        self.hbm_caches = kv.hbm_prefix_caching  # finished requests' blocks stay in HBM
        keeps = host.keeps_below[HBM]
        hbm = hbm_pool(config, table, hbm_blocks, keeps, host.lost_cost)
        self.tiers = [hbm, host.dram, host.ssd]
        self.home: Tier = self.tiers[self.mode.home_index]  # running blocks live here
        self.holdings = Holdings(len(requests))
        # the parts' state under the names the scheduler reads (the same objects)
        self.blocks, self.held = self.holdings.blocks, self.holdings.held
        self.copies = CopyQueue(links, config.copy_chunk_bytes())
        self.cascade = Cascade(table, self.tiers, host.keeps_below, self.prefix, self.copies, clock)
        self.swap = SwapSpace(self)
        self.swapped = self.swap.swapped  # the requests swapped out to DRAM
        self.loads = PrefixLoads(self)
        self.counters = Counters()
        self.on_loaded: Callable[[int], None] = lambda rid: None
        self.prompt = requests.prompt_tokens
        self.arrival_s = requests.arrival_s
        self.prefetch = Prefetcher(self, kv.prefetch, requests.session)
        self.cascade.mode, self.cascade.prefetch = self.mode, self.prefetch
        self.cascade.home = self.home
        if remote is not None and kv.write_policy == "write_back":
            self.cascade.on_lost = remote.put  # blocks the instance loses go to the pool
        self.step_reads = np.zeros(0, dtype=np.int64)  # blocks the current step reads (pinned)
        self.reads_observer: ReadsObserver | None = None  # the heat log, if one is kept

    # --- views of the parts ---------------------------------------------------------------

    @property
    def now(self) -> float:
        """The clock: SimPy's, or the time of the step a run is planning."""
        return self.clock.now

    @property
    def blocking(self) -> list[simpy.Event]:
        """Copies the next step must wait for."""
        return self.copies.blocking

    # --- room in the home tier ------------------------------------------------------------

    @property
    def available(self) -> int:
        """Blocks the home tier can give (free slots plus evictable cached blocks)."""
        return self.home.available

    def need(self, rid: int, tokens: int) -> int:
        """New blocks ``rid`` needs to hold ``tokens`` tokens."""
        return max(-(-tokens // self.bt) - int(self.held[rid]), 0)

    def allocate(self, rid: int, tokens: int) -> None:
        """Give ``rid`` blocks for ``tokens`` tokens in the home tier."""
        k = self.need(rid, tokens)
        if k == 0:
            return
        home, held = self.home, self.held
        if k > home.free_slots:
            self.cascade.make_room(home, k)
        heat = self.access.initial_heat() if k == 1 else self.access.initial_heats(k)
        ids = self.table.new_many(rid, int(held[rid]), heat)
        home.add_pinned(ids)
        self.blocks[rid].extend(ids)
        held[rid] += k

    def grow_each(self, rids: np.ndarray, positions: np.ndarray) -> None:
        """One more block for each entry of ``rids``, in order: the same as :meth:`allocate`
        for each, when the home tier has the room and new blocks draw no heat (full access).
        ``positions``: each new block's number in its request (a request may repeat)."""
        home, held = self.home, self.held
        if len(rids) < FEW_BLOCKS or self.access.sparse or len(rids) > home.free_slots:
            for rid in rids.tolist():  # (a few blocks: one at a time is quicker)
                self.allocate(rid, (int(held[rid]) + 1) * self.bt)
            return
        ids = self.table.new_each(rids, positions)
        home.add_pinned(ids)
        lists = self.blocks
        for rid, b in zip(rids.tolist(), ids, strict=True):
            lists[rid].append(b)
        np.add.at(held, rids, 1)

    # --- leaving ----------------------------------------------------------------------------

    def release(self, rid: int) -> None:
        """``rid`` no longer needs its blocks: cache the hashed ones, drop the rest (tail first)."""
        now, t = self.now, self.table
        if self.prefetch.sessions is not None:
            self.prefetch.turn_ended(rid, self.blocks[rid])
        blocks = np.asarray(self.blocks[rid][::-1], dtype=np.int64)
        t.ref[blocks] -= 1
        dead = blocks[t.ref[blocks] <= 0]  # a request's blocks are distinct: tail first
        if not self.prefix and not self.prefetch.active:  # nothing is cached: drop at once
            for tier in self.tiers:
                tier.remove_many(dead)
            t.drop_many(dead)
        else:
            self._release_dead(dead, now)
            if self.swap.holds:
                self.swap.leave_hbm(blocks[t.ref[blocks] > 0])
        self.holdings.forget(rid)
        self.index.registered[rid] = 0

    def _release_dead(self, dead: np.ndarray, now: float) -> None:
        """Blocks no request holds any more: hashed ones stay cached (with
        ``kv.hbm_prefix_caching`` false, only below HBM), the rest are dropped.

        NOTE: a dead block touches only its own column and each tier's policy; runs of kept
        (or dropped) blocks in a row keep every tier's calls in the same order.
        """
        t = self.table
        cached = (t.hash[dead] != 0) if self.prefix else np.zeros(len(dead), dtype=bool)
        if not self.hbm_caches:  # kv.hbm_prefix_caching false: cached below HBM, or dropped
            cached &= t.where[DRAM, dead] | t.where[SSD, dead]
        edges = np.flatnonzero(cached[1:] != cached[:-1]) + 1 if len(dead) else []
        for start, end in pairwise([0, *edges, len(dead)] if len(dead) else []):
            run = dead[start:end]
            if cached[start]:
                if not self.hbm_caches:  # they leave HBM at once
                    self.tiers[HBM].remove_many(run)
                for tier in self.tiers:  # evictable in each tier holding them
                    here = run[t.where[tier.index, run]]
                    if len(here):
                        tier.make_evictable_many(here, now)
                continue
            self._drop(run)

    def _drop(self, run: np.ndarray) -> None:
        """Blocks no one holds or can find: out of every tier and the table."""
        if self.prefetch.active:
            for b in run.tolist():
                self.prefetch.forget(b)
        for tier in self.tiers:
            tier.remove_many(run)
        self.table.drop_many(run)

    def finish(self, rid: int) -> None:
        """``rid`` is done: :meth:`release` its blocks, and drop at once those under hashes
        of its own (:meth:`PrefixIndex.give_own`), which no one else can find."""
        own = self.index.finished(rid)
        if len(own):
            self.table.forget(own)
        self.release(rid)
        if len(own):  # those it no longer held, cached: held by no one, dropped by no one yet
            orphans = own[self.table.ref[own] <= 0]
            self._drop(orphans[self.table.owner[orphans] >= 0])

    def preempt(self, rid: int, swap: bool, tokens: int | None = None, computed: int = 0) -> bool:
        """Free ``rid``'s home blocks; with ``swap`` keep its KV in DRAM. True if swapped.
        By recompute (``tokens``: prompt and output so far; ``computed``: those in its KV),
        its full blocks get hashes of their own if they have none (vLLM hashes every full
        block) and stay cached, tail first, and its next lookup covers all ``tokens``."""
        if swap and self.mode.can_swap and self.swap.swap_out(rid):
            return True
        if tokens is not None and self.prefix:
            self.index.give_own(rid)
            self.register(rid, computed)
        self.release(rid)
        if tokens is not None:
            self.index.preempted(rid, tokens)
        return False

    def swap_in(self, rid: int) -> None:
        """Bring swapped-out ``rid``'s blocks back home (:meth:`SwapSpace.swap_in`)."""
        self.swap.swap_in(rid)

    def swap_in_blocks(self, rid: int) -> int:
        """Blocks :meth:`swap_in` copies for ``rid`` (those not in HBM)."""
        return self.swap.blocks_in(rid)

    # --- prefix hits ------------------------------------------------------------------------

    def match(self, rid: int) -> PrefixHits:
        """The longest cached prefix of ``rid``'s prompt (one token left over): in this
        instance's tiers, then in the cluster's KV pool."""
        hits = self.index.match(rid)
        if self.remote is None or not self.prefix:
            return hits
        own, limit = len(hits.blocks), self.index.lookup_blocks(rid)
        more = self.remote.leading(self.index.hashes[rid][own:limit])
        return PrefixHits(hits.blocks, hits.tiers, more) if more else hits

    def prefix_tiers(self, hashes: np.ndarray) -> np.ndarray:
        """The tier (0 HBM, 1 DRAM, 2 SSD, 3 the pool) of each leading block of ``hashes``
        this instance can read, up to the first it cannot (what a router sees)."""
        ids = list(map(self.table.index.get, hashes.tolist()))
        if None in ids:
            del ids[ids.index(None) :]
        where = self.table.where[: self.mode.lookup_tiers, np.asarray(ids, dtype=np.int64)]
        present = where.any(axis=0)
        cut = len(ids) if present.all() else int(np.argmin(present))
        tiers = np.argmax(where[:, :cut], axis=0).astype(np.int8)
        if self.remote is None:
            return tiers
        more = self.remote.leading(hashes[cut:])
        return np.concatenate((tiers, np.full(more, 3, dtype=np.int8)))

    def admission_cost(self, rid: int, hits: PrefixHits, tokens: int) -> int:
        """Home-tier blocks admitting ``rid`` with ``hits`` and ``tokens`` computed would take."""
        new = max(-(-tokens // self.bt) - len(hits), 0) + hits.remote
        if not len(hits.blocks):
            return new
        ids, home = hits.blocks, self.home
        taken = int(np.count_nonzero(home.evictable.members(ids)))
        elsewhere = len(ids) - int(np.count_nonzero(self.table.where[home.index, ids]))
        return new + taken + elsewhere

    def take(self, rid: int, hits: PrefixHits) -> bool:
        """Reference the hit blocks; start loading lower-tier ones. True if the request waits
        aside for a load (:meth:`PrefixLoads.take`)."""
        return self.prefix and self.loads.take(rid, hits)

    def register(self, rid: int, computed: int) -> None:
        """Make ``rid``'s newly completed prompt blocks findable (the mode may copy them)."""
        if not self.prefix:
            return
        blocks = self.blocks[rid]
        span = self.index.newly_full(rid, len(blocks), computed)
        if span is not None:
            hashes = self.index.hashes[rid]
            self.mode.register(blocks, hashes, *span)
            self.index.registered[rid] = span[1]
            if self.remote is not None and self.config.kv.write_policy == "write_through":
                self.remote.put(hashes[span[0] : span[1]])

    def register_full(self, ids: np.ndarray, computed: np.ndarray) -> None:
        """:meth:`register` the requests ``ids`` (with ``computed`` tokens in KV) that have a
        newly full block with a hash."""
        grown = self.index.growing(ids, computed)
        for rid, tokens in zip(ids[grown].tolist(), computed[grown].tolist(), strict=True):
            self.register(rid, tokens)

    def hint_upcoming(self, waiting: list[int]) -> None:
        """Tell scheduler-aware policies which cached blocks the next waiting requests reuse."""
        tiers = [t for t in self.tiers if hasattr(t.policy, "set_upcoming")]
        if not tiers:
            return
        keys = [b for rid in waiting for b in self.match(rid).blocks.tolist()]
        for tier in tiers:
            tier.policy.set_upcoming(keys)  # type: ignore[attr-defined]

    # --- one step ---------------------------------------------------------------------------

    def plan_step(
        self, ids: np.ndarray, context: np.ndarray, new: np.ndarray, room_bytes: float
    ) -> StepIO:
        """Account a step's reads and place them as the mode does, in ``room_bytes`` of HBM
        left for KV (weights, reserve and activations are in)."""
        t, now, c, observer = self.table, self.now, self.counters, self.reads_observer
        self.copies.flush()
        blocking = self.copies.take_blocking()
        if self.mode.reads_counted():  # every block read is resident: count, don't collect
            if observer is not None and observer.due(now):
                observer.record(now, self._read_sets(ids, context, new)[0], t.where)
            read = int((-(-context // self.bt)).sum())
            c.access_blocks += read
            c.access_hbm_hits += read
            return StepIO(0.0, 0.0, blocking, 0.0, context, 0.0)
        reads, attended = self._read_sets(ids, context, new)
        need, pinned = union(reads, t.size)
        if observer is not None and observer.due(now):
            observer.record(now, reads, t.where)
        self.step_reads = need
        c.access_blocks += len(need)
        return self.mode.place_reads(
            need, pinned, (ids, context, new), room_bytes, blocking, attended
        )

    def _read_sets(
        self, ids: np.ndarray, context: np.ndarray, new: np.ndarray
    ) -> tuple[list[np.ndarray], np.ndarray]:
        return read_sets(
            self.holdings, self.access, self.table, self.prompt, self.bt, ids, context, new
        )

    def flush_copies(self) -> None:
        """Start the queued copies (write-through of the blocks a step completed)."""
        self.copies.flush()

    def hbm_kv_bytes(self) -> tuple[float, float]:
        """(running, cached) bytes of KV in HBM: blocks in use by a request, and the rest."""
        return self.mode.kv_bytes()
