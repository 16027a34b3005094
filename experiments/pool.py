"""The local backend: points on a process pool over this machine's cores.

At most ``workers`` points are in flight, so each starts as soon as it is submitted: that
bounds what a dead worker or a stop takes down, and dates each point's time limit. A point
past its limit, or a dead worker, costs a new pool; the other points in flight then run
again (timeout) or are failed (dead worker: which point killed it is unknown).
"""

from __future__ import annotations

import os
import signal
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from experiments.tasks import DIED, Limits, Outcome, Outcomes, Task, run_task, timed_out


def default_workers() -> int:
    """All the cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # NOTE: not on macOS
        return os.cpu_count() or 1


def _worker_init() -> None:
    """Pool workers leave signals to the driver, which stops them itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _stop(pool: ProcessPoolExecutor) -> None:
    """Stop a pool now, killing the points in flight."""
    terminate = getattr(pool, "terminate_workers", None)  # Python >= 3.14
    if terminate is not None:
        terminate()
        return
    # NOTE: shutdown() forgets the processes, so take them first
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        process.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.join()


class _Flight:
    """A pool and the points in flight on it, with their start times."""

    def __init__(self, workers: int, out: Path):
        self.workers, self.out = workers, out
        self.pool = ProcessPoolExecutor(workers, initializer=_worker_init)
        self.points: dict[Future[Outcome], tuple[Task, float]] = {}

    def fill(self, queue: deque[Task]) -> None:
        """Submit queued points until ``workers`` are in flight."""
        while queue and len(self.points) < self.workers:
            task = queue.popleft()
            self.points[self.pool.submit(run_task, task, self.out)] = (task, time.monotonic())

    def wait(self, timeout_s: float | None) -> set[Future[Outcome]]:
        """The points that finished, waiting at most until the first one's limit."""
        limit = None
        if timeout_s is not None:
            first = min(start for _, start in self.points.values())
            limit = max(first + timeout_s - time.monotonic(), 0.0)
        done, _ = wait(self.points, timeout=limit, return_when=FIRST_COMPLETED)
        return done

    def expired(self, timeout_s: float | None) -> list[Task]:
        """Points in flight past their limit."""
        if timeout_s is None:
            return []
        now = time.monotonic()
        return [task for task, start in self.points.values() if now - start >= timeout_s]

    def restart(self) -> list[Task]:
        """Kill the pool and start a new one; the points that were in flight."""
        _stop(self.pool)
        tasks = [task for task, _ in self.points.values()]
        self.points.clear()
        self.pool = ProcessPoolExecutor(self.workers, initializer=_worker_init)
        return tasks


def run_serial(tasks: list[Task], out: Path, limits: Limits) -> Outcomes:
    """Every point in this process, one after the other (no time limit)."""
    for task in tasks:
        yield run_task(task, out)


def run_local(tasks: list[Task], out: Path, limits: Limits) -> Outcomes:
    """Points on a process pool; serially in this process for one worker and no limit."""
    workers = min(limits.workers or default_workers(), max(len(tasks), 1))
    if workers <= 1 and limits.timeout_s is None:
        yield from run_serial(tasks, out, limits)
        return
    queue = deque(tasks)
    flight = _Flight(workers, out)
    try:
        while queue or flight.points:
            flight.fill(queue)
            done = flight.wait(limits.timeout_s)
            broken = False
            for future in done:
                task, _ = flight.points.pop(future)
                try:
                    yield future.result()
                except BrokenProcessPool:
                    broken = True
                    yield Outcome(task.point_id, DIED)
            if broken:
                for task in flight.restart():
                    yield Outcome(task.point_id, DIED)
            elif expired := flight.expired(limits.timeout_s):
                for task in expired:
                    yield timed_out(task, limits)
                stopped = {t.point_id for t in expired}
                rerun = [t for t in flight.restart() if t.point_id not in stopped]
                queue.extendleft(reversed(rerun))
    finally:
        _stop(flight.pool)
