"""TTFT and TPOT distributions: one CDF per configuration (seeds pooled)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from experiments.plots.layout import Drawn, emit, finish
from experiments.plots.sources import DEFAULTS, PlotOptions, Source, runs
from experiments.plots.style import check_lines, color, linestyle, plt, styled
from experiments.plots.titles import describe

METRICS = (("ttft", "TTFT (ms)"), ("tpot", "TPOT (ms)"))


def latency_cdf_data(source: Source, options: PlotOptions = DEFAULTS) -> pd.DataFrame:
    """Per configuration and metric: the sorted latencies of finished requests and their CDF.

    Columns: ``config``, ``metric`` (``ttft`` or ``tpot``), ``value_s``, ``cdf``. Runs of one
    configuration that differ only by seed are pooled (``attrs['runs']``: the run folders).
    """
    groups: dict[str, list[pd.DataFrame]] = {}
    found = runs(source, options)
    for run in found:
        requests = pd.read_parquet(run.path / "requests.parquet")
        groups.setdefault(run.config, []).append(requests[requests.status == "finished"])
    check_lines(len(groups), "configurations")
    parts = []
    for config, frames in groups.items():
        requests = pd.concat(frames, ignore_index=True)
        for metric, _ in METRICS:
            values = np.sort(requests[f"{metric}_s"].dropna().to_numpy())
            cdf = np.arange(1, len(values) + 1) / max(len(values), 1)
            parts.append(pd.DataFrame({"config": config, "metric": metric, "value_s": values,
                                       "cdf": cdf}))  # fmt: skip
    data = pd.concat(parts, ignore_index=True)
    data.attrs["runs"] = [run.path for run in found]
    return data


def _log_time(ax: plt.Axes, values: pd.Series) -> None:
    """A log time axis with plain tick labels, where the values span more than a decade."""
    if len(values) and values.max() >= 10 * values.min():
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())


def draw_latency_cdf(source: Source, options: PlotOptions = DEFAULTS) -> Drawn:
    """TTFT and TPOT CDFs side by side, one line per configuration (log time over a decade)."""
    data = latency_cdf_data(source, options)
    table = pd.DataFrame({"config": data.config, "metric": data.metric,
                          "latency_ms": data.value_s * 1e3, "cdf": data.cdf})  # fmt: skip
    with styled():
        fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.0))
        for ax, (metric, label) in zip(axes, METRICS, strict=True):
            for i, config in enumerate(table.config.unique()):
                rows = table[(table.config == config) & (table.metric == metric)]
                ax.plot(rows.latency_ms, rows.cdf, color=color(i), ls=linestyle(i), label=config,
                        drawstyle="steps-post")  # fmt: skip
            ax.set(xlabel=label, ylabel="fraction of requests", ylim=(0, 1.02))
            if options.logx is None:
                _log_time(ax, table[(table.metric == metric) & (table.latency_ms > 0)].latency_ms)
        finish(fig, list(axes), options, describe(data.attrs["runs"]))
    return Drawn(fig, list(axes), table)


def plot_latency_cdf(source: Source, out: str | Path, options: PlotOptions = DEFAULTS) -> Path:
    """Draw :func:`draw_latency_cdf` into ``out``."""
    return emit(draw_latency_cdf(source, options), out, options)
