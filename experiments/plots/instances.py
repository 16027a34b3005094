"""The instances of a cluster run's timeline: a row per instance-step, told apart by
``instance`` (0..N-1). A one-instance run has no such column, or one value in it."""

from __future__ import annotations

import pandas as pd

from experiments.plots.style import MAX_LINES, MAX_PANELS
from sim.errors import KvsimError

INSTANCE = "instance"


def instance_ids(frame: pd.DataFrame) -> list[int]:
    """The instances in ``frame``, ascending; ``[]`` where it has no ``instance`` column."""
    if INSTANCE not in frame:
        return []
    return sorted(int(i) for i in frame[INSTANCE].unique())


def is_cluster(frame: pd.DataFrame) -> bool:
    """Whether the timeline has rows of more than one instance."""
    return len(instance_ids(frame)) > 1


def by_instance(frame: pd.DataFrame) -> list[tuple[int | None, pd.DataFrame]]:
    """Each instance's rows, in time order (stable), or ``[(None, frame)]`` for one."""
    if not is_cluster(frame):
        return [(None, frame)]
    return [
        (i, frame[frame[INSTANCE] == i].sort_values("time_s", kind="stable"))
        for i in instance_ids(frame)
    ]


def instance_label(run: str, instance: int | None, single_run: bool) -> str:
    """A panel's label: the run's, with ``instance k`` for one of a cluster's instances."""
    if instance is None:
        return "" if single_run else run
    return f"instance {instance}" if single_run else f"{run} · instance {instance}"


def check_instances(count: int, path: object) -> None:
    """Refuse more instances than :data:`MAX_LINES` distinguishable lines."""
    if count > MAX_LINES:
        raise KvsimError(
            f"{path}: {count} instances is more than the {MAX_LINES} lines a panel keeps "
            "distinguishable (one colour each); plot a run of at most 8 instances, or read "
            "timeline.parquet's waiting and running columns by instance"
        )


def check_facets(panels: int, runs: int) -> None:
    """Refuse more panels than :data:`MAX_PANELS` where cluster runs' instances made them."""
    if panels > MAX_PANELS and panels > runs:
        raise KvsimError(
            f"{panels} panels (one per instance of the cluster runs) is more than "
            f"{MAX_PANELS}; plot one cluster run of at most {MAX_PANELS} instances"
        )
