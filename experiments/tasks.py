"""What a backend runs for one point, and how the point ended."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path

from experiments import store
from sim.config.run import RunConfig
from sim.errors import KvsimError
from sim.run import RunResult, simulate
from sim.rundir import write_run

DIED = "the worker process died while this point was in flight (killed, or out of memory)"


@dataclass(frozen=True)
class Task:
    """What a worker needs to run one point."""

    point_id: str
    config: RunConfig
    base_dir: Path


@dataclass(frozen=True)
class Outcome:
    """How one point ended: ``error`` is None when it finished."""

    point_id: str
    error: str | None = None
    detail: str = ""


@dataclass(frozen=True)
class Limits:
    """How a backend may run points: how many at once, and for how long each."""

    workers: int | None = None  # None: every core (local) or every CPU of the cluster (Ray)
    timeout_s: float | None = None  # None: no limit


NO_LIMITS = Limits()
Outcomes = Generator[Outcome, None, None]
Backend = Callable[[list[Task], Path, Limits], Outcomes]


def timed_out(task: Task, limits: Limits) -> Outcome:
    """The outcome of a point stopped at its time limit."""
    return Outcome(task.point_id, f"timed out after {limits.timeout_s:g} s; the point was stopped")


def describe(error: BaseException) -> str:
    """One line for a failed point: the user-facing message, or the exception type and text."""
    if isinstance(error, KvsimError):
        return str(error)
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def simulate_task(task: Task) -> tuple[RunResult | None, Outcome]:
    """Simulate one point; an exception becomes a failed outcome instead of propagating."""
    try:
        result = simulate(task.config, base_dir=task.base_dir)
    except Exception as error:  # NOTE: any bug in one point must not stop the others
        return None, Outcome(task.point_id, describe(error), traceback.format_exc())
    return result, Outcome(task.point_id)


def run_task(task: Task, out: Path) -> Outcome:
    """Simulate one point and write its run directory (what a local worker does)."""
    result, outcome = simulate_task(task)
    if result is not None:
        write_run(result, store.run_dir(out, task.point_id))
    return outcome
