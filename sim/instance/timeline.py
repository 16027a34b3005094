"""The timeline: one row per engine step, and the one function that makes a row's memory,
tier and link columns (the per-step path and the run-ahead path both call it)."""

from __future__ import annotations

from operator import itemgetter
from typing import TYPE_CHECKING

import numpy as np

from sim.memory.blocks import DRAM, HBM, SSD
from sim.memory.hbm_plan import HbmPlan
from sim.memory.links import Links

if TYPE_CHECKING:
    import pandas as pd

TIMELINE_COLUMNS = (
    "time_s",
    "step_s",
    "batch_size",
    "step_tokens",
    "prefill_tokens",
    "decode_tokens",
    "sampled",
    "linear_s",
    "attention_s",
    "overhead_s",
    "stall_s",
    "running",
    "waiting",
    "preempted",
    "hbm_weights_bytes",
    "hbm_reserve_bytes",
    "hbm_activation_bytes",
    "hbm_kv_running_bytes",
    "hbm_kv_cached_bytes",
    "hbm_staging_bytes",
    "hbm_kv_bytes",
    "hbm_kv_pool_bytes",
    "hbm_free_bytes",
    "dram_kv_bytes",
    "ssd_kv_bytes",
    "h2d_bytes",
    "d2h_bytes",
    "ssd_read_bytes",
    "ssd_write_bytes",
    "h2d_util",
    "d2h_util",
    "hbm_hit_blocks",
    "dram_hit_blocks",
    "ssd_hit_blocks",
    "access_hbm_hits",
)
# written only when an instance spans several GPUs (engine.tensor_parallel_size > 1), so a
# one-GPU timeline keeps exactly its columns
TP_COLUMNS = ("comm_s",)
FLOAT_COLUMNS = frozenset(
    (
        "time_s", "step_s", "linear_s", "attention_s", "overhead_s", "stall_s", "h2d_util",
        "d2h_util", "comm_s",
    )
)  # fmt: skip


class Timeline:
    """Collects one row per engine step into float64 chunks (a DataFrame at the end).

    A row costs 8 bytes per column, not a tuple of Python floats: a long run's timeline
    stays small (bounded memory for million-request runs).
    """

    CHUNK_ROWS = 4096

    def __init__(self, columns: tuple[str, ...] = TIMELINE_COLUMNS) -> None:
        self.columns = columns  # TIMELINE_COLUMNS, then TP_COLUMNS under tensor parallelism
        self._chunks: list[np.ndarray] = []
        self._fill = self.CHUNK_ROWS
        self._row = itemgetter(*columns)

    def record(self, **row: float) -> None:
        """Append one step; keys are at least :attr:`columns` (others are not kept)."""
        if self._fill == self.CHUNK_ROWS:
            self._chunks.append(np.empty((self.CHUNK_ROWS, len(self.columns))))
            self._fill = 0
        self._chunks[-1][self._fill] = self._row(row)
        self._fill += 1

    def record_many(self, rows: int, **columns: float | np.ndarray) -> None:
        """Append ``rows`` steps at once; a column is one value per row, or one for all."""
        block = np.empty((len(self.columns), rows))
        for i, value in enumerate(self._row(columns)):
            block[i] = value
        block = block.T
        done = 0
        while done < rows:
            if self._fill == self.CHUNK_ROWS:
                self._chunks.append(np.empty((self.CHUNK_ROWS, len(self.columns))))
                self._fill = 0
            take = min(rows - done, self.CHUNK_ROWS - self._fill)
            self._chunks[-1][self._fill : self._fill + take] = block[done : done + take]
            self._fill += take
            done += take

    def __len__(self) -> int:
        return (len(self._chunks) - 1) * self.CHUNK_ROWS + self._fill if self._chunks else 0

    def arrays(self) -> dict[str, np.ndarray]:
        """The timeline as columns by name (integer columns as int64, the rest float64)."""
        if self._chunks:
            data = np.concatenate(self._chunks)[: len(self)]
        else:
            data = np.zeros((0, len(self.columns)))
        return {
            name: data[:, i].copy() if name in FLOAT_COLUMNS else data[:, i].astype(np.int64)
            for i, name in enumerate(self.columns)
        }

    def to_frame(self) -> pd.DataFrame:
        """The timeline as a DataFrame (integer columns stay integers)."""
        import pandas as pd  # (a run itself needs none: ``arrays``)

        return pd.DataFrame(self.arrays())


