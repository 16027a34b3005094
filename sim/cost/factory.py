"""A run's cost model: the roofline, or interpolation in measured operator tables."""

from __future__ import annotations

from sim.config.run import RunConfig
from sim.cost.roofline import CostModel, CostParams
from sim.cost.tables import TableCostModel, operator_table
from sim.errors import ConfigError


def cost_model_for(config: RunConfig) -> CostModel:
    """The run's cost model. ``hardware.cost_model: table`` gives a
    :class:`sim.cost.tables.TableCostModel`; a table that cannot price the model (unread,
    another dtype, an operator missing) is a ConfigError on ``hardware.cost_table``, raised
    before anything runs (``kvsim run``, and each sweep point when the sweep is read)."""
    params = CostParams.from_hardware(config.hardware)
    if config.hardware.cost_model == "table":
        try:
            table = operator_table(config.model, config.hardware)
        except ValueError as error:
            raise ConfigError(str(error), key="hardware.cost_table") from None
        return TableCostModel(config.model, params, table, config.kv_dtype_bytes)
    return CostModel(config.model, params, config.kv_dtype_bytes)
