"""The prefetch mechanism: asks the prefetch policy what to stage and moves it up to HBM.

Once per step (the engine's prefetch hook, after the step's blocks are placed) the policy sees
the waiting queue's lower-tier prefix blocks, the next decode step's top-k candidates and their
heat; the proposed blocks not yet in HBM are given HBM slots (free ones, or evictable blocks
that no running request pins and that the lookahead itself does not need) and copied up as one
H2D transfer (SSD-only blocks go SSD->DRAM first), sharing the links fairly with demand
fetches. A staged block is resident and evictable at once; whoever reads it before its copy
lands waits for that copy (``inflight``). Counts: ``prefetch_blocks`` staged,
``prefetch_hits`` later read from HBM, ``prefetch_wasted`` never read before leaving HBM.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice
from typing import Protocol

import numpy as np
import simpy

from policies.base import PrefetchPolicy, PrefetchView
from policies.registry import make_prefetch
from sim.kv.parts import KvParts
from sim.memory.blocks import DRAM, HBM


class Queue(Protocol):
    """What the prefetcher reads of a scheduler: the queue, and each request's progress."""

    waiting: Iterable[int]
    generated: np.ndarray
    output: np.ndarray


class Batch(Protocol):
    """What the prefetcher reads of a step's batch."""

    ids: np.ndarray
    new_tokens: np.ndarray
    context: np.ndarray
    samples: np.ndarray


