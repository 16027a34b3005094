"""One class per ``kv.mode``: where a block's home is, what a step must fetch, what an
eviction from HBM means. The manager (:class:`sim.kv.manager.KvManager`) holds one."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from sim.kv.parts import KvParts
from sim.memory.blocks import HBM, SSD
from sim.memory.tiers import Tier


@dataclass(frozen=True)
class StepIO:
    """What a step moves: bytes fetched on its critical path, blocking copies, staging."""

    fetch_bytes: float
    fetch_chunk: float
    blocking: list[simpy.Event]
    staging_bytes: float
    attention_context: np.ndarray
    decompress_bytes: float


class Mode:
    """The placement rules of a KV mode. Defaults: HBM is every running block's home."""

    name = ""
    home_index = HBM
    lookup_tiers = 3  # tiers a prefix hit may come from (HBM, DRAM, SSD)
    hbm_is_cache = False  # HBM holds copies of blocks whose home is below
    can_swap = True
    runs_ahead = False  # steps need no clock: nothing moves between tiers (sim.instance.runs)

    def __init__(self, kv: KvParts):
        self.kv = kv

    @property
    def home(self) -> Tier:
        """The tier a running request's blocks live in (admission is bounded by it)."""
        return self.kv.home

    @staticmethod
    def keeps_below(blocks: list[int]) -> list[bool]:
        """For each tier, whether a cached block evicted there stays in the tier below
        (copied down), else it is lost: never from the last tier, nor into a tier of no
        blocks. ``blocks``: each tier's capacity in blocks."""
        return [i < SSD and blocks[i + 1] >= 1 for i in range(len(blocks))]

    def hbm_victims(self, victims: list[int]) -> bool:
        """Handle blocks just evicted from HBM; False: the cascade demotes them."""
        return False

    def left_home(self, blocks: np.ndarray) -> None:
        """``blocks`` left the home tier (evicted there)."""

    def register(self, blocks: list[int], hashes: np.ndarray, start: int, end: int) -> None:
        """Make ``blocks[start:end]`` findable under their hashes."""
        self.kv.table.register_many(blocks[start:end], hashes[start:end])

    def reads_counted(self) -> bool:
        """Whether a step's reads need only counting (all resident, nothing to fetch)."""
        return not self.kv.access.sparse

    def place_reads(
        self, need: np.ndarray, pinned: np.ndarray, batch: tuple[np.ndarray, ...],
        room_bytes: float, blocking: list[simpy.Event], attended: np.ndarray,
    ) -> StepIO:  # fmt: skip
        """A step reads ``need`` (all resident here: every block read is at home)."""
        self.kv.counters.access_hbm_hits += len(need)
        return StepIO(0.0, 0.0, blocking, 0.0, attended, 0.0)

    def kv_bytes(self) -> tuple[float, float]:
        """(running, cached) bytes of KV in HBM: blocks in use by a request, and the rest."""
        hbm = self.kv.tiers[HBM]
        cached = len(hbm.evictable)
        return (hbm.resident - cached) * hbm.block_bytes, cached * hbm.block_bytes
