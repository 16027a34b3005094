"""``hbm``: PagedAttention. Running KV in the HBM pool; freed prefix blocks stay cached
there until evicted, and are then lost (DRAM holds swapped-out requests only)."""

from __future__ import annotations

from sim.kv.modes.base import Mode


class HbmMode(Mode):
    name = "hbm"
    lookup_tiers = 1  # DRAM holds swaps only
    runs_ahead = True  # with full access and no prefetch, a step moves nothing between tiers

    @staticmethod
    def keeps_below(blocks: list[int]) -> list[bool]:
        return [False] * len(blocks)
