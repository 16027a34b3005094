"""The KV cache manager: blocks of every request across HBM, DRAM and SSD, per ``kv.mode``.

The scheduler asks it for room (``available``, ``need``, ``allocate``), prefix hits
(``match``/``take``) and releases; the engine asks it what a step must move (``plan_step``).

Modes:
- ``hbm``: running KV in an HBM pool (PagedAttention); freed prefix blocks stay cached in
  HBM until evicted; preemption by recompute or swap (to DRAM and back).
- ``offload``: as ``hbm``; prefix blocks also go down to DRAM (write-through when computed,
  or write-back when evicted) and from DRAM to SSD; a lower-tier hit is loaded, not recomputed.
- ``dram_centric``: DRAM is every block's home and bounds admission; HBM caches hot blocks
  in whatever weights, activations and staging leave; each step fetches what it reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np
import simpy

from policies.lru import LRU
from policies.registry import make_eviction
from policies.stamp_lru import StampLRU
from sim.kv.access import AccessModel
from sim.memory.blocks import DRAM, HBM, SSD, TIER_NAMES, BlockTable
from sim.config.run import RunConfig
from sim.observe.heatlog import HeatLog
from sim.memory.links import Links
from sim.kv.prefetch import Prefetcher
from sim.memory.tiers import Tier
from sim.workload.requests import Requests

PREFIX_MEMO = 64  # requests whose prefix lookups are memoised
FEW_VICTIMS = 8  # victims demoted one at a time (cheaper than arrays for so few)
FEW_BLOCKS = 8  # fewer new blocks than this are allocated one call each


def _distinct(ids: np.ndarray) -> bool:
    """Whether ``ids`` has no repeats (a quick test first: increasing ids are distinct)."""
    if bool((ids[1:] > ids[:-1]).all()):
        return True
    return len(set(ids.tolist())) == len(ids)


@dataclass(frozen=True, eq=False)
class PrefixHits:
    """A prompt's longest cached prefix: its blocks in order, and the tier each is read from."""

    blocks: np.ndarray
    tiers: np.ndarray

    def __len__(self) -> int:
        return len(self.blocks)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        """(block, tier) pairs."""
        return zip(self.blocks.tolist(), self.tiers.tolist(), strict=True)


