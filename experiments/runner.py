"""Run a sweep's points: on a local process pool (or in this process), or as Ray tasks.

A backend is a generator of :class:`~experiments.tasks.Outcome` (one per point, as they
finish). The driver records each outcome, drives the progress bar and writes
``results.parquet`` at the end, also when a signal (SIGTERM, Ctrl-C) stops the sweep: the
backend's ``finally`` then stops the points in flight, and ``--resume`` reruns just those.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from experiments import store
from experiments.sweep import Sweep
from experiments.tasks import NO_LIMITS, Backend, Limits, Outcomes, Task
from sim.errors import KvsimError
from sim.rundir import probe_folder

BACKENDS = ("local", "ray")


class SweepInterrupted(BaseException):
    """A signal stopped the sweep.

    NOTE: a BaseException, as KeyboardInterrupt, so that no point's ``except Exception``
    records it as that point's failure.
    """

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def backend(name: str) -> Backend:
    """The backend called ``name`` (Ray is imported only when asked for)."""
    if name == "local":
        from experiments.pool import run_local

        return run_local
    if name == "ray":
        from experiments.ray_backend import run_ray

        return run_ray
    raise KvsimError(f"unknown backend {name!r}; expected one of: {', '.join(BACKENDS)}")


@contextmanager
def interrupts_raise() -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT raise :class:`SweepInterrupted` (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        raise SweepInterrupted(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def prepare(out: Path, sweep: Sweep, resume: bool) -> list[Task]:
    """Check and set up the sweep directory; the tasks still to run."""
    if out.exists() and not out.is_dir():
        raise KvsimError(f"{out}: exists and is not a directory")
    probe_folder(out)  # a full disk or a read-only folder fails before any point runs
    if (out / store.MANIFEST).is_file() and not resume:
        raise KvsimError(
            f"{out} already holds a sweep; pass --resume to continue it (finished points are "
            "kept) or choose another --out"
        )
    out.mkdir(parents=True, exist_ok=True)
    store.remove_partial(out)
    store.write_manifest(out, sweep)
    return [
        Task(p.point_id, p.config, p.base_dir)
        for p in sweep.points
        if not (resume and store.is_done(out, p.point_id))
    ]


def _record(out: Path, outcomes: Outcomes, bar: tqdm) -> None:
    """Keep each outcome on disk as it comes, and count it on the bar."""
    failed = 0
    for outcome in outcomes:
        if outcome.error is None:
            store.clear_failure(out, outcome.point_id)
        else:
            failed += 1
            store.record_failure(out, outcome.point_id, outcome.error, outcome.detail)
            bar.set_postfix(failed=failed)
        bar.update(1)


def run_sweep(
    sweep: Sweep,
    out: str | Path,
    limits: Limits = NO_LIMITS,
    backend_name: str = "local",
    resume: bool = False,
    progress: bool = True,
) -> pd.DataFrame:
    """Run every point (only those not done yet with ``resume``); the results table.

    Raises :class:`SweepInterrupted` after writing ``results.parquet`` if a signal stops it.
    """
    run = backend(backend_name)
    out = Path(out)
    tasks = prepare(out, sweep, resume)
    skipped = len(sweep.points) - len(tasks)
    desc = f"sweep ({skipped} done before)" if skipped else "sweep"
    bar = tqdm(total=len(tasks), desc=desc, unit="point", disable=not progress, dynamic_ncols=True)
    try:
        with interrupts_raise():
            outcomes = run(tasks, out, limits)
            try:
                _record(out, outcomes, bar)
            finally:
                outcomes.close()  # NOTE: stops the points in flight while the handlers hold
    finally:
        bar.close()
        store.write_results(out)
    return store.load(out)