class Prefetcher:
    """Engine side of a prefetch policy; inert (``active`` False) for ``prefetch: none``."""

    def __init__(self, kv: KvParts, spec: str | dict, sessions: np.ndarray | None):
        self.kv = kv
        self.policy: PrefetchPolicy = make_prefetch(spec)
        self.active = spec != "none"
        self.sessions = sessions if self.policy.wants_sessions else None
        self.inflight: dict[int, simpy.Event] = {}
        self.spare: np.ndarray | None = None  # blocks eviction spares while it can (next_turn)
        self._mark = np.zeros(0, dtype=bool)  # staged and not yet read
        self._open: set[int] = set()  # sessions between turns
        self.blocks = self.hits = 0
        self.bytes = 0.0
        self._rows: list[tuple[float, int, int]] = []
        self._step_hits = 0
        self._keep: list[int] = []

    # --- what the manager tells it ------------------------------------------------------

    def used(self, blocks: np.ndarray | list[int]) -> None:
        """``blocks`` were read from HBM (or taken by a request): staged ones count as hits."""
        if not self.active or not len(self._mark):
            return
        ids = np.asarray(blocks, dtype=np.int64)
        ids = ids[ids < len(self._mark)]
        hit = ids[self._mark[ids]]
        self._mark[hit] = False
        self.hits += len(hit)
        self._step_hits += len(hit)

    def forget(self, b: int) -> None:
        """``b`` left HBM (evicted or dropped): a staged copy of it was not used."""
        if b < len(self._mark):
            self._mark[b] = False
        self.inflight.pop(b, None)

    def waits(self, blocks: list[int]) -> list[simpy.Event]:
        """Copies still in flight for any of ``blocks`` (a reader must wait for them)."""
        if not self.inflight:
            return []
        found = {self.inflight[b] for b in blocks if b in self.inflight}
        return list(found)

    def turn_ended(self, rid: int, blocks: list[int]) -> None:
        """A request finished: tell a session-aware policy its cached blocks."""
        if self.sessions is None or self.sessions[rid] < 0:
            return
        session = int(self.sessions[rid])
        t = self.kv.table
        keys = np.asarray([b for b in blocks if t.hash[b]], dtype=np.int64)
        self._open.add(session)
        self.policy.on_turn_end(session, keys, self.kv.env.now)

    def admitted(self, rid: int, arrival_s: float) -> None:
        """A request was admitted: if its session was between turns, that turn has started."""
        if self.sessions is None:
            return
        session = int(self.sessions[rid])
        if session in self._open:
            self._open.discard(session)
            self.policy.on_turn_start(session, arrival_s)

    # --- the hook -----------------------------------------------------------------------

    def on_step(self, scheduler: Queue, batch: Batch) -> None:
        """Ask the policy what to stage before the next step, and start those copies."""
        if not self.active:
            return
        kv, now = self.kv, self.kv.env.now
        waiting, self._keep = self._waiting(scheduler)
        cands, ks = self._batch(scheduler, batch) if self.policy.wants_batch else ([], [])
        heat = kv.table.heat if self.policy.wants_batch else None
        view = PrefetchView(now=now, waiting=waiting, batch=cands, topk=ks, heat=heat)
        if self.sessions is not None:
            self._set_spare(self.policy.protected(now))
        proposed = self.policy.propose(view)
        staged = self._stage(proposed, view) if proposed else 0
        self._rows.append((staged * kv.tiers[DRAM].block_bytes, staged, self._step_hits))
        self._step_hits = 0

    def _waiting(self, scheduler: Queue) -> tuple[list[np.ndarray], list[int]]:
        """Per waiting request (first ``lookahead``), its matched prefix blocks not in HBM;
        and those already in HBM (staging must not evict them)."""
        kv = self.kv
        out: list[np.ndarray] = []
        keep: list[int] = []
        where = kv.table.where[HBM]
        for rid in islice(scheduler.waiting, self.policy.lookahead):
            if rid in kv.swapped or kv.held[rid]:
                continue
            hits = kv.match(rid).blocks
            here = where[hits]
            out.append(hits[~here])
            keep.extend(hits[here].tolist())
        return out, keep

    def _batch(self, scheduler: Queue, batch: Batch) -> tuple[list[np.ndarray], list[int]]:
        """Per sequence decoding next step: its top-k candidate blocks and k."""
        kv = self.kv
        if not kv.access.sparse:
            return [], []
        spec = kv.access.spec
        length = batch.context + batch.new_tokens + 1
        going = batch.samples & (scheduler.generated[batch.ids] + 1 < scheduler.output[batch.ids])
        cands, ks = [], []
        for rid, n_tokens in zip(batch.ids[going].tolist(), length[going].tolist(), strict=True):
            blocks = np.asarray(kv.blocks[rid][: -(-n_tokens // kv.bt)], dtype=np.int64)
            n = len(blocks)
            sink = min(spec.sink_blocks, n)  # type: ignore[union-attr]
            middle = blocks[sink : max(sink, n - spec.window_blocks)]  # type: ignore[union-attr]
            cands.append(middle)
            ks.append(min(kv.access.topk(n), len(middle)))
        return cands, ks

    def _set_spare(self, keys: np.ndarray) -> None:
        if len(keys) == 0:
            self.spare = None
            return
        mask = np.zeros(self.kv.table.capacity, dtype=bool)
        mask[keys[keys < len(mask)]] = True
        self.spare = mask

    # --- moving blocks up ---------------------------------------------------------------

    def _wanted(self, proposed: list[tuple[int, float]]) -> list[int]:
        """Proposed keys that are live, not in HBM and not in flight, best first, in budget."""
        t, kv = self.kv.table, self.kv
        order = sorted(range(len(proposed)), key=lambda i: -proposed[i][1])  # stable
        limit = self.policy.max_bytes_per_step
        most = int(limit // kv.tiers[DRAM].block_bytes) if limit > 0 else len(proposed)
        cached_only = kv.mode.hbm_is_cache  # HBM only ever caches copies
        out: list[int] = []
        seen: set[int] = set()
        for i in order:
            b = proposed[i][0]
            if len(out) >= most:
                break
            if b in seen or not 0 <= b < t.size or t.where[HBM, b] or not t.where[1:, b].any():
                continue
            if t.ref[b] and not cached_only:  # a swapped-out request's block: not ours to move
                continue
            seen.add(b)
            out.append(b)
        return out

    def _stage(self, proposed: list[tuple[int, float]], view: PrefetchView) -> int:
        """Give HBM slots to the wanted blocks and start their copies; returns how many."""
        kv, t = self.kv, self.kv.table
        hbm = kv.tiers[HBM]
        wanted = self._wanted(proposed)
        if not wanted:
            return 0
        pinned = np.zeros(t.capacity, dtype=bool)
        pinned[kv.step_reads] = True  # this step's reads stay (dram_centric)
        pinned[wanted] = True
        pinned[self._keep] = True  # the lookahead's own HBM-resident prefix stays too
        if self.spare is not None:  # nor may staging push out blocks kept for other sessions
            pinned[: len(self.spare)] |= self.spare
        short = len(wanted) - hbm.free_slots
        if short > 0:
            for b in hbm.evict(short, pinned):
                kv.cascade.demote(b, hbm)
        wanted = wanted[: hbm.free_slots]
        self._send(wanted)
        return len(wanted)

    def _send(self, blocks: list[int]) -> None:
        """Blocks become HBM residents now; one copy (per source) brings their bytes."""
        kv, t, now = self.kv, self.kv.table, self.kv.env.now
        if len(self._mark) < t.capacity:
            grow = np.zeros(t.capacity - len(self._mark), dtype=bool)
            self._mark = np.concatenate((self._mark, grow))
        for b in blocks:
            kv.tiers[HBM].add(b, now, evictable=True)
            self._mark[b] = True
        block_bytes = kv.tiers[DRAM].block_bytes
        from_dram = [b for b in blocks if t.where[DRAM, b]]
        from_ssd = [b for b in blocks if not t.where[DRAM, b]]
        if from_dram:
            event = kv.links.h2d.transfer(len(from_dram) * block_bytes, kv.copies.piece_bytes)
            self._track(from_dram, event)
        if from_ssd:
            self._track(from_ssd, kv.env.process(self._via_dram(from_ssd)))
        self.blocks += len(blocks)
        self.bytes += len(blocks) * block_bytes

    def _via_dram(self, blocks: list[int]):
        kv = self.kv
        block_bytes = kv.tiers[DRAM].block_bytes
        yield kv.links.ssd_read.transfer(len(blocks) * block_bytes)
        for b in blocks:
            if not kv.table.where[DRAM, b] and kv.table.where[2, b]:
                kv.cascade.insert(kv.tiers[DRAM], b)
        yield kv.links.h2d.transfer(len(blocks) * block_bytes, kv.copies.piece_bytes)

    def _track(self, blocks: list[int], event: simpy.Event) -> None:
        for b in blocks:
            self.inflight[b] = event

        def landed(_: simpy.Event) -> None:
            for b in blocks:
                if self.inflight.get(b) is event:
                    del self.inflight[b]

        event.callbacks.append(landed)

    # --- outputs ------------------------------------------------------------------------

    def summary(self) -> dict:
        """Run totals (empty for ``prefetch: none``, so its summary is unchanged)."""
        if not self.active:
            return {}
        return {
            "prefetch_blocks": self.blocks,
            "prefetch_bytes": self.bytes,
            "prefetch_hits": self.hits,
            "prefetch_wasted": self.blocks - self.hits,
        }

    def extend_timeline(self, timeline: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The timeline's columns (by name) and per-step ``prefetch_bytes``,
        ``prefetch_blocks``, ``prefetch_hits`` after them."""
        if not self.active:
            return timeline
        rows = np.array(self._rows, dtype=np.float64).reshape(-1, 3)
        steps = len(timeline["time_s"])
        if len(rows) != steps:
            raise RuntimeError(f"prefetch: {len(rows)} step rows for {steps} steps")
        return {
            **timeline,
            "prefetch_bytes": rows[:, 0],
            "prefetch_blocks": rows[:, 1].astype(np.int64),
            "prefetch_hits": rows[:, 2].astype(np.int64),
        }
