"""The tiers KV lives in: an instance's HBM pool and the host's DRAM/SSD pool, each a
:class:`Tier` of whole blocks with its eviction policy (``kv.eviction``, per tier)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from policies.lru import LRU
from policies.registry import make_eviction
from policies.stamp_lru import StampLRU
from sim.config.run import RunConfig
from sim.kv.modes import MODES
from sim.memory.blocks import DRAM, HBM, SSD, TIER_NAMES, BlockTable
from sim.memory.tiers import Tier


def tier_blocks(config: RunConfig, hbm_blocks: int) -> list[int]:
    """Each tier's capacity in blocks (HBM: the pool; DRAM and SSD: ``kv.*_capacity`` or the
    hardware's)."""
    dram, ssd = (config.tier_capacity(tier)[1] for tier in ("dram", "ssd"))
    capacities = (hbm_blocks * config.tier_block_bytes("hbm"), dram, ssd)
    return [
        int(c // config.tier_block_bytes(name))
        for c, name in zip(capacities, TIER_NAMES, strict=True)
    ]


def make_tier(
    config: RunConfig, index: int, capacity: int, table: BlockTable,
    lost_cost: Callable[[int], float] | None,
) -> Tier:  # fmt: skip
    """A tier of ``capacity`` blocks and its eviction policy (plain LRU kept as numpy stamps:
    the same order, bulk inserts and touches); cost-aware policies see what a miss costs:
    ``lost_cost`` where victims are lost, one load (the same for every block) where they stay
    in the tier below (``lost_cost`` None)."""
    name = TIER_NAMES[index]
    policy = make_eviction(
        config.kv.eviction_for(name),
        capacity=max(capacity, 1),
        rng=np.random.default_rng([config.seed, index]),
        cost=lost_cost,
    )
    if type(policy) is LRU:
        policy = StampLRU()
    return Tier(index, name, capacity, config.tier_block_bytes(name), policy, table)  # type: ignore[arg-type]


@dataclass(frozen=True)
class HostPool:
    """The host's lower tiers, shared by the instances on it; ``keeps_below``: for each tier
    (HBM, DRAM, SSD) whether its cached victims are copied to the next."""

    dram: Tier
    ssd: Tier
    keeps_below: list[bool]
    lost_cost: Callable[[int], float]  # what losing a block costs (cost-aware policies)


def host_pool(config: RunConfig, table: BlockTable, lost_cost: Callable[[int], float]) -> HostPool:
    """The DRAM and SSD tiers of ``config``'s host for KV of its ``kv.mode``."""
    mode = MODES[config.kv.mode]
    blocks = tier_blocks(config, 0)  # (whether a tier keeps victims depends on those below)
    keeps = mode.keeps_below(blocks)
    dram, ssd = (
        make_tier(config, i, blocks[i], table, None if keeps[i] else lost_cost) for i in (DRAM, SSD)
    )
    return HostPool(dram, ssd, keeps, lost_cost)


def hbm_pool(
    config: RunConfig, table: BlockTable, hbm_blocks: int, keeps_below: bool,
    lost_cost: Callable[[int], float],
) -> Tier:  # fmt: skip
    """An instance's HBM tier of ``hbm_blocks`` blocks."""
    cost = None if keeps_below else lost_cost
    return make_tier(config, HBM, hbm_blocks, table, cost)
