"""Figures from run and sweep directories (they read the run files only, never the engine).

Every ``plot_*`` function takes ``(source, out, options)`` and draws with a ``draw_*`` twin,
which returns the figure, its panels and the table of the numbers it draws (what
``--data-out`` writes); a ``*_data`` function returns those numbers in SI units.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from experiments.plots.bars import draw_routing, plot_routing, routing_table
from experiments.plots.curves import draw_hit_rate, draw_throughput, plot_hit_rate, plot_throughput
from experiments.plots.heat import draw_heatmap, heatmap_data, plot_heatmap
from experiments.plots.latency import draw_latency_cdf, latency_cdf_data, plot_latency_cdf
from experiments.plots.layout import LEGENDS, Drawn, check_legend, parse_limits
from experiments.plots.load import draw_load, load_data, plot_load
from experiments.plots.memory import (
    HBM_PARTS,
    draw_hbm_pressure,
    draw_link,
    hbm_pressure_data,
    link_data,
    plot_hbm_pressure,
    plot_link,
)
from experiments.plots.metrics import hit_rate_data, throughput_data
from experiments.plots.overlay import draw_hit_rate_overlay, plot_hit_rate_overlay
from experiments.plots.routing import routing_data
from experiments.plots.sources import PlotOptions, Source
from experiments.plots.style import GIB, MAX_LINES, MAX_PANELS

Plot = Callable[[Source, str | Path, PlotOptions], Path]
Draw = Callable[[Source, PlotOptions], Drawn]

PLOTS: dict[str, Plot] = {
    "hbm-pressure": plot_hbm_pressure,
    "latency-cdf": plot_latency_cdf,
    "throughput": plot_throughput,
    "hit-rate": plot_hit_rate,
    "link": plot_link,
    "heatmap": plot_heatmap,
    "hit-rate-overlay": plot_hit_rate_overlay,
    "load": plot_load,
    "routing": plot_routing,
}
DRAWS: dict[str, Draw] = {
    "hbm-pressure": draw_hbm_pressure,
    "latency-cdf": draw_latency_cdf,
    "throughput": draw_throughput,
    "hit-rate": draw_hit_rate,
    "link": draw_link,
    "heatmap": draw_heatmap,
    "hit-rate-overlay": draw_hit_rate_overlay,
    "load": draw_load,
    "routing": draw_routing,
}

__all__ = [
    "DRAWS",
    "GIB",
    "HBM_PARTS",
    "LEGENDS",
    "MAX_LINES",
    "MAX_PANELS",
    "PLOTS",
    "Drawn",
    "PlotOptions",
    "check_legend",
    "draw_hbm_pressure",
    "draw_heatmap",
    "draw_hit_rate",
    "draw_latency_cdf",
    "draw_link",
    "draw_load",
    "draw_routing",
    "draw_throughput",
    "hbm_pressure_data",
    "heatmap_data",
    "hit_rate_data",
    "latency_cdf_data",
    "link_data",
    "load_data",
    "parse_limits",
    "plot_hbm_pressure",
    "plot_heatmap",
    "plot_hit_rate",
    "plot_latency_cdf",
    "plot_link",
    "plot_load",
    "plot_routing",
    "plot_throughput",
    "routing_data",
    "routing_table",
    "throughput_data",
]
