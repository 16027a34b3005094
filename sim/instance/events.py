"""What an instance tells the world and what it asks of it, as protocols: its observers
(metrics, invariants) subscribe to steps; the cluster's arrival feed hands it requests; the
run-ahead path (:mod:`sim.instance.runs`) sees the instance through :class:`StepHost`."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import simpy

from sim.config.run import RunConfig
from sim.cost.roofline import CostModel
from sim.instance.scheduler import Scheduler
from sim.instance.timeline import LinkMarks, Timeline
from sim.kv.clock import PlanClock
from sim.kv.manager import KvManager


class StepObserver(Protocol):
    """Sees each step's timeline row once the step is applied (``sim.observe``)."""

    def step_ended(self, row: dict[str, float]) -> None: ...

    def steps_ended(self, rows: dict[str, float | np.ndarray], steps: int) -> None:
        """A run of ``steps`` steps ended (:mod:`sim.instance.runs`); ``rows``: their
        timeline rows as columns (a column of one value for all is a scalar)."""
        ...


class Arrivals(Protocol):
    """The arrival feed as an instance's run-ahead path sees it (``sim.cluster.feed``)."""

    @property
    def next_arrival_s(self) -> float:
        """When the next request not yet handed over is delivered (inf: none is left)."""
        ...

    @property
    def done(self) -> bool:
        """Whether every request has been handed over."""
        ...

    def deliver_before(self, t: float) -> int:
        """Hand over the requests delivered before ``t`` (a run simulates ahead of the
        clock); how many."""
        ...


class StepHost(Protocol):
    """What the run-ahead path uses of an instance (:class:`sim.instance.instance.Instance`):
    its parts, all public; it reads and drives them as the step loop would."""

    config: RunConfig
    env: simpy.Environment
    clock: PlanClock
    cost: CostModel
    kv: KvManager
    scheduler: Scheduler
    timeline: Timeline
    marks: LinkMarks
    arrivals: Arrivals
    observers: list[StepObserver]

    def memory_columns(
        self, step_s: float | np.ndarray, activations: float | np.ndarray,
        kv_running: float | np.ndarray, kv_cached: float | np.ndarray, staging: float,
        moved: tuple,
    ) -> dict[str, float | np.ndarray]: ...  # fmt: skip