class LinkMarks:
    """Link bytes, busy time and hit counters as of the last timeline row: each row's
    columns are the deltas since (:meth:`deltas`)."""

    def __init__(self, links: Links, counters: object):
        self.links, self.counters = links, counters
        self._marks = [0.0] * 10

    def deltas(self) -> tuple[float, ...]:
        """(h2d, d2h, SSD read, SSD write bytes, h2d and d2h busy seconds, HBM, DRAM, SSD
        prefix hits, HBM access hits) since the last call."""
        links, c = self.links, self.counters
        h2d, d2h = links.h2d, links.d2h
        hbm, dram, ssd = c.hits  # type: ignore[attr-defined]
        now = [
            h2d.bytes_delivered, d2h.bytes_delivered,
            links.ssd_read.bytes_delivered, links.ssd_write.bytes_delivered,
            h2d.busy_s, d2h.busy_s, float(hbm), float(dram), float(ssd),
            float(c.access_hbm_hits),  # type: ignore[attr-defined]
        ]  # fmt: skip
        m = self._marks
        self._marks = now
        return tuple([now[i] - m[i] for i in range(10)])


def memory_columns(
    plan: HbmPlan,
    tiers: list,
    step_s: float | np.ndarray,
    activations: float | np.ndarray,
    kv_running: float | np.ndarray,
    kv_cached: float | np.ndarray,
    staging: float,
    moved: tuple,
) -> dict[str, float | np.ndarray]:
    """A step's HBM, tier and link columns of the timeline (or a run's steps', as arrays);
    ``moved``: what :meth:`LinkMarks.deltas` gives. HBM columns are one GPU's: KV bytes
    (counted whole by the KV manager) scaled by the plan's ``kv_share``."""
    hbm = tiers[HBM]
    h2d, d2h, ssd_r, ssd_w, h2d_busy, d2h_busy, *hits, access_hits = moved
    share = plan.kv_share
    kv_running, kv_cached, staging = kv_running * share, kv_cached * share, staging * share
    used = plan.weights + plan.runtime_reserve + activations + kv_running + kv_cached + staging
    duration = np.maximum(step_s, 1e-12)
    return {
        "hbm_weights_bytes": plan.weights,
        "hbm_reserve_bytes": plan.runtime_reserve,
        "hbm_activation_bytes": activations,
        "hbm_kv_running_bytes": kv_running,
        "hbm_kv_cached_bytes": kv_cached,
        "hbm_staging_bytes": staging,
        "hbm_kv_bytes": kv_running + kv_cached,
        "hbm_kv_pool_bytes": hbm.capacity * hbm.block_bytes * share,
        "hbm_free_bytes": plan.capacity - used,
        "dram_kv_bytes": tiers[DRAM].used_bytes,
        "ssd_kv_bytes": tiers[SSD].used_bytes,
        "h2d_bytes": h2d,
        "d2h_bytes": d2h,
        "ssd_read_bytes": ssd_r,
        "ssd_write_bytes": ssd_w,
        "h2d_util": np.minimum(h2d_busy / duration, 1.0),
        "d2h_util": np.minimum(d2h_busy / duration, 1.0),
        "hbm_hit_blocks": hits[HBM],
        "dram_hit_blocks": hits[DRAM],
        "ssd_hit_blocks": hits[SSD],
        "access_hbm_hits": access_hits,
    }


def step_row(**columns: float | np.ndarray) -> dict[str, float | np.ndarray]:
    """A timeline row (or a run's rows, as arrays) from a step's parts: all of
    :data:`TIMELINE_COLUMNS` but ``decode_tokens``, which is its tokens less its prefill."""
    columns["decode_tokens"] = columns["step_tokens"] - columns["prefill_tokens"]
    return columns
