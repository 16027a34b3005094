"""Per-instance load over simulated time: each instance's queue (``waiting``) and its
``running`` requests, one line per instance; a row of two panels per run.

A cluster run's timeline has a row per instance-step (``instance`` 0..N-1), so each line
steps at its own instance's step times; a one-instance run draws one line, instance 0.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from experiments.plots.instances import INSTANCE, check_instances, instance_ids
from experiments.plots.layout import Drawn, emit, finish
from experiments.plots.sources import DEFAULTS, PlotOptions, Run, Source, runs
from experiments.plots.style import MAX_PANELS, color, plt, styled
from experiments.plots.titles import describe, joined
from sim.errors import KvsimError

LOAD_PARTS = (("waiting", "queue (waiting)"), ("running", "running"))
MAX_RUNS = MAX_PANELS // len(LOAD_PARTS)  # a row of panels per run


def load_data(run_dir: str | Path) -> pd.DataFrame:
    """Per step: ``time_s``, ``instance`` (0 in a one-instance run), ``waiting`` and
    ``running`` requests, instance by instance, each in time order."""
    timeline = pd.read_parquet(Path(run_dir) / "timeline.parquet")
    data = pd.DataFrame(
        {
            "time_s": timeline.time_s,
            INSTANCE: timeline.get(INSTANCE, 0),
            "waiting": timeline.waiting,
            "running": timeline.running,
        }
    )
    data[INSTANCE] = data[INSTANCE].astype("int64")
    return data.sort_values([INSTANCE, "time_s"], kind="stable", ignore_index=True)


def _load_table(run: Run) -> pd.DataFrame:
    """One run's numbers as the figure draws them."""
    data = load_data(run.path)
    check_instances(len(instance_ids(data)), run.path)
    return pd.concat([pd.DataFrame({"run": [run.label] * len(data)}), data], axis=1)


def _figure(n: int) -> tuple[Figure, list[Axes]]:
    """A row of panels (queue, running) per run."""
    if n > MAX_RUNS:
        raise KvsimError(
            f"{n} runs is more than the {MAX_RUNS} a load figure draws ({len(LOAD_PARTS)} "
            "panels each); choose fewer runs (--where KEY=VALUE)"
        )
    fig, grid = plt.subplots(n, len(LOAD_PARTS), figsize=(4.2 * len(LOAD_PARTS), 2.6 * n),
                             squeeze=False, sharex="row")  # fmt: skip
    return fig, list(grid.flat)


def _load_panel(ax: Axes, table: pd.DataFrame, column: str, title: str) -> None:
    """One line per instance of ``column`` against time."""
    for i, instance in enumerate(instance_ids(table)):
        rows = table[table[INSTANCE] == instance]
        ax.plot(rows.time_s, rows[column], color=color(i), label=f"instance {instance}",
                drawstyle="steps-post", lw=1.0)  # fmt: skip
    ax.set(xlabel="simulated time (s)", ylabel="requests", title=title)
    ax.set_xlim(0, max(float(table.time_s.max()), 1e-9) if len(table) else 1)
    ax.set_ylim(bottom=0)


def draw_load(source: Source, options: PlotOptions = DEFAULTS) -> Drawn:
    """Each instance's queue and running requests over time, a row of panels per run."""
    found = runs(source, options)
    tables = [_load_table(run) for run in found]
    single = len(found) == 1
    with styled():
        fig, axes = _figure(len(found))
        for row, (run, table) in enumerate(zip(found, tables, strict=True)):
            for j, (column, name) in enumerate(LOAD_PARTS):
                title = name if single else joined(run.label, name)
                _load_panel(axes[row * len(LOAD_PARTS) + j], table, column, title)
        about = describe(run.path for run in found)
        finish(fig, axes, options, joined(found[0].label, about) if single else about)
    return Drawn(fig, axes, pd.concat(tables, ignore_index=True))


def plot_load(source: Source, out: str | Path, options: PlotOptions = DEFAULTS) -> Path:
    """Draw :func:`draw_load` into ``out``."""
    return emit(draw_load(source, options), out, options)