NO_HITS = PrefixHits(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


@dataclass
class Counters:
    """Running totals for the summary (and per-step deltas for the timeline)."""

    lookup_blocks: int = 0
    hits: list[int] = field(default_factory=lambda: [0, 0, 0])
    prefix_hit_tokens: int = 0
    access_blocks: int = 0
    access_hbm_hits: int = 0
    swaps: int = 0


@dataclass(frozen=True)
class StepIO:
    """What a step moves: bytes fetched on its critical path, blocking copies, staging."""

    fetch_bytes: float
    fetch_chunk: float
    blocking: list[simpy.Event]
    staging_bytes: float
    attention_context: np.ndarray
    decompress_bytes: float


def victims_kept_below(mode: str, blocks: list[int]) -> list[bool]:
    """For each tier, whether a cached block evicted there stays in the tier below (copied
    down; in ``dram_centric`` HBM caches DRAM, where it already is), else it is lost: never in
    ``hbm`` mode (DRAM holds swaps only) nor from the last tier, nor into a tier of no blocks."""
    return [mode != "hbm" and i < SSD and blocks[i + 1] >= 1 for i in range(len(blocks))]


class KvManager:
    """Owns the block table, the tiers, prefix matching and the per-step data movement."""

    def __init__(
        self, config: RunConfig, requests: Requests, env: simpy.Environment, links: Links,
        hbm_blocks: int, rng: np.random.Generator,
    ):  # fmt: skip
        self.config, self.env, self.links = config, env, links
        self.planned_s: float | None = None  # a run's clock while it plans ahead of SimPy's
        kv = config.kv
        self.mode = kv.mode
        self.bt = config.engine.block_tokens
        self.layers = config.model.layers
        self.table = BlockTable()
        self.access = AccessModel(kv.access, rng)
        self.prefix = kv.prefix_caching and requests.prefix_hashes is not None
        self.hashes = requests.prefix_hashes
        if self.prefix and requests.output_hashes is not None:
            # blocks that fill up while generating are reusable too (the next turn's prompt)
            self.hashes = [
                np.concatenate((p, o))
                for p, o in zip(self.hashes, requests.output_hashes, strict=True)
            ]
        # blocks of each request that can ever be registered (its hashes)
        self.hashed_blocks = np.array([len(h) for h in self.hashes or ()], dtype=np.int64)
        self.prompt = requests.prompt_tokens
        dram_capacity = (
            kv.dram_capacity if kv.dram_capacity is not None else config.hardware.dram.capacity
        )
        ssd_capacity = (
            kv.ssd_capacity if kv.ssd_capacity is not None else config.hardware.ssd.capacity
        )
        capacities = (hbm_blocks * config.tier_block_bytes("hbm"), dram_capacity, ssd_capacity)
        block_bytes = [config.tier_block_bytes(name) for name in TIER_NAMES]
        blocks = [int(c // b) for c, b in zip(capacities, block_bytes, strict=True)]
        self.kept_below = victims_kept_below(self.mode, blocks)
        self.tiers = [
            self._tier(i, n, blocks[i], block_bytes[i], lost=not self.kept_below[i])
            for i, n in enumerate(TIER_NAMES)
        ]
        self.home = self.tiers[DRAM] if self.mode == "dram_centric" else self.tiers[HBM]
        self.lookup_tiers = 1 if self.mode == "hbm" else 3  # hbm mode: DRAM only holds swaps
        n = len(requests)
        self.blocks: list[list[int]] = [[] for _ in range(n)]
        self.held = np.zeros(n, dtype=np.int64)
        self.registered = np.zeros(n, dtype=np.int64)
        self.swapped: set[int] = set()
        self.swap_holds: dict[int, int] = {}  # block -> swapped-out requests holding it
        self.blocking: list[simpy.Event] = []
        self.counters = Counters()
        self.on_loaded = lambda rid: None
        self.loads_in_flight = 0
        self._prefix_memo: dict[int, tuple[int, np.ndarray]] = {}  # rid -> (index version, ids)
        self._copies: dict[tuple[str, bool], float] = {}
        self._mirrors: dict[int, list] = {}  # rid -> [its block list, length mirrored, array]
        self.arrival_s = requests.arrival_s
        self.prefetch = Prefetcher(self, kv.prefetch, requests.session)
        self.step_reads = np.zeros(0, dtype=np.int64)  # blocks the current step reads (pinned)
        engine = config.engine
        self.heat_log = HeatLog(engine.kv_heat_interval_s) if engine.kv_heat else None

    def _tier(self, index: int, name: str, capacity: int, block_bytes: float, lost: bool) -> Tier:
        """A tier of ``capacity`` blocks and its eviction policy; cost-aware policies see what
        a miss costs: the prefix chain a victim takes with it where victims are ``lost``, one
        load (the same for every block) where they stay in the tier below."""
        policy = make_eviction(
            self.config.kv.eviction_for(name),
            capacity=max(capacity, 1),
            rng=np.random.default_rng([self.config.seed, index]),
            cost=self._recompute_cost if lost else None,
        )
        if index == HBM and self.mode == "dram_centric" and type(policy) is LRU:
            # NOTE: every step reads thousands of cached blocks: same order, cheaper touches
            policy = StampLRU()
        return Tier(index, name, capacity, block_bytes, policy, self.table)

    def _recompute_cost(self, b: int) -> float:
        """What losing block ``b`` costs: the tokens from it to the end of its prefix chain
        (its owner's hashed blocks), which a prefix match can no longer reach without it (a
        match stops at the first missing block); one block's tokens for a block past the
        chain. The start of a long shared prefix is worth the most."""
        owner, position = int(self.table.owner[b]), int(self.table.position[b])
        end = int(self.hashed_blocks[owner]) if len(self.hashed_blocks) else 0
        return float(max(end - position, 1) * self.bt)

    @property
    def now(self) -> float:
        """The clock: SimPy's, or the time of the step a run is planning."""
        return self.env.now if self.planned_s is None else self.planned_s

    # --- room in the home tier ----------------------------------------------------------------

    @property
    def available(self) -> int:
        """Blocks the home tier can give (free slots plus evictable cached blocks)."""
        return self.home.available

    def need(self, rid: int, tokens: int) -> int:
        """New blocks ``rid`` needs to hold ``tokens`` tokens."""
        return max(-(-tokens // self.bt) - int(self.held[rid]), 0)

    def _make_room(self, tier: Tier, n: int, pinned: np.ndarray | None = None) -> None:
        """Evict until ``n`` blocks fit in ``tier`` (the caller checked ``available``).

        Blocks a prefetcher asks to keep (``prefetch.spare``) go last, when nothing else can.
        """
        spare = self.prefetch.spare
        if spare is not None and pinned is None and tier.index == HBM:
            self._demote_many(tier.evict(n - tier.free_slots, spare), tier)
        self._demote_many(tier.evict(n - tier.free_slots, pinned), tier)

    def allocate(self, rid: int, tokens: int) -> None:
        """Give ``rid`` blocks for ``tokens`` tokens in the home tier."""
        k = self.need(rid, tokens)
        if k == 0:
            return
        if k > self.home.free_slots:
            self._make_room(self.home, k)
        heat = self.access.initial_heat() if k == 1 else self.access.initial_heats(k)
        ids = self.table.new_many(rid, int(self.held[rid]), heat)
        self.home.add_pinned(ids)
        self.blocks[rid].extend(ids)
        self.held[rid] += k

    def grow_each(self, rids: np.ndarray, positions: np.ndarray) -> None:
        """One more block for each entry of ``rids``, in order: the same as :meth:`allocate`
        for each, when the home tier has the room and new blocks draw no heat (full access).
        ``positions``: each new block's number in its request (a request may repeat)."""
        if len(rids) < FEW_BLOCKS or self.access.sparse or len(rids) > self.home.free_slots:
            for rid in rids.tolist():  # (a few blocks: one at a time is quicker)
                self.allocate(rid, (int(self.held[rid]) + 1) * self.bt)
            return
        ids = self.table.new_each(rids, positions)
        self.home.add_pinned(ids)
        for rid, b in zip(rids.tolist(), ids, strict=True):
            self.blocks[rid].append(b)
        np.add.at(self.held, rids, 1)

    # --- leaving ------------------------------------------------------------------------------

    def release(self, rid: int) -> None:
        """``rid`` no longer needs its blocks: cache the hashed ones, drop the rest (tail first)."""
        now = self.now
        self._mirrors.pop(rid, None)
        if self.prefetch.sessions is not None:
            self.prefetch.turn_ended(rid, self.blocks[rid])
        if not self.prefix and not self.prefetch.active:
            self._release_unshared(rid)
            return
        t = self.table
        blocks = np.asarray(self.blocks[rid][::-1], dtype=np.int64)
        t.ref[blocks] -= 1
        dead = blocks[t.ref[blocks] <= 0]  # a request's blocks are distinct: tail first
        cached = (t.hash[dead] != 0) if self.prefix else np.zeros(len(dead), dtype=bool)
        # NOTE: a dead block touches only its own column and each tier's policy; runs of
        # kept (or dropped) blocks in a row keep every tier's calls in the same order
        edges = np.flatnonzero(cached[1:] != cached[:-1]) + 1 if len(dead) else []
        for start, end in pairwise([0, *edges, len(dead)] if len(dead) else []):
            if cached[start]:
                self._keep_cached(dead[start:end], now)
            else:
                self._forget_many(dead[start:end])
        if self.swap_holds:
            self._leave_hbm(blocks[t.ref[blocks] > 0])
        self.blocks[rid] = []
        self.held[rid] = 0
        self.registered[rid] = 0

    def _leave_hbm(self, blocks: np.ndarray) -> None:
        """Blocks (in use) that only swapped-out requests hold now leave HBM: they have their
        DRAM copies, and come back with them (vLLM frees a GPU block at its last reference)."""
        t, hbm, holds = self.table, self.tiers[HBM], self.swap_holds
        for b in blocks.tolist():
            if t.where[HBM, b] and t.ref[b] == holds.get(b, 0):
                hbm.remove(b)

    def _release_unshared(self, rid: int) -> None:
        """:meth:`release` without prefix caching: drop the dead blocks, tail first, at once."""
        t = self.table
        blocks = np.asarray(self.blocks[rid][::-1], dtype=np.int64)
        t.ref[blocks] -= 1
        dead = blocks[t.ref[blocks] <= 0]
        for tier in self.tiers:
            tier.remove_many(dead)
        t.drop_many(dead)
        self.blocks[rid] = []
        self.held[rid] = 0
        self.registered[rid] = 0

    def _keep_cached(self, blocks: np.ndarray, now: float) -> None:
        """Dead hashed ``blocks`` (distinct) stay cached: evictable in each tier holding them."""
        where = self.table.where
        for tier in self.tiers:
            here = blocks[where[tier.index, blocks]]
            if len(here):
                tier.make_evictable_many(here, now)

    def _forget_many(self, blocks: np.ndarray) -> None:
        """:meth:`_forget` each of ``blocks`` (distinct), in order."""
        if self.prefetch.active:
            for b in blocks.tolist():
                self.prefetch.forget(b)
        for tier in self.tiers:
            tier.remove_many(blocks)
        self.table.drop_many(blocks)

    def _forget(self, b: int) -> None:
        if self.prefetch.active:
            self.prefetch.forget(b)
        for tier in self.tiers:
            if self.table.where[tier.index, b]:
                tier.remove(b)
        self.table.drop(b)

    def _demote(self, b: int, tier: Tier) -> None:
        """After ``b`` was evicted from ``tier``: copy it down if worth keeping, else forget it."""
        t = self.table
        if t.owner[b] < 0:  # already dropped: room made below for an earlier victim took it
            return
        if tier.index == HBM and self.prefetch.active:
            self.prefetch.forget(b)
        if tier.index == HBM and self.mode == "dram_centric":
            if t.dirty[b]:
                self._copy("d2h", self.tiers[DRAM].block_bytes, blocking=True)
                t.dirty[b] = False
            return
        if tier is self.home and self.mode == "dram_centric" and t.where[HBM, b]:
            self.tiers[HBM].remove(b)  # HBM caches DRAM: a block leaving home leaves the cache
        below = self._below(tier)
        if (
            below is not None
            and self.prefix
            and t.hash[b]
            and t.ref[b] == 0  # a cached prefix block: worth keeping
            and not t.where[below.index, b]
            and self._insert(below, b)
        ):
            # an HBM slot is reused only after its copy left: that copy blocks the step
            link = "d2h" if tier.index == HBM else "ssd_write"
            self._copy(link, below.block_bytes, blocking=tier.index == HBM)
        where = t.where
        if not (where[HBM, b] or where[DRAM, b] or where[SSD, b]) and t.ref[b] == 0:
            t.drop(b)

    def _below(self, tier: Tier) -> Tier | None:
        """Where ``tier``'s eviction victims are copied (None: they are lost)."""
        return self.tiers[tier.index + 1] if self.kept_below[tier.index] else None

    def _demote_many(self, victims: list[int], tier: Tier) -> None:
        """:meth:`_demote` each of ``victims`` (just evicted from ``tier``), in order.

        NOTE: while the tier below has a free slot for each copy going down, no demotion
        evicts there, so none changes another victim's state: those victims go in bulk; from
        the first copy that would have to evict on, one at a time.
        """
        if not victims:
            return
        if tier.index == HBM and self.mode == "dram_centric":
            self._demote_cached(victims)
            return
        if len(victims) <= FEW_VICTIMS:
            for b in victims:
                self._demote(b, tier)
            return
        t = self.table
        ids = np.asarray(victims, dtype=np.int64)
        ids = ids[t.owner[ids] >= 0]
        below = self._below(tier)
        down = np.zeros(len(ids), dtype=bool)
        if self.prefix and below is not None and below.available >= 1:
            down = (t.hash[ids] != 0) & (t.ref[ids] == 0) & ~t.where[below.index, ids]
        cut = len(ids)
        going = np.flatnonzero(down)
        if below is not None and len(going) > below.free_slots:
            cut = int(going[below.free_slots])
        self._demote_bulk(ids[:cut], down[:cut], tier, below)
        for b in ids[cut:].tolist():
            self._demote(b, tier)

    def _demote_bulk(
        self, ids: np.ndarray, down: np.ndarray, tier: Tier, below: Tier | None
    ) -> None:
        """:meth:`_demote` ``ids`` in bulk: ``down`` ones get a copy below, with no eviction."""
        t = self.table
        if tier.index == HBM and self.prefetch.active:
            for b in ids.tolist():
                self.prefetch.forget(b)
        if tier is self.home and self.mode == "dram_centric":
            self.tiers[HBM].remove_many(ids)  # HBM caches DRAM: blocks leaving home leave it
        if below is not None and down.any():
            going = ids[down]
            below.add_evictable_many(going, self.now)
            # the same float sums as one copy per block
            key = ("d2h" if tier.index == HBM else "ssd_write", tier.index == HBM)
            total = self._copies.get(key, 0.0)
            for _ in range(len(going)):
                total += below.block_bytes
            self._copies[key] = total
        where = t.where
        gone = ~(where[HBM, ids] | where[DRAM, ids] | where[SSD, ids]) & (t.ref[ids] == 0)
        if gone.any():
            t.drop_many(ids[gone])

    def _demote_cached(self, victims: list[int]) -> None:
        """:meth:`_demote` each of ``victims``, evicted from the HBM cache of ``dram_centric``."""
        t = self.table
        ids = np.asarray(victims, dtype=np.int64)
        ids = ids[t.owner[ids] >= 0]
        if self.prefetch.active:
            for b in ids.tolist():
                self.prefetch.forget(b)
        dirty = ids[t.dirty[ids]]
        for _ in range(len(dirty)):  # one copy per block, as one at a time would add them
            self._copy("d2h", self.tiers[DRAM].block_bytes, blocking=True)
        t.dirty[dirty] = False

    def _insert(self, tier: Tier, b: int) -> bool:
        """Place a copy of ``b`` in a lower tier as an evictable block, if room can be made."""
        if tier.available < 1:
            return False
        self._make_room(tier, 1)
        tier.add(b, self.now, evictable=True)
        return True

    def _copy(self, link: str, nbytes: float, blocking: bool) -> None:
        """Queue a block copy; :meth:`flush_copies` sends each link's queue as one transfer."""
        key = (link, blocking)
        self._copies[key] = self._copies.get(key, 0.0) + nbytes

    def flush_copies(self) -> None:
        """Start the queued copies: one batched transfer per link and kind (block-sized pieces)."""
        for (link, blocking), nbytes in self._copies.items():
            event = getattr(self.links, link).transfer(nbytes, self.tiers[DRAM].block_bytes)
            if blocking:
                self.blocking.append(event)
        self._copies = {}

    # --- preemption -----------------------------------------------------------------------

    def preempt(self, rid: int, swap: bool) -> bool:
        """Free ``rid``'s home blocks; with ``swap`` keep its KV in DRAM. True if swapped."""
        if swap and self.mode != "dram_centric" and self._swap_out(rid):
            return True
        self.release(rid)
        return False

    def _swap_out(self, rid: int) -> bool:
        """Copy ``rid``'s blocks to DRAM and free them in HBM, if DRAM can take them.

        A block that another request still uses in HBM (a shared prefix) stays there: as
        vLLM's swap-out, the swapped request takes a DRAM copy of every block, and a GPU block
        is freed at its last reference only. Its blocks already in DRAM (written through) are
        pinned before room is made for the others, so that no eviction takes them.
        """
        dram, hbm, t = self.tiers[DRAM], self.tiers[HBM], self.table
        blocks = self.blocks[rid]
        there = t.where[DRAM, blocks]
        moving = [b for b, x in zip(blocks, there.tolist(), strict=True) if not x]
        copies = np.asarray(blocks)[there].tolist()
        if dram.available - sum(b in dram.evictable for b in copies) < len(moving):
            return False
        dram.pin_many(copies)
        self._make_room(dram, len(moving))
        now, holds = self.now, self.swap_holds
        for b in blocks:
            if t.ref[b] - 1 == holds.get(b, 0) and t.where[HBM, b]:  # nobody else in HBM
                hbm.remove(b)
            if not t.where[DRAM, b]:
                dram.add(b, now, evictable=False)
            holds[b] = holds.get(b, 0) + 1
        self.blocking.append(self.links.d2h.transfer(len(moving) * dram.block_bytes))
        self.swapped.add(rid)
        self.counters.swaps += 1
        return True

    def swap_in(self, rid: int) -> None:
        """Bring a swapped request's blocks back to HBM (the step waits for the copy). A block
        still in HBM (shared with a request there) needs no copy; a block another swapped-out
        request holds keeps its DRAM copy."""
        blocks, t, holds = self.blocks[rid], self.table, self.swap_holds
        coming = self.swap_in_blocks(rid)
        self._make_room(self.home, coming)
        now, dram = self.now, self.tiers[DRAM]
        for b in blocks:
            holds[b] -= 1
            if not holds[b]:
                del holds[b]
                dram.remove(b)
            if not t.where[HBM, b]:  # (one there is in use by another request: pinned)
                self.home.add(b, now, evictable=False)
        self.blocking.append(self.links.h2d.transfer(coming * dram.block_bytes))
        self.swapped.discard(rid)

    def swap_in_blocks(self, rid: int) -> int:
        """Blocks of swapped-out ``rid`` that :meth:`swap_in` copies (those not in HBM)."""
        return len(self.blocks[rid]) - int(
            np.count_nonzero(self.table.where[HBM, self.blocks[rid]])
        )

    # --- prefix hits ----------------------------------------------------------------------

    def match(self, rid: int) -> PrefixHits:
        """The longest cached prefix of ``rid``'s prompt (one token left over)."""
        if not self.prefix:
            return NO_HITS
        ids = np.asarray(self._indexed_prefix(rid), dtype=np.int64)
        if not len(ids):
            return NO_HITS
        where = self.table.where[: self.lookup_tiers, ids]
        present = where.any(axis=0)
        cut = len(ids) if present.all() else int(np.argmin(present))
        return PrefixHits(ids[:cut], np.argmax(where[:, :cut], axis=0))

    def _indexed_prefix(self, rid: int) -> np.ndarray:
        """Blocks registered under ``rid``'s leading prompt hashes, up to the first that is not.

        Memoised per request. While the index is unchanged the memo stands; after a change,
        its blocks up to the first that no longer holds its hash still stand (a block holds a
        hash exactly while the index maps the hash to it), and the lookups go on from there
        (if the memo holds all, from its next hash only if that one is registered now).
        """
        version, memo = self.table.index_version, self._prefix_memo.get(rid)
        if memo is not None and memo[0] == version:
            return memo[1]
        hashes = self.hashes[rid]  # (a request's hashes and prompt never change)
        limit = min(len(hashes), (int(self.prompt[rid]) - 1) // self.bt)
        if memo is not None:
            ids = memo[1]
            held = self.table.hash[ids] == hashes[: len(ids)]
            m = len(ids) if held.all() else int(held.argmin())
            if m < len(ids) or (m < limit and int(hashes[m]) in self.table.index):
                ids = np.concatenate((ids[:m], self._lookups(hashes[m:limit])))
        else:
            ids = self._lookups(hashes[:limit])
            if len(self._prefix_memo) >= PREFIX_MEMO:  # the queue head, a prefetch lookahead
                self._prefix_memo = {}
        self._prefix_memo[rid] = (version, ids)
        return ids

    def _lookups(self, hashes: np.ndarray) -> np.ndarray:
        """The blocks the index holds for ``hashes``, up to the first it does not hold."""
        ids = list(map(self.table.index.get, hashes.tolist()))
        if None in ids:
            del ids[ids.index(None) :]
        return np.array(ids, dtype=np.int64)

    def admission_cost(self, rid: int, hits: PrefixHits, tokens: int) -> int:
        """Home-tier blocks admitting ``rid`` with ``hits`` and ``tokens`` computed would take."""
        new = max(-(-tokens // self.bt) - len(hits), 0)
        if not len(hits):
            return new
        ids = hits.blocks
        taken = len(self.home.evictable.intersection(ids.tolist()))  # (a prefix's are distinct)
        elsewhere = len(ids) - int(np.count_nonzero(self.table.where[self.home.index, ids]))
        return new + taken + elsewhere

    def take(self, rid: int, hits: PrefixHits) -> bool:
        """Reference the hit blocks; start loading lower-tier ones. True if a load is pending."""
        if not self.prefix:
            return False
        c = self.counters
        c.lookup_blocks += min(len(self.hashes[rid]), (int(self.prompt[rid]) - 1) // self.bt)
        now = self.now
        loads = self._reference(hits)
        on_ssd = [b for b in loads if not self.table.where[DRAM, b]]
        sources = self._pin_sources(loads)
        self._make_room(self.home, len(loads))
        for b in loads:
            self.home.add(b, now, evictable=False)
        self.blocks[rid] = hits.blocks.tolist()
        self.held[rid] = len(hits)
        self.registered[rid] = len(hits)
        c.prefix_hit_tokens += len(hits) * self.bt
        waits: list[simpy.Event] = []
        if self.prefetch.active:
            self.prefetch.admitted(rid, float(self.arrival_s[rid]))
            in_hbm = hits.blocks[self.table.where[HBM, hits.blocks]].tolist()
            self.prefetch.used(in_hbm)
            waits = self.prefetch.waits(in_hbm)  # staged copies still on their way
        if loads or waits:
            self.loads_in_flight += 1
            self.env.process(self._load(rid, loads, on_ssd, sources, waits))
        return bool(loads or waits)

    def _reference(self, hits: PrefixHits) -> list[int]:
        """Count and reference the hit blocks, pin those at home; returns the others.

        NOTE: one at a time, each home block was pinned then touched; a touch after a pin
        does nothing (a pinned block is not evictable), so pinning them all is the same.
        """
        if not len(hits):
            return []
        c, t, home = self.counters, self.table, self.home
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
        pinned = []
        for b in blocks:
            tier = self.tiers[DRAM if self.table.where[DRAM, b] else SSD]
            if b in tier.evictable:
                tier.pin(b)
                pinned.append((tier, b))
        return pinned

    def _load(
        self,
        rid: int,
        blocks: list[int],
        on_ssd: list[int],
        sources: list[tuple[Tier, int]],
        waits: list[simpy.Event],
    ):
        """Bring lower-tier blocks home: ``on_ssd`` ones SSD -> DRAM, then (offload) all
        DRAM -> HBM; release the pinned ``sources``; wait for the prefetch copies of its
        blocks still in flight."""
        dram = self.tiers[DRAM]
        if on_ssd:
            yield self.links.ssd_read.transfer(len(on_ssd) * dram.block_bytes)
            if self.home is not dram:
                for b in on_ssd:
                    if not self.table.where[DRAM, b]:
                        self._insert(dram, b)
        if self.home.index == HBM and blocks:
            yield self.links.h2d.transfer(len(blocks) * dram.block_bytes, dram.block_bytes)
        now = self.now
        for tier, b in sources:
            if self.table.where[tier.index, b]:
                tier.make_evictable(b, now)
        if waits:
            yield simpy.AllOf(self.env, waits)
        self.loads_in_flight -= 1
        self.on_loaded(rid)

    def register(self, rid: int, computed: int) -> None:
        """Make ``rid``'s newly completed prompt blocks findable (and write them through)."""
        if not self.prefix:
            return
        hashes, start = self.hashes[rid], int(self.registered[rid])
        if start >= len(hashes):  # the usual call, once its hashed blocks are all registered
            return
        blocks = self.blocks[rid]
        full = min(computed // self.bt, len(hashes), len(blocks))
        if full <= start:
            return
        if self.mode == "offload" and self.config.kv.write_policy == "write_through":
            self._register_through(blocks, hashes, start, full)
        else:
            self.table.register_many(blocks[start:full], hashes[start:full])
        self.registered[rid] = full

    def register_full(self, ids: np.ndarray, computed: np.ndarray) -> None:
        """:meth:`register` the requests ``ids`` (with ``computed`` tokens in KV) that have a
        newly full block with a hash."""
        full = np.minimum(computed // self.bt, self.hashed_blocks[ids])
        grown = np.flatnonzero(full > self.registered[ids])
        for rid, tokens in zip(ids[grown].tolist(), computed[grown].tolist(), strict=True):
            self.register(rid, tokens)

    def _register_through(
        self, blocks: list[int], hashes: np.ndarray, start: int, end: int
    ) -> None:
        """Register ``blocks[start:end]`` one at a time, each written through to DRAM (whose
        evictions may drop a block and so free its hash for the next one)."""
        for i in range(start, end):
            b = blocks[i]
            self.table.register(b, int(hashes[i]))
            if not self.table.where[DRAM, b] and self.table.hash[b]:
                dram = self.tiers[DRAM]
                if self._insert(dram, b):
                    self._copy("d2h", dram.block_bytes, blocking=False)

    def hint_upcoming(self, waiting: list[int]) -> None:
        """Tell scheduler-aware policies which cached blocks the next waiting requests reuse."""
        tiers = [t for t in self.tiers if hasattr(t.policy, "set_upcoming")]
        if not tiers:
            return
        keys = [b for rid in waiting for b in self.match(rid).blocks.tolist()]
        for tier in tiers:
            tier.policy.set_upcoming(keys)  # type: ignore[attr-defined]

    # --- one step -------------------------------------------------------------------------

    def _read_sets(
        self, ids: np.ndarray, context: np.ndarray, new: np.ndarray
    ) -> tuple[list[np.ndarray], np.ndarray]:
        """Blocks each sequence's attention reads, and the tokens it attends (sparse shrinks it)."""
        attended = context.copy()
        reads, mirrors, lists = [], self._mirrors, self.blocks
        for rid, n in zip(ids.tolist(), (-(-context // self.bt)).tolist(), strict=True):
            mirror = mirrors.get(rid)  # the mirror is current: its view (else _block_array)
            if mirror is not None and mirror[0] is lists[rid] and mirror[1] == len(mirror[0]):
                reads.append(mirror[2][: min(n, mirror[1])])
            else:
                reads.append(self._block_array(rid, n))
        if not self.access.sparse:
            return reads, attended
        decode = np.flatnonzero((new == 1) & (context >= self.prompt[ids])).tolist()
        if decode:  # all of the step's sparse decodes in one batch, in batch order
            picked = self.access.decode_blocks_many([reads[i] for i in decode], self.table.heat)
            for i, blocks in zip(decode, picked, strict=True):
                reads[i] = blocks
            sizes = np.array([len(b) for b in picked], dtype=context.dtype) * self.bt
            attended[decode] = np.minimum(context[decode], sizes)
        return reads, attended

    def _block_array(self, rid: int, n: int) -> np.ndarray:
        """``blocks[rid][:n]`` as an int64 array: a view of a mirror that grows with the list.

        NOTE: a request's block list is only ever extended or replaced (``take``, ``release``),
        never edited in place; a replaced list gets a fresh mirror.
        """
        blocks = self.blocks[rid]
        mirror = self._mirrors.get(rid)
        if mirror is None or mirror[0] is not blocks:
            buf = np.empty(max(2 * len(blocks), 16), dtype=np.int64)
            buf[: len(blocks)] = blocks
            mirror = self._mirrors[rid] = [blocks, len(blocks), buf]
        _, filled, buf = mirror
        if filled < len(blocks):
            if len(blocks) > len(buf):
                grown = np.empty(2 * len(blocks), dtype=np.int64)
                grown[:filled] = buf[:filled]
                buf = mirror[2] = grown
            buf[filled : len(blocks)] = blocks[filled:]
            mirror[1] = len(blocks)
        return buf[: min(n, len(blocks))]

    def plan_step(
        self, ids: np.ndarray, context: np.ndarray, new: np.ndarray, room_bytes: float
    ) -> StepIO:
        """Account a step's reads; in ``dram_centric`` fit the HBM cache into ``room_bytes``."""
        t, now, c = self.table, self.now, self.counters
        self.flush_copies()
        blocking, self.blocking = self.blocking, []
        if self.mode != "dram_centric" and not self.access.sparse:
            # every block read is resident by construction: count, don't collect
            if self.heat_log is not None and self.heat_log.due(now):
                self.heat_log.record(now, self._read_sets(ids, context, new)[0], t.where)
            read = int((-(-context // self.bt)).sum())
            c.access_blocks += read
            c.access_hbm_hits += read
            return StepIO(0.0, 0.0, blocking, 0.0, context, 0.0)
        reads, attended = self._read_sets(ids, context, new)
        need, pinned = self._union(reads)
        if self.heat_log is not None and self.heat_log.due(now):
            self.heat_log.record(now, reads, t.where)
        self.step_reads = need
        t.last_access[need] = now
        t.access_count[need] += 1
        c.access_blocks += len(need)
        if self.mode != "dram_centric":
            c.access_hbm_hits += len(need)
            return StepIO(0.0, 0.0, blocking, 0.0, attended, 0.0)
        hbm, dram = self.tiers[HBM], self.tiers[DRAM]
        in_hbm = t.where[HBM, need]
        misses, present = need[~in_hbm], need[in_hbm]
        c.access_hbm_hits += len(present)
        if self.prefetch.active:
            self.prefetch.used(present)
            blocking.extend(self.prefetch.waits(present.tolist()))  # staged, still arriving
        hbm.touch_many(present, now)
        direct = self.config.kv.direct_read
        staging = 0.0 if direct else 2.0 * len(misses) * hbm.block_bytes / self.layers
        # NOTE: a fetch whose double buffer exceeds the HBM left streams through what is left
        staging = min(staging, max(room_bytes, 0.0))
        hbm.capacity = max(int((room_bytes - staging) // hbm.block_bytes), 0)
        self._shrink(hbm, pinned)
        if not direct:
            self._cache(hbm, misses, pinned)
        produced = self._produced(ids, context, new)
        self._cache(hbm, produced, pinned, dirty=self.config.kv.write_policy == "write_back")
        if self.config.kv.write_policy == "write_through":
            per_token = dram.block_bytes / self.bt
            self.links.d2h.transfer(float(new.sum()) * per_token, dram.block_bytes)
        self.flush_copies()
        blocking.extend(self.blocking)
        self.blocking = []
        fetch = len(misses) * dram.block_bytes
        decompress = len(misses) * hbm.block_bytes if dram.block_bytes != hbm.block_bytes else 0.0
        return StepIO(fetch, dram.block_bytes, blocking, staging, attended, decompress)

    def _union(self, reads: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Sorted distinct block ids of all reads, and their mark over the table's ids."""
        mark = np.zeros(self.table.size, dtype=bool)
        if reads:
            mark[np.concatenate(reads)] = True
        return np.flatnonzero(mark), mark

    def _produced(self, ids: np.ndarray, context: np.ndarray, new: np.ndarray) -> np.ndarray:
        """Blocks this step starts writing (its new tokens' blocks not yet holding KV)."""
        first, end = -(-context // self.bt), -(-(context + new) // self.bt)
        out = []
        for i in np.flatnonzero(end > first).tolist():  # most decodes start no block
            out.extend(self.blocks[ids[i]][first[i] : end[i]])
        return np.asarray(out, dtype=np.int64)

    def _shrink(self, hbm: Tier, pinned: np.ndarray) -> None:
        """Evict the HBM cache down to its capacity, unpinned blocks first."""
        over = hbm.resident - hbm.capacity
        for mask in (pinned, None):
            if over <= 0:
                return
            self._demote_many(hbm.evict(over, mask), hbm)
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
        now = self.now
        todo = blocks[~self.table.where[HBM, blocks]]
        if len(todo) > 1 and _distinct(todo):
            short = len(todo) - hbm.free_slots
            victims = hbm.evict(short, pinned)
            self._demote_cached(victims)
            fits = len(todo) - max(short - len(victims), 0)
            hbm.add_evictable_many(todo[:fits], now)
            self.table.dirty[todo[:fits]] = dirty
            blocks = todo[fits:]
        for b in blocks.tolist():
            if self.table.where[HBM, b]:
                continue
            if hbm.free_slots < 1:
                victims = hbm.evict(1, pinned)
                if not victims:
                    return
                self._demote(victims[0], hbm)
            hbm.add(b, now, evictable=True)
            self.table.dirty[b] = dirty

    # --- accounting -----------------------------------------------------------------------

    def hbm_kv_bytes(self) -> tuple[float, float]:
        """(running, cached) bytes of KV in HBM: blocks in use by a request, and the rest."""
        t, hbm = self.table, self.tiers[HBM]
        if self.home is hbm:
            cached = len(hbm.evictable)
            return (hbm.resident - cached) * hbm.block_bytes, cached * hbm.block_bytes
        n = t.size
        resident = t.where[HBM, :n]
        running = np.count_nonzero(resident & (t.ref[:n] > 0))
        return running * hbm.block_bytes, (hbm.resident - running) * hbm.block_bytes

    # --- invariants -----------------------------------------------------------------------

    def check(self) -> None:
        """Assert the block accounting: capacities, residency, reference counts, evictability."""
        t, n = self.table, self.table.size
        refs = np.zeros(t.capacity, dtype=np.int64)
        for blocks in self.blocks:
            np.add.at(refs, np.asarray(blocks, dtype=np.int64), 1)
        if not np.array_equal(refs[:n], t.ref[:n]):
            raise AssertionError("block reference counts do not match the requests holding them")
        held = np.flatnonzero(refs[:n])
        if not t.where[:, held].any(axis=0).all():
            raise AssertionError("a block in use is in no tier")
        for tier in self.tiers:
            resident = int(t.where[tier.index, :n].sum())
            if resident != tier.resident or resident > tier.capacity:
                raise AssertionError(f"{tier.name}: {resident} resident, capacity {tier.capacity}")
            if any(not t.where[tier.index, b] for b in tier.evictable):
                raise AssertionError(f"{tier.name}: an evictable block is not resident")
        if any(t.ref[b] > 0 for b in self.home.evictable):
            raise AssertionError(f"{self.home.name}: a block in use is evictable")
