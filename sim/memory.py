"""HBM budget (what the KV pool gets) and the block pool (numpy free stack, per-block state)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.config.run import RunConfig
from sim.costmodel import CostModel
from sim.errors import ConfigError
from sim.units import format_bytes


@dataclass(frozen=True)
class HbmPlan:
    """How HBM is carved at start-up, as vLLM does it (all bytes).

    ``kv_pool = gpu_memory_utilization x capacity - weights - runtime_reserve -
    activation_peak``, rounded down to whole blocks.
    """

    capacity: float
    usable: float
    weights: float
    runtime_reserve: float
    activation_peak: float
    block_bytes: float
    pool_blocks: int

    @property
    def kv_pool(self) -> float:
        """Bytes of the KV pool."""
        return self.pool_blocks * self.block_bytes


def plan_hbm(config: RunConfig, cost: CostModel) -> HbmPlan:
    """Size the KV pool; a model that does not fit is a ConfigError."""
    hw, engine = config.hardware, config.engine
    usable = engine.gpu_memory_utilization * hw.hbm.capacity
    peak_seqs = min(engine.max_num_seqs, engine.max_batched_tokens)
    activation_peak = cost.activation_bytes(engine.max_batched_tokens, peak_seqs)
    fixed = config.model.weight_bytes + hw.hbm.runtime_reserve + activation_peak
    pool_blocks = int((usable - fixed) // config.block_bytes)
    if pool_blocks < 1:
        weights = format_bytes(config.model.weight_bytes)
        raise ConfigError(
            f"model {config.model.name!r} does not fit: weights {weights}"
            f" + runtime reserve {format_bytes(hw.hbm.runtime_reserve)}"
            f" + activations {format_bytes(activation_peak)} (at max_batched_tokens"
            f" {engine.max_batched_tokens}) leave no room for one KV block in"
            f" {engine.gpu_memory_utilization:g} x {format_bytes(hw.hbm.capacity)} of HBM on"
            f" {hw.name!r}; expected a larger HBM, a smaller model or fewer batched tokens",
            key="model",
        )
    return HbmPlan(
        capacity=hw.hbm.capacity,
        usable=usable,
        weights=config.model.weight_bytes,
        runtime_reserve=hw.hbm.runtime_reserve,
        activation_peak=activation_peak,
        block_bytes=config.block_bytes,
        pool_blocks=pool_blocks,
    )


class BlockPool:
    """A fixed pool of KV blocks: a free stack and per-block reference counts.

    Invariant: ``num_free + ref_count.astype(bool).sum() == num_blocks``; a block is free
    exactly when its reference count is 0.
    """

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.ref_count = np.zeros(num_blocks, dtype=np.int32)
        # the stack pops from the end; reversed so that block 0 is handed out first
        self._free = np.arange(num_blocks - 1, -1, -1, dtype=np.int64)
        self._top = num_blocks

    @property
    def num_free(self) -> int:
        """Blocks not held by any request."""
        return self._top

    @property
    def num_used(self) -> int:
        """Blocks held by requests."""
        return self.num_blocks - self._top

    def allocate(self, n: int) -> np.ndarray:
        """Take ``n`` free blocks; the caller checked ``num_free``."""
        if n > self._top:
            raise RuntimeError(f"allocate({n}) with only {self._top} blocks free")
        ids = self._free[self._top - n : self._top][::-1].copy()
        self._top -= n
        self.ref_count[ids] += 1
        return ids

    def free(self, ids: np.ndarray) -> None:
        """Release blocks (their reference count drops; at zero they return to the stack)."""
        ids = np.asarray(ids, dtype=np.int64)
        self.ref_count[ids] -= 1
        released = ids[self.ref_count[ids] == 0][::-1]
        self._free[self._top : self._top + len(released)] = released
        self._top += len(released)
