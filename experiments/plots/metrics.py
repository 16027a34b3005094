"""Summary figures of a sweep against an axis: throughput (any metric) and hit rate.

A line per series (by default, each combination of the other axes that vary), a marker per
x value at the mean over seeds, and error bars of one standard deviation over seeds.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.plots.sources import (
    DEFAULTS,
    PlotOptions,
    Source,
    as_paths,
    label_of,
    one_sweep,
    sweep_rows,
    varying,
)
from experiments.plots.style import (
    GIB,
    MAX_LINES,
    color,
    figure_legend,
    linestyle,
    marker,
    panels,
    plt,
    save,
    styled,
)
from experiments.sweep import format_value
from sim.errors import KvsimError

NAMED = {
    "output_tokens_per_s": ("output throughput (tokens/s)", 1.0),
    "input_tokens_per_s": ("input throughput (tokens/s)", 1.0),
    "requests_per_s": ("throughput (requests/s)", 1.0),
    "mean_batch_size": ("mean batch size (sequences)", 1.0),
    "sim_time_s": ("simulated time (s)", 1.0),
    "wall_time_s": ("wall time (s)", 1.0),
    "stall_s": ("stall time (s)", 1.0),
    "hit_rate": ("hit rate (%)", 100.0),
}
REPLAY_COLUMNS = ("policy", "capacity_blocks", "hit_rate")
DATA_COLUMNS = ["panel", "series", "x", "mean", "std", "n"]


def metric_axis(metric: str) -> tuple[str, float]:
    """The y label (with unit) of a summary metric and the factor from its SI value."""
    if metric in NAMED:
        return NAMED[metric]
    words = metric.split("_")
    if metric.endswith("_rate"):
        return " ".join([words[0].upper(), *words[1:]]) + " (%)", 100.0
    if metric.endswith("_bytes"):
        return " ".join(words[:-1]).replace("hbm", "HBM").replace("kv", "KV") + " (GiB)", 1 / GIB
    if words[0] in ("ttft", "tpot", "e2e") and metric.endswith("_s"):
        return " ".join([words[0].upper(), *words[1:-1]]) + " (ms)", 1e3
    return metric.replace("_", " "), 1.0


def _default_x(frame: pd.DataFrame, moving: list[str], kind: str) -> str:
    if kind == "hit-rate":
        for axis in moving:
            if "capacity" in axis or "pool_blocks" in axis:
                return axis
    numeric = [a for a in moving if pd.api.types.is_numeric_dtype(frame[a])]
    if not numeric and not moving:
        raise KvsimError("no axis varies among the points to plot; nothing to put on x")
    return (numeric or moving)[0]


def _determined(frame: pd.DataFrame, by: list[str], axis: str) -> bool:
    """Whether ``axis`` takes one value within each group of ``by`` (e.g. zipped with x)."""
    if not by:
        return frame[axis].map(format_value).nunique() <= 1
    text = frame[[*by, axis]].map(format_value)
    return bool((text.groupby(by)[axis].nunique() <= 1).all())


def _series(frame: pd.DataFrame, options: PlotOptions, kind: str) -> tuple[pd.DataFrame, str]:
    """The rows with ``_panel`` and ``_series`` labels, and the x axis; checks the axes.

    By default the series are the other axes that vary, less those that follow x or the
    panel (zipped with them). An axis that still varies within a series is an error.
    """
    axes = [*frame.attrs["axes"]]
    x = options.x or _default_x(frame, varying(frame, axes), kind)
    named = [("--x", x), ("--panel", options.panel), *(("--hue", h) for h in options.hue or ())]
    for flag, axis in named:
        if axis is not None and axis not in axes:
            raise KvsimError(f"{flag} {axis}: not an axis of this sweep; axes: {', '.join(axes)}")
    fixed = [a for a in (x, options.panel) if a is not None]
    others = [
        a for a in varying(frame, axes) if a not in fixed and not _determined(frame, fixed, a)
    ]
    hue = list(options.hue) if options.hue is not None else others
    loose = [a for a in others if a not in hue and not _determined(frame, [*fixed, *hue], a)]
    if loose:
        values = frame[loose[0]].map(format_value).unique()
        raise KvsimError(
            f"axis {loose[0]!r} varies ({', '.join(values[:4])}) but is not --x, --hue nor "
            f"--panel; fix it with --where {loose[0]}={values[0]} or add it to --hue"
        )
    panel = options.panel
    frame = frame.assign(
        _panel=frame[panel].map(lambda v: f"{panel}={format_value(v)}") if panel else "",
        _series=[label_of(row, hue, "") for _, row in frame.iterrows()],
    )
    return frame, x


def _aggregate(frame: pd.DataFrame, x: str, metric: str) -> pd.DataFrame:
    """Mean, standard deviation (0 for one seed) and count of ``metric`` per panel/series/x."""
    if metric not in frame.columns:
        raise KvsimError(f"--metric {metric}: not a summary figure of this sweep")
    if not pd.api.types.is_numeric_dtype(frame[metric]):
        raise KvsimError(f"--metric {metric}: not a number")
    grouped = frame.groupby(["_panel", "_series", x], sort=False)[metric]
    data = grouped.agg(["mean", "std", "count"]).reset_index()
    data.columns = DATA_COLUMNS
    data["std"] = data["std"].fillna(0.0)
    if pd.api.types.is_numeric_dtype(data.x):  # NOTE: panels and series keep sweep order
        rank = {c: data[c].map({v: i for i, v in enumerate(dict.fromkeys(data[c]))})
                for c in ("panel", "series")}  # fmt: skip
        order = pd.DataFrame({**rank, "x": data.x}).sort_values(["panel", "series", "x"]).index
        data = data.loc[order].reset_index(drop=True)
    return data


def sweep_metric_data(
    source: Source, options: PlotOptions, kind: str = "throughput"
) -> pd.DataFrame:
    """Per panel, series and x value: mean, std and count over seeds of the metric (SI units)."""
    path = one_sweep(source, kind)
    frame = sweep_rows(path, options)
    default = "hbm_hit_rate" if kind == "hit-rate" else "output_tokens_per_s"
    labelled, x = _series(frame, options, kind)
    data = _aggregate(labelled, x, options.metric or default)
    data.attrs.update(x=x, metric=options.metric or default)
    return data


def throughput_data(source: Source, options: PlotOptions = DEFAULTS) -> pd.DataFrame:
    """The points the throughput plot draws (see :func:`sweep_metric_data`)."""
    return sweep_metric_data(source, options, "throughput")


def hit_rate_data(source: Source, options: PlotOptions = DEFAULTS) -> pd.DataFrame:
    """Hit rate per policy and capacity, from a sweep or a ``kvsim replay`` CSV."""
    paths = as_paths(source)
    if len(paths) == 1 and paths[0].suffix.lower() == ".csv":
        return _replay_data(paths[0])
    return sweep_metric_data(source, options, "hit-rate")


def _replay_data(path: Path) -> pd.DataFrame:
    """A ``kvsim replay`` CSV as plot data (rows of one policy and capacity averaged)."""
    if not path.is_file():
        raise KvsimError(f"{path}: no such file")
    table = pd.read_csv(path)
    missing = [c for c in REPLAY_COLUMNS if c not in table.columns]
    if missing:
        raise KvsimError(
            f"{path}: not a 'kvsim replay' CSV; missing column(s) {', '.join(missing)} "
            f"(expected {', '.join(REPLAY_COLUMNS)})"
        )
    table = table.assign(_panel="", _series=table.policy.astype(str))
    data = _aggregate(table, "capacity_blocks", "hit_rate")
    data.attrs.update(x="capacity (blocks)", metric="hit_rate")
    return data


def _draw(data: pd.DataFrame, out: str | Path, ylabel: str, scale: float) -> Path:
    """One panel per panel label, one errorbar line per series."""
    series = list(dict.fromkeys(data.series))
    if len(series) > MAX_LINES:
        raise KvsimError(
            f"{len(series)} lines is more than {MAX_LINES}; fix some axes (--where KEY=VALUE) "
            "or split them into panels (--panel AXIS)"
        )
    numeric = pd.api.types.is_numeric_dtype(data.x)
    ticks = list(dict.fromkeys(data.x.map(format_value)))
    with styled():
        names = list(dict.fromkeys(data.panel))
        fig, axes = panels(len(names), width=4.2, height=3.0)
        for ax, name in zip(axes, names, strict=True):
            for i, label in enumerate(series):
                rows = data[(data.panel == name) & (data.series == label)]
                xs = rows.x if numeric else rows.x.map(format_value).map(ticks.index)
                ax.errorbar(xs, rows["mean"] * scale, yerr=rows["std"] * scale, color=color(i),
                            marker=marker(i), ls=linestyle(i), ms=4, capsize=2.5,
                            label=label or "all")  # fmt: skip
            _x_axis(ax, data, numeric, ticks)
            ax.set(ylabel=ylabel, title=name)
            ax.set_ylim(bottom=0)
        fig.tight_layout()
        if len(names) > 1 and (len(series) > 1 or series[0]):
            figure_legend(fig, axes, ncol=min(len(series), 3))
        elif len(series) > 1 or series[0]:
            axes[0].legend(loc="best", frameon=False)
        return save(fig, out)


def _x_axis(ax: plt.Axes, data: pd.DataFrame, numeric: bool, ticks: Sequence[str]) -> None:
    ax.set_xlabel(str(data.attrs.get("x", "")))
    if not numeric:
        ax.set_xticks(range(len(ticks)), ticks, rotation=20 if len(ticks) > 4 else 0)
        return
    values = np.asarray(data.x, dtype=float)
    if values.min() > 0 and values.max() / values.min() >= 8:
        ax.set_xscale("log", base=2 if np.allclose(np.log2(values) % 1, 0) else 10)
        if len(ticks) <= 12:
            ax.set_xticks(
                sorted(set(values.tolist())), [format_value(v) for v in sorted(set(data.x))]
            )
            ax.minorticks_off()


def plot_throughput(source: Source, out: str | Path, options: PlotOptions = DEFAULTS) -> Path:
    """A summary metric (default output tokens/s) against an axis, error bars over seeds."""
    data = throughput_data(source, options)
    return _draw(data, out, *metric_axis(data.attrs["metric"]))


def plot_hit_rate(source: Source, out: str | Path, options: PlotOptions = DEFAULTS) -> Path:
    """Hit rate against capacity, one line per policy (a sweep, or a replay CSV)."""
    data = hit_rate_data(source, options)
    return _draw(data, out, *metric_axis(data.attrs["metric"]))
