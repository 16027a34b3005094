"""TTFT and TPOT distributions: one CDF per configuration (seeds pooled)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from experiments.plots.sources import DEFAULTS, PlotOptions, Source, runs
from experiments.plots.style import MAX_LINES, color, figure_legend, linestyle, plt, save, styled
from sim.errors import KvsimError

METRICS = (("ttft", "TTFT (ms)"), ("tpot", "TPOT (ms)"))


def latency_cdf_data(source: Source, options: PlotOptions = DEFAULTS) -> pd.DataFrame:
    """Per configuration and metric: the sorted latencies of finished requests and their CDF.

    Columns: ``config``, ``metric`` (``ttft`` or ``tpot``), ``value_s``, ``cdf``. Runs of one
    configuration that differ only by seed are pooled.
    """
    groups: dict[str, list[pd.DataFrame]] = {}
    for run in runs(source, options):
        requests = pd.read_parquet(run.path / "requests.parquet")
        groups.setdefault(run.config, []).append(requests[requests.status == "finished"])
    if len(groups) > MAX_LINES:
        raise KvsimError(
            f"{len(groups)} configurations is more than {MAX_LINES} lines; "
            "choose fewer (--where KEY=VALUE)"
        )
    parts = []
    for config, frames in groups.items():
        requests = pd.concat(frames, ignore_index=True)
        for metric, _ in METRICS:
            values = np.sort(requests[f"{metric}_s"].dropna().to_numpy())
            cdf = np.arange(1, len(values) + 1) / max(len(values), 1)
            parts.append(pd.DataFrame({"config": config, "metric": metric, "value_s": values,
                                       "cdf": cdf}))  # fmt: skip
    return pd.concat(parts, ignore_index=True)


def plot_latency_cdf(source: Source, out: str | Path, options: PlotOptions = DEFAULTS) -> Path:
    """TTFT and TPOT CDFs side by side, one line per configuration (log time over a decade)."""
    data = latency_cdf_data(source, options)
    with styled():
        fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.0))
        for ax, (metric, label) in zip(axes, METRICS, strict=True):
            for i, config in enumerate(data.config.unique()):
                rows = data[(data.config == config) & (data.metric == metric)]
                ax.plot(rows.value_s * 1e3, rows.cdf, color=color(i), ls=linestyle(i), label=config,
                        drawstyle="steps-post")  # fmt: skip
            ax.set(xlabel=label, ylabel="fraction of requests", ylim=(0, 1.02))
            values = data[(data.metric == metric) & (data.value_s > 0)].value_s
            if len(values) and values.max() >= 10 * values.min():  # NOTE: log if > a decade
                ax.set_xscale("log")
                ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
                ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                ax.xaxis.set_minor_formatter(NullFormatter())
        fig.tight_layout()
        figure_legend(fig, list(axes), ncol=2)
        return save(fig, out)
