"""Summary figures of a sweep against an axis: throughput (any metric) and hit rate.

A line per series, a marker per x value at the mean over seeds, and error bars of one
standard deviation over seeds (the numbers: :mod:`experiments.plots.metrics`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from experiments.plots.layout import Drawn, emit, finish
from experiments.plots.metrics import data_name, hit_rate_data, metric_axis, throughput_data
from experiments.plots.sources import DEFAULTS, PlotOptions, Source
from experiments.plots.style import check_lines, color, linestyle, marker, panels, plt, styled
from experiments.plots.titles import describe, joined
from experiments.sweep import format_value
from sim.errors import KvsimError


def x_label(data: pd.DataFrame) -> str:
    """The x axis' label: the axis, and its unit when it is unit-valued."""
    unit = data.attrs.get("x_unit", "")
    name = str(data.attrs.get("x_label", data.attrs.get("x", "")))
    return f"{name} ({unit})" if unit else name


def curve_table(data: pd.DataFrame) -> pd.DataFrame:
    """The numbers a summary figure draws, in its axes' units: ``panel``, ``series``, x (named
    by the axis), the metric's mean and standard deviation (``hbm_hit_rate_pct``,
    ``hbm_hit_rate_pct_std``), and ``n`` (the seeds averaged)."""
    _, scale = metric_axis(data.attrs["metric"])
    y = data_name(data.attrs["metric"], scale)
    return pd.DataFrame({
        "panel": data.panel, "series": data.series, x_label(data): data.x,
        y: data["mean"] * scale, f"{y}_std": data["std"] * scale, "n": data.n,
    })  # fmt: skip


def _x_axis(ax: plt.Axes, data: pd.DataFrame, log: bool | None, ticks: Sequence[str]) -> None:
    """Category ticks, or a numeric axis (log when the values span 8x or more, or asked)."""
    ax.set_xlabel(x_label(data))
    if not pd.api.types.is_numeric_dtype(data.x):
        ax.set_xticks(range(len(ticks)), ticks, rotation=20 if len(ticks) > 4 else 0)
        return
    values = np.asarray(data.x, dtype=float)
    positive = bool(values.min() > 0)
    wide = positive and values.max() / values.min() >= 8
    if not (log if log is not None else wide):
        return
    base = 2 if positive and np.allclose(np.log2(values) % 1, 0) else 10
    ax.set_xscale("log", base=base)
    if positive and len(ticks) <= 12:
        shown = sorted(set(values.tolist()))
        ax.set_xticks(shown, [f"{v:g}" for v in shown])
        ax.minorticks_off()


def draw_curves(data: pd.DataFrame, options: PlotOptions = DEFAULTS) -> Drawn:
    """One panel per panel label, one errorbar line per series (colours never repeat)."""
    series = list(dict.fromkeys(data.series))
    check_lines(len(series))
    numeric = pd.api.types.is_numeric_dtype(data.x)
    if options.logx and not numeric:
        raise KvsimError(f"--logx: the x axis ({data.attrs.get('x')}) holds categories")
    ticks = list(dict.fromkeys(data.x.map(format_value)))
    table = curve_table(data)
    ylabel, _ = metric_axis(data.attrs["metric"])
    names = list(dict.fromkeys(data.panel))
    with styled():
        fig, axes = panels(len(names), width=4.2, height=3.0)
        for ax, name in zip(axes, names, strict=True):
            for i, label in enumerate(series):
                rows = table[(data.panel == name) & (data.series == label)]
                xs = rows.iloc[:, 2] if numeric else rows.iloc[:, 2].map(format_value).map(
                    ticks.index)  # fmt: skip
                ax.errorbar(xs, rows.iloc[:, 3], yerr=rows.iloc[:, 4], color=color(i),
                            marker=marker(i), ls=linestyle(i), ms=4, capsize=2.5,
                            label=label or "_nolegend_")  # fmt: skip
            _x_axis(ax, data, options.logx, ticks)
            ax.set(ylabel=ylabel, title=name if len(names) > 1 else "")
            if not options.logy:
                ax.set_ylim(bottom=0)
        about = describe(data.attrs.get("runs", ())) or data.attrs.get("title", "")
        finish(fig, axes, options, joined(names[0], about) if len(names) == 1 else about)
    return Drawn(fig, axes, table)


def draw_throughput(source: Source, options: PlotOptions = DEFAULTS) -> Drawn:
    """A summary metric (default output tokens/s) against an axis, error bars over seeds."""
    return draw_curves(throughput_data(source, options), options)


def draw_hit_rate(source: Source, options: PlotOptions = DEFAULTS) -> Drawn:
    """Hit rate against capacity, one line per policy (a sweep, or a replay CSV)."""
    return draw_curves(hit_rate_data(source, options), options)


def plot_throughput(source: Source, out: str | Path, options: PlotOptions = DEFAULTS) -> Path:
    """Draw :func:`draw_throughput` into ``out``."""
    return emit(draw_throughput(source, options), out, options)


def plot_hit_rate(source: Source, out: str | Path, options: PlotOptions = DEFAULTS) -> Path:
    """Draw :func:`draw_hit_rate` into ``out``."""
    return emit(draw_hit_rate(source, options), out, options)
