"""The mini-engine's prefix cache: ``hbm`` and ``offload`` as ``sim/kv/manager.py`` runs them.

A block is a logical id with a device slot, a host slot, or both. Blocks hold KV of a
request's tokens; a completed prompt block is registered under its prefix hash (first
writer wins) and, when its last user leaves, stays cached instead of being freed:

- ``hbm``: cached blocks stay in the device pool, evictable least recently used first; an
  evicted one is gone.
- ``offload``: as ``hbm``, and a registered block is also written through to the host pool
  (a real device -> host copy); an evicted one keeps its host copy (or is copied down if
  it has none), and the host pool evicts its oldest copies when full. A prefix hit on a
  block found only in the host pool is loaded back (a real host -> device copy): the
  request waits for the load and then goes first in line, as in the simulator; the host
  copies it reads cannot be evicted until the load is done, then count as most recent.

Every rule mirrors ``sim.kv.manager.KvManager`` with the ``lru`` policy (the only one this
supports): which blocks are hits, which are evicted, which bytes move. Numbers must not
change when KV moves: the copies are whole blocks, all layers.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import count

import numpy as np
import torch

from sim.config.model import ModelSpec
from sim.kv.prefix import own_hashes
from validation.kvpools import KvPools

HBM, DRAM = 0, 1  # tiers, numbered as sim.memory.blocks numbers them


class PrefixPools(KvPools):
    """Device and host pools with a prefix cache over both (``hbm`` or ``offload``)."""

    def __init__(
        self, model: ModelSpec, block_tokens: int, pools: tuple[int, int], mode: str,
        prefix: tuple[list[np.ndarray], list[int], list[int]], device: str = "cpu",
    ):  # fmt: skip
        """``pools``: (device, host) blocks; ``prefix``: (hashes, prompt tokens, output
        tokens) per request."""
        device_blocks, host_blocks = pools
        super().__init__(model, block_tokens, device_blocks, host_blocks, mode, device)
        self.hashes, self.prompt, output = prefix
        self.lookup = list(self.prompt)  # tokens a lookup covers (all it had, once preempted)
        self.blocks_ever = [
            -(-(p + o) // block_tokens) for p, o in zip(self.prompt, output, strict=True)
        ]
        self.own_from: dict[int, int] = {}  # request -> its first hash of its own
        self.host_capacity = host_blocks if mode == "offload" else 0
        self.free_host = list(range(self.host_capacity - 1, -1, -1))
        self.slot: dict[int, int] = {}  # block -> device slot
        self.host_slot: dict[int, int] = {}  # block -> host slot
        self.ref: dict[int, int] = {}
        self.hash_of: dict[int, int] = {}
        self.index: dict[int, int] = {}  # prefix hash -> block
        self.hbm_lru: OrderedDict[int, None] = OrderedDict()  # cached blocks in the device pool
        self.dram_lru: OrderedDict[int, None] = OrderedDict()  # host copies, oldest first
        self.registered: dict[int, int] = {}
        self.loading: dict[int, list[int]] = {}  # request -> blocks whose host copy it reads
        self._ids = count()

    # --- room in the device pool --------------------------------------------------------------

    @property
    def available(self) -> int:
        """Free device slots plus cached (evictable) blocks."""
        return len(self.free_slots) + len(self.hbm_lru)

    def allocate(self, rid: int, tokens: int) -> None:
        """Grow ``rid``'s table to hold ``tokens`` tokens, evicting cached blocks if needed."""
        k = self.need(rid, tokens)
        if k == 0:
            return
        self._make_room(k)
        table = self.tables.setdefault(rid, [])
        for _ in range(k):
            b = next(self._ids)
            self.ref[b] = 1
            self.slot[b] = self.free_slots.pop()
            table.append(b)

    def _make_room(self, n: int) -> None:
        """Evict least recently used cached blocks until ``n`` device slots are free.

        As the simulator does, all victims leave the device pool first, then each is copied
        down if worth keeping: a victim whose host copy made room for an earlier one is gone.
        """
        victims = [self.hbm_lru.popitem(last=False)[0] for _ in range(n - len(self.free_slots))]
        slots = [self.slot.pop(b) for b in victims]
        for b, slot in zip(victims, slots, strict=True):
            keep = self.mode == "offload" and b in self.hash_of and self.ref.get(b) == 0
            if keep and b not in self.host_slot and self._insert_host(b):
                self._move([slot], [self.host_slot[b]], to_host=True)  # written back
            if b not in self.host_slot:
                self._drop(b)
        self.free_slots.extend(slots)

    def _insert_host(self, b: int) -> bool:
        """Give ``b`` a host slot (evicting the oldest host copy if full); False if none."""
        if self.host_capacity < 1:
            return False
        if not self.free_host:
            victim, _ = self.dram_lru.popitem(last=False)
            self.free_host.append(self.host_slot.pop(victim))
            if victim not in self.slot and self.ref[victim] == 0:
                self._drop(victim)
        self.host_slot[b] = self.free_host.pop()
        self.dram_lru[b] = None
        return True

    def _drop(self, b: int) -> None:
        """``b`` is in neither pool and unused: unregister its hash and forget it."""
        h = self.hash_of.pop(b, None)
        if h is not None and self.index.get(h) == b:
            del self.index[h]
        self.ref.pop(b, None)  # may be gone already: its host copy was evicted

    # --- leaving ------------------------------------------------------------------------------

    def release(self, rid: int) -> None:
        """``rid`` leaves: registered blocks stay cached, the others are freed (tail first)."""
        for b in reversed(self.tables.pop(rid, [])):
            self.ref[b] -= 1
            if self.ref[b] > 0:
                continue
            if b in self.hash_of:
                if b in self.slot and b not in self.hbm_lru:
                    self.hbm_lru[b] = None
                continue
            self.free_slots.append(self.slot.pop(b))
            if b in self.host_slot:
                del self.dram_lru[b]
                self.free_host.append(self.host_slot.pop(b))
            self._drop(b)
        self.registered[rid] = 0

    def preempt(self, rid: int, tokens: int, computed: int) -> None:
        """``rid`` is preempted by recompute holding ``tokens`` (``computed`` in its KV): its
        blocks past the workload's hashes get hashes of their own (``own_hashes``, as the
        simulator's), its full blocks are registered and stay cached, and its next lookup
        covers all ``tokens``."""
        hashes = self.hashes[rid]
        if rid not in self.own_from:
            self.own_from[rid] = len(hashes)
            extra = own_hashes(rid, len(hashes), self.blocks_ever[rid])
            self.hashes[rid] = np.concatenate((hashes, extra))
        self.register(rid, computed)
        self.release(rid)
        self.lookup[rid] = tokens

    def finish(self, rid: int) -> None:
        """``rid`` is done: its blocks under hashes of its own, which no one else can find,
        are freed (the others :meth:`release` as ever)."""
        start = self.own_from.pop(rid, None)
        if start is None:
            self.release(rid)
            return
        own = [self.index[h] for h in self.hashes[rid][start:].tolist() if h in self.index]
        for b in own:
            del self.index[self.hash_of.pop(b)]
        self.release(rid)
        for b in own:  # cached and held by no one: out of both pools
            if b in self.ref and self.ref[b] == 0:
                if b in self.slot:
                    self.hbm_lru.pop(b, None)
                    self.free_slots.append(self.slot.pop(b))
                if b in self.host_slot:
                    self.dram_lru.pop(b, None)
                    self.free_host.append(self.host_slot.pop(b))
                self._drop(b)

    # --- prefix hits --------------------------------------------------------------------------

    def match(self, rid: int) -> list[tuple[int, int]]:
        """(block, tier) of the longest cached prefix of ``rid``'s prompt (one token left over)."""
        hashes = self.hashes[rid]
        limit = min(len(hashes), (self.lookup[rid] - 1) // self.block_tokens)
        hits = []
        for h in hashes[:limit].tolist():
            b = self.index.get(h)
            if b is not None and b in self.slot:
                hits.append((b, HBM))
            elif b is not None and b in self.host_slot:
                hits.append((b, DRAM))
            else:
                break
        return hits

    def admission_cost(self, rid: int, hits: list[tuple[int, int]], tokens: int) -> int:
        """Device blocks admitting ``rid`` takes: new ones, cached hits, and hits to load."""
        new = max(-(-tokens // self.block_tokens) - len(hits), 0)
        return new + sum(1 for b, _ in hits if b in self.hbm_lru or b not in self.slot)

    def take(self, rid: int, hits: list[tuple[int, int]]) -> int:
        """Reference the hit blocks, load those only in the host pool; returns blocks loaded."""
        loads = []
        for b, _ in hits:
            self.ref[b] += 1
            if b in self.slot:
                self.hbm_lru.pop(b, None)  # in use: not evictable
            else:
                loads.append(b)
                self.dram_lru.pop(b)  # the copy being read: not evictable until loaded
        if loads:
            self.loading[rid] = loads
        # read the host copies first: making room below may evict them from the host pool
        staged = self._stage([self.host_slot[b] for b in loads]) if loads else None
        self._make_room(len(loads))
        for b in loads:
            self.slot[b] = self.free_slots.pop()
        if staged is not None:
            self._unstage(staged, [self.slot[b] for b in loads])
        self.tables[rid] = [b for b, _ in hits]
        self.registered[rid] = len(hits)
        return len(loads)

    def loaded(self, rid: int) -> None:
        """``rid``'s load is done: the host copies it read are evictable again, most recent."""
        for b in self.loading.pop(rid, []):
            if b in self.host_slot:
                self.dram_lru[b] = None

    def register(self, rid: int, computed: int) -> None:
        """Make ``rid``'s completed blocks findable; ``offload`` writes them through."""
        hashes, table = self.hashes[rid], self.tables[rid]
        full = min(computed // self.block_tokens, len(hashes), len(table))
        for i in range(self.registered.get(rid, 0), full):
            b, h = table[i], int(hashes[i])
            if h != 0 and h not in self.index:  # 0: no hash (sim.memory.blocks.NO_HASH)
                self.index[h] = b
                self.hash_of[b] = h
            through = self.mode == "offload" and b in self.hash_of and b not in self.host_slot
            if through and self._insert_host(b):
                self._move([self.slot[b]], [self.host_slot[b]], to_host=True)
        self.registered[rid] = max(self.registered.get(rid, 0), full)

    # --- a step -------------------------------------------------------------------------------

    def device_tables(self, ids: list[int], context: list[int]) -> list[list[int]]:
        """Device slots of the step's sequences (every block is in the device pool)."""
        return [[self.slot[b] for b in self.tables[rid]] for rid in ids]

    # --- copies -------------------------------------------------------------------------------

    def _move(self, src: list[int], dst: list[int], to_host: bool) -> None:
        """Whole blocks (all layers) from device slots to host slots, or back."""
        assert self.host is not None
        s, d = torch.tensor(src), torch.tensor(dst)
        if to_host:
            self._copy(self.host, d, self.device, s)
            self.d2h_bytes += len(src) * self.block_bytes
        else:
            self._copy(self.device, d, self.host, s)
            self.h2d_bytes += len(src) * self.block_bytes

    def _stage(self, host_slots: list[int]) -> torch.Tensor:
        """Load host blocks into a device staging buffer (the host -> device copy)."""
        assert self.host is not None
        staged: list[torch.Tensor] = []

        def copy() -> None:
            staged.append(self.host[:, :, host_slots].to(self.device.device, non_blocking=True))

        self._on_side_stream(copy)
        self.h2d_bytes += len(host_slots) * self.block_bytes
        return staged[0]

    def _unstage(self, staged: torch.Tensor, slots: list[int]) -> None:
        """Put staged blocks into their device slots (a copy within the device)."""
        self.device[:, :, torch.tensor(slots, device=self.device.device)] = staged
