"""The numbers of the summary figures of a sweep: a metric against an axis, per series.

A series is (by default) each combination of the other axes that vary; each x value holds
the mean over seeds and one standard deviation. ``experiments.plots.curves`` draws them.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from experiments import store
from experiments.plots.quantities import as_numbers
from experiments.plots.sources import (
    DEFAULTS,
    PlotOptions,
    Source,
    as_paths,
    check_loose,
    determined,
    label_of,
    one_sweep,
    read_replay_csv,
    sweep_rows,
    varying,
)
from experiments.plots.style import GIB
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
    **{
        f"{t}_reuse_hit_rate": (f"{t.upper()} cross-request hit rate (%)", 100.0)
        for t in ("hbm", "dram", "ssd")
    },
}
TIERS = ("hbm", "dram", "ssd")
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


def data_name(metric: str, scale: float) -> str:
    """The name of a metric's column in plotted units: ``hbm_hit_rate_pct``, ``ttft_p50_ms``."""
    if scale == 100.0:
        return f"{metric}_pct"
    if scale == 1e3 and metric.endswith("_s"):
        return f"{metric[:-2]}_ms"
    if scale == 1 / GIB and metric.endswith("_bytes"):
        return f"{metric[:-6]}_gib"
    return metric


def hit_metric(frame: pd.DataFrame, metric: str | None) -> str:
    """The hit-rate figure to draw: ``--metric TIER`` (default ``hbm``) is the tier's
    cross-request rate (``TIER_reuse_hit_rate``) where every point has it, else (results
    written before it existed) ``TIER_hit_rate``; any other name is taken as it is."""
    tier = metric or "hbm"
    if tier not in TIERS:
        return tier
    reuse = f"{tier}_reuse_hit_rate"
    if reuse in frame.columns and frame[reuse].notna().all():
        return reuse
    return f"{tier}_hit_rate"


def _is_numeric(frame: pd.DataFrame, axis: str) -> bool:
    """Numbers, or quantities with units (``32GB/s``)."""
    return pd.api.types.is_numeric_dtype(frame[axis]) or as_numbers(list(frame[axis])) is not None


def _default_x(frame: pd.DataFrame, moving: list[str], kind: str) -> str:
    if kind == "hit-rate":
        for axis in moving:
            if "capacity" in axis or "pool_blocks" in axis:
                return axis
    numeric = [a for a in moving if _is_numeric(frame, a)]
    if not numeric and not moving:
        raise KvsimError("no axis varies among the points to plot; nothing to put on x")
    return (numeric or moving)[0]


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
    others = [a for a in varying(frame, axes) if a not in fixed and not determined(frame, fixed, a)]
    hue = list(options.hue) if options.hue is not None else others
    loose = [a for a in others if a not in hue and not determined(frame, [*fixed, *hue], a)]
    check_loose(frame, loose)
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
    if kind == "hit-rate":
        metric = hit_metric(frame, options.metric)
    else:
        metric = options.metric or "output_tokens_per_s"
    labelled, x = _series(frame, options, kind)
    numbers = as_numbers(list(labelled[x]))
    if numbers is not None:  # NOTE: a unit-valued axis (32GB/s) drawn as numbers
        labelled[x] = numbers[0]
    data = _aggregate(labelled, x, metric)
    runs = [store.run_dir(path, p) for p in dict.fromkeys(labelled.point_id)]
    data.attrs.update(x=x, x_unit=numbers[1] if numbers else "", metric=metric, runs=runs)
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
    table = read_replay_csv(path, REPLAY_COLUMNS)
    table = table.assign(_panel="", _series=table.policy.astype(str))
    data = _aggregate(table, "capacity_blocks", "hit_rate")
    data.attrs.update(
        x="capacity_blocks", x_label="capacity (blocks)", metric="hit_rate",
        title=f"kvsim replay: {path.name}",
    )  # fmt: skip
    return data
