"""The price of a step: the roofline (:mod:`sim.cost.roofline`), measured operator tables
(:mod:`sim.cost.tables`, read by :mod:`sim.cost.optables`) and the factory that picks one."""

from sim.cost.factory import cost_model_for
from sim.cost.roofline import CostModel, CostParams, StepCost

__all__ = ["CostModel", "CostParams", "StepCost", "cost_model_for"]
