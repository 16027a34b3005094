"""HBM budget: how start-up carves HBM into weights, reserve, activations and the KV pool."""

from __future__ import annotations

from dataclasses import dataclass

from sim.config.run import RunConfig
from sim.cost.roofline import CostModel
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
    if engine.kv_pool_blocks is not None:
        most = int((hw.hbm.capacity - fixed) // config.block_bytes)
        if engine.kv_pool_blocks > most:
            raise ConfigError(
                f"{engine.kv_pool_blocks} blocks of {format_bytes(config.block_bytes)} do not fit"
                f" beside weights, reserve and activations; expected at most {most}",
                key="engine.kv_pool_blocks",
            )
        pool_blocks = engine.kv_pool_blocks
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
