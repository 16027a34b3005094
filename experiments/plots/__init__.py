"""Figures from run and sweep directories (they read the run files only, never the engine).

Every ``plot_*`` function takes ``(source, out, options)`` and has a ``*_data`` twin that
returns exactly the numbers it draws.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from experiments.plots.heat import heatmap_data, plot_heatmap
from experiments.plots.latency import latency_cdf_data, plot_latency_cdf
from experiments.plots.memory import (
    HBM_PARTS,
    hbm_pressure_data,
    link_data,
    plot_hbm_pressure,
    plot_link,
)
from experiments.plots.metrics import hit_rate_data, plot_hit_rate, plot_throughput, throughput_data
from experiments.plots.sources import PlotOptions, Source
from experiments.plots.style import GIB

Plot = Callable[[Source, str | Path, PlotOptions], Path]

PLOTS: dict[str, Plot] = {
    "hbm-pressure": plot_hbm_pressure,
    "latency-cdf": plot_latency_cdf,
    "throughput": plot_throughput,
    "hit-rate": plot_hit_rate,
    "link": plot_link,
    "heatmap": plot_heatmap,
}

__all__ = [
    "GIB",
    "HBM_PARTS",
    "PLOTS",
    "PlotOptions",
    "hbm_pressure_data",
    "heatmap_data",
    "hit_rate_data",
    "latency_cdf_data",
    "link_data",
    "plot_hbm_pressure",
    "plot_heatmap",
    "plot_hit_rate",
    "plot_latency_cdf",
    "plot_link",
    "plot_throughput",
    "throughput_data",
]
