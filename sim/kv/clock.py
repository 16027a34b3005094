"""The KV layer's clock: SimPy's, or the time of the step a run is planning ahead of it."""

from __future__ import annotations

import simpy


class PlanClock:
    """``now`` is the environment's time, unless a run planning ahead set ``planned_s``."""

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.planned_s: float | None = None  # a run's clock while it plans ahead of SimPy's

    @property
    def now(self) -> float:
        return self.env.now if self.planned_s is None else self.planned_s
