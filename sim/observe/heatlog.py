"""KV heat log: per recorded step, which blocks attention read, how often, and from which tier.

Opt-in (``engine.kv_heat: true``), because it holds one row per block read per step;
``engine.kv_heat_interval_s`` records a step only when that much simulated time has passed
since the last recorded one. The rows become ``kv_heat.parquet`` (``time_s, block, accesses,
tier``), the file ``kvsim plot RUN --kind heatmap`` draws.
"""

from __future__ import annotations

import numpy as np

from sim.memory.blocks import TIER_NAMES

HEAT_COLUMNS = ("time_s", "block", "accesses", "tier")


class HeatLog:
    """Collects (time, block, accesses, tier) rows as numpy chunks."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self._next = 0.0
        self._chunks: list[tuple[float, np.ndarray, np.ndarray, np.ndarray]] = []

    def due(self, now: float) -> bool:
        """Whether the step starting at ``now`` is recorded."""
        return now >= self._next if self.interval_s > 0 else True

    def record(self, now: float, reads: np.ndarray, where: np.ndarray) -> None:
        """One step's reads (every sequence's, in one array); ``where`` is the tier residency."""
        blocks, counts = np.unique(reads, return_counts=True)
        if len(blocks) == 0:  # a step that reads no KV (a first prefill) is not a sample
            return
        self._next = now + self.interval_s
        tier = np.argmax(where[:, blocks], axis=0)  # the fastest tier holding it: read there
        self._chunks.append((now, blocks, counts, tier))

    def columns(self) -> dict[str, np.ndarray]:
        """The rows as ``kv_heat.parquet`` stores them (columns by name)."""
        if not self._chunks:
            return {
                "time_s": np.zeros(0),
                "block": np.zeros(0, np.int64),
                "accesses": np.zeros(0, np.int64),
                "tier": np.zeros(0, object),
            }
        sizes = [len(c[1]) for c in self._chunks]
        names = np.asarray(TIER_NAMES, dtype=object)
        return {
            "time_s": np.repeat([c[0] for c in self._chunks], sizes),
            "block": np.concatenate([c[1] for c in self._chunks]).astype(np.int64),
            "accesses": np.concatenate([c[2] for c in self._chunks]).astype(np.int64),
            "tier": names[np.concatenate([c[3] for c in self._chunks])],
        }
