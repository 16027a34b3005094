"""A run's cost model: the roofline, or interpolation in measured operator tables."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from sim.config.run import RunConfig
from sim.cost.roofline import CostModel, CostParams
from sim.cost.tables import TableCostModel, operator_table
from sim.errors import ConfigError

if TYPE_CHECKING:
    from sim.cost.collectives import Collectives


def cost_model_for(config: RunConfig) -> CostModel:
    """The run's cost model, for one GPU's shard under tensor parallelism (with its
    collectives). ``hardware.cost_model: table`` gives a
    :class:`sim.cost.tables.TableCostModel`; a table that cannot price the model (unread,
    another dtype, an operator missing) is a ConfigError on ``hardware.cost_table``, raised
    before anything runs (``kvsim run``, and each sweep point when the sweep is read)."""
    from sim.config.parallel import shard_model  # tensor parallelism, loaded when used

    params = CostParams.from_hardware(config.hardware)
    engine = config.engine
    params = replace(
        params,
        sampler_bytes_per_logit=engine.sampler_bytes_per_logit,
        async_scheduling=engine.async_scheduling,
    )
    n = config.tensor_parallel_size
    model, comm = shard_model(config.model, n), collectives_for(config)
    if config.hardware.cost_model == "table":
        try:
            table = operator_table(model, config.hardware, n)
        except ValueError as error:
            raise ConfigError(str(error), key="hardware.cost_table") from None
        return TableCostModel(model, params, table, config.kv_dtype_bytes, comm)
    return CostModel(model, params, config.kv_dtype_bytes, comm)


def collectives_for(config: RunConfig) -> Collectives | None:
    """The run's tensor-parallel collectives (None on one GPU)."""
    n, link = config.tensor_parallel_size, config.hardware.interconnect
    if n == 1 or link is None:
        return None
    from sim.cost.collectives import CollectiveParams, Collectives

    return Collectives(config.model, CollectiveParams.from_interconnect(link), n)
