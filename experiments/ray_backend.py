"""``--backend ray``: a sweep's points as Ray tasks, for users who outgrow one machine.

``ray.init()`` joins the cluster at ``$RAY_ADDRESS`` or starts a local instance. Tasks
return their results to the driver, which writes the run directories, so the nodes need
kvsim installed and the trace files, but no shared file system.
"""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path
from typing import Any

from experiments import store
from experiments.tasks import Limits, Outcome, Outcomes, Task, describe, simulate_task, timed_out
from sim.errors import KvsimError
from sim.rundir import write_run

POLL_S = 0.5  # NOTE: ray.wait blocks in C++; wake up to let signal handlers run


def import_ray() -> Any:
    """The ``ray`` module, or a clear error naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise KvsimError(
            "--backend ray needs Ray; install it with: pip install 'kvsim[ray]'"
        ) from None
    return ray


def run_ray(tasks: list[Task], out: Path, limits: Limits) -> Outcomes:
    """Run the points as Ray tasks, at most ``workers`` (default: the cluster's CPUs) at once."""
    ray = import_ray()
    started = not ray.is_initialized()
    if started:
        local = {} if os.environ.get("RAY_ADDRESS") else {"include_dashboard": False}
        ray.init(log_to_driver=False, **local)
    remote = ray.remote(num_cpus=1, max_retries=0)(simulate_task)
    workers = limits.workers or max(int(ray.cluster_resources().get("CPU", 1)), 1)
    queue = iter(tasks)
    flight: dict[Any, tuple[Task, float]] = {}
    try:
        while True:
            while len(flight) < workers and (task := next(queue, None)) is not None:
                flight[remote.remote(task)] = (task, time.monotonic())
            if not flight:
                return
            ready, _ = ray.wait(list(flight), num_returns=1, timeout=POLL_S)
            for ref in ready:
                yield _collect(ray, ref, flight.pop(ref)[0], out)
            yield from _expire(ray, flight, limits)
    finally:
        for ref in flight:
            ray.cancel(ref, force=True)
        if started:
            ray.shutdown()


def _collect(ray: Any, ref: Any, task: Task, out: Path) -> Outcome:
    """A finished task's outcome; its run directory is written here, on the driver."""
    try:
        result, outcome = ray.get(ref)
    except Exception as error:  # NOTE: a crashed worker or a lost node
        return Outcome(task.point_id, describe(error), traceback.format_exc())
    if result is not None:
        write_run(result, store.run_dir(out, task.point_id))
    return outcome


def _expire(ray: Any, flight: dict[Any, tuple[Task, float]], limits: Limits) -> Outcomes:
    """Cancel the tasks past their time limit."""
    if limits.timeout_s is None:
        return
    now = time.monotonic()
    for ref, (task, start) in list(flight.items()):
        if now - start >= limits.timeout_s:
            ray.cancel(ref, force=True)
            del flight[ref]
            yield timed_out(task, limits)
