"""The KV manager's parts as the others see them (:class:`KvParts`, which
:class:`sim.kv.manager.KvManager` satisfies), and its running counters."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import simpy

from sim.config.run import RunConfig
from sim.kv.access import AccessModel
from sim.kv.cascade import Cascade
from sim.kv.copies import CopyQueue
from sim.kv.hooks import ModeRules, PrefetchHooks
from sim.kv.prefix import PrefixHits, PrefixIndex
from sim.kv.reads import Holdings
from sim.kv.remote import RemoteKv
from sim.memory.blocks import BlockTable
from sim.memory.links import Links
from sim.memory.tiers import Tier


@dataclass
class Counters:
    """Running totals for the summary (and per-step deltas for the timeline).

    ``lookup_blocks`` and ``hits`` (per tier) count every admission's prefix lookup;
    ``reuse_lookup_blocks`` and ``reuse_hits`` a request's first admission only (blocks other
    requests wrote); ``rehit_blocks`` the hits of its later admissions (after a recompute
    preemption): ``sum(hits) == sum(reuse_hits) + rehit_blocks`` (``hits`` and ``reuse_hits``
    taken with ``pool_hits`` and ``reuse_pool_hits``, the blocks fetched from the cluster's
    KV pool).
    """

    lookup_blocks: int = 0
    hits: list[int] = field(default_factory=lambda: [0, 0, 0])
    prefix_hit_tokens: int = 0
    reuse_lookup_blocks: int = 0
    reuse_hits: list[int] = field(default_factory=lambda: [0, 0, 0])
    rehit_blocks: int = 0
    pool_hits: int = 0
    reuse_pool_hits: int = 0
    access_blocks: int = 0
    access_hbm_hits: int = 0
    swaps: int = 0


class KvParts(Protocol):
    """One instance's KV state and parts, as the modes, swap, loads and prefetch use them."""

    config: RunConfig
    env: simpy.Environment
    links: Links
    table: BlockTable
    tiers: list[Tier]
    home: Tier
    blocks: list[list[int]]
    held: np.ndarray
    bt: int
    layers: int
    access: AccessModel
    counters: Counters
    holdings: Holdings
    index: PrefixIndex
    copies: CopyQueue
    cascade: Cascade
    mode: ModeRules
    prefetch: PrefetchHooks
    step_reads: np.ndarray
    arrival_s: np.ndarray
    on_loaded: Callable[[int], None]
    remote: RemoteKv | None

    @property
    def now(self) -> float: ...

    swapped: set[int]

    def match(self, rid: int) -> PrefixHits: ...
