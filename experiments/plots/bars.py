"""The routing figure: how each router does, its TTFT above its prefix hits.

A column of two panels per ``--panel`` value. Above: TTFT p50 as grouped bars, a group per
router and a bar (and colour) per series, with p99 as a black whisker from the bar's top.
Below: the prefix hit rate as stacked bars in the same places, a segment per tier that
served the hit: HBM plain, DRAM ``////``, SSD ``....``, the cluster's KV pool ``xxxx``
(drawn where some point has a pool). The numbers: :mod:`experiments.plots.routing`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from experiments.plots.layout import Drawn, emit, finish
from experiments.plots.metrics import data_name
from experiments.plots.routing import ROUTER, routing_data
from experiments.plots.sources import DEFAULTS, PlotOptions, Source
from experiments.plots.style import MAX_PANELS, check_lines, color, plt, styled
from experiments.plots.titles import describe, joined
from sim.errors import KvsimError

MAX_COLUMNS = MAX_PANELS // 2  # two rows of panels
MAX_ROUTERS = 12
GROUP = 0.8  # the width of a router's group of bars (categories are 1 apart)
HATCHES = {"hbm": "", "dram": "////", "ssd": "....", "pool": "xxxx"}
TIER_NAMES = {"hbm": "HBM", "dram": "DRAM", "ssd": "SSD", "pool": "KV pool"}
P99 = "TTFT p99 (whisker)"
TTFT_LABEL = "TTFT (ms): bar p50, whisker p99"
HIT_LABELS = {"hit": "prefix hit rate (%)", "reuse": "cross-request hit rate (%)"}


def routing_table(data: pd.DataFrame) -> pd.DataFrame:
    """The numbers the figure draws, in its units: ``panel``, ``series``, ``router``,
    ``ttft_p50_ms``, ``ttft_p99_ms``, each tier's hit rate in % (``hbm_hit_rate_pct`` ...
    ``pool_hit_rate_pct``; ``_reuse_`` with ``--metric reuse``) and ``n``."""
    table = pd.DataFrame({
        "panel": data.panel, "series": data.series, "router": data.router,
        "ttft_p50_ms": data.ttft_p50_s * 1e3, "ttft_p99_ms": data.ttft_p99_s * 1e3,
    })  # fmt: skip
    for column in data.attrs["hits"].values():
        table[data_name(column, 100.0)] = data[column] * 100.0
    table["n"] = data.n
    return table


@dataclass(frozen=True)
class Groups:
    """Where the bars go: a group per router at 0, 1, ..., a bar per series within it."""

    routers: list[str]
    series: list[str]

    @property
    def width(self) -> float:
        return GROUP / len(self.series)

    def at(self, i: int) -> np.ndarray:
        """The centres of series ``i``'s bars."""
        shift = (i - (len(self.series) - 1) / 2) * self.width
        return np.arange(len(self.routers)) + shift


def _check(panels: int, groups: Groups) -> None:
    """Refuse more columns, series or routers than a figure keeps readable."""
    if panels > MAX_COLUMNS:
        raise KvsimError(
            f"{panels} panels (columns) is more than the {MAX_COLUMNS} a routing figure draws "
            "(two rows each); keep fewer with --where KEY=V1|V2|..., or choose --panel AXIS"
        )
    check_lines(len(groups.series), "series")
    if len(groups.routers) > MAX_ROUTERS:
        raise KvsimError(
            f"{len(groups.routers)} routers is more than the {MAX_ROUTERS} a routing figure "
            f"draws; keep fewer with --where {ROUTER}=R1|R2|..."
        )


def _figure(columns: int, groups: Groups) -> tuple[Figure, list[Axes], list[Axes]]:
    """Two rows (TTFT, hits) of ``columns`` panels, each column sharing its x axis."""
    width = max(3.6, 0.8 + len(groups.routers) * (0.3 + 0.22 * len(groups.series)))
    fig, grid = plt.subplots(2, columns, figsize=(width * columns, 5.4), squeeze=False,
                             sharex="col")  # fmt: skip
    return fig, list(grid[0]), list(grid[1])


def _cells(table: pd.DataFrame, panel: str, series: str, groups: Groups) -> pd.DataFrame:
    """One series' rows of a panel, a row per router (NaN where it has no point)."""
    rows = table[(table.panel == panel) & (table.series == series)]
    return rows.set_index("router").reindex(groups.routers)


def _ttft_panel(ax: Axes, table: pd.DataFrame, panel: str, groups: Groups) -> None:
    """p50 bars, a p99 whisker on each (drawn after the bars: the legend lists them last)."""
    cells = [_cells(table, panel, series, groups) for series in groups.series]
    for i, series in enumerate(groups.series):
        p50 = cells[i].ttft_p50_ms.to_numpy(float)
        ax.bar(groups.at(i), p50, groups.width, color=color(i), label=series or "_nolegend_")
    for i, rows in enumerate(cells):
        p50, p99 = rows.ttft_p50_ms.to_numpy(float), rows.ttft_p99_ms.to_numpy(float)
        ax.errorbar(groups.at(i), p50, yerr=[np.zeros_like(p50), p99 - p50], fmt="none",
                    ecolor="black", elinewidth=0.8, capsize=2.0, label=P99)  # fmt: skip
    ax.set_ylabel(TTFT_LABEL)
    ax.tick_params(labelbottom=False)


def _hit_panel(ax: Axes, table: pd.DataFrame, panel: str, groups: Groups, tiers: dict) -> None:
    """Stacked bars, a segment per tier (in ``tiers``' order), and a legend key per tier."""
    for i, series in enumerate(groups.series):
        cells, x = _cells(table, panel, series, groups), groups.at(i)
        bottom = np.zeros(len(groups.routers))
        for tier, column in tiers.items():
            heights = cells[column].to_numpy(float)
            ax.bar(x, heights, groups.width, bottom=bottom, color=color(i), hatch=HATCHES[tier],
                   edgecolor="white", linewidth=0.4, label="_nolegend_")  # fmt: skip
            bottom = bottom + np.nan_to_num(heights)
    for tier in tiers:  # NOTE: zero-size grey keys; the bars take the series' colours
        ax.add_patch(Rectangle((0, 0), 0, 0, facecolor="0.55", edgecolor="white",
                               hatch=HATCHES[tier], label=f"{TIER_NAMES[tier]} hit"))  # fmt: skip
    ax.set_xticks(range(len(groups.routers)), groups.routers)
    if len(groups.routers) > 3:
        ax.tick_params(axis="x", labelrotation=30)
        for tick in ax.get_xticklabels():
            tick.set(ha="right", rotation_mode="anchor")


def draw_routing(source: Source, options: PlotOptions = DEFAULTS) -> Drawn:
    """Each router's TTFT (p50 bars, p99 whiskers) above its prefix hit rate by tier."""
    data = routing_data(source, options)
    if options.logx:
        raise KvsimError("--logx: the routing figure's x axis holds routers (categories)")
    table = routing_table(data)
    groups = Groups(list(dict.fromkeys(data.router)), list(dict.fromkeys(data.series)))
    names = list(dict.fromkeys(data.panel))
    _check(len(names), groups)
    hits = {t: data_name(c, 100.0) for t, c in data.attrs["hits"].items()}
    if not data.attrs["pool"]:
        hits.pop("pool")
    facets = data.attrs["facets"]
    with styled():
        fig, top, bottom = _figure(len(names), groups)
        for ax, low, name in zip(top, bottom, names, strict=True):
            _ttft_panel(ax, table, name, groups)
            _hit_panel(low, table, name, groups, hits)
            ax.set_title(name if len(names) > 1 else "")
            low.set(xlabel="router" if facets.x == ROUTER else facets.x,
                    ylabel=HIT_LABELS[data.attrs["metric"] or "hit"])  # fmt: skip
            for panel in (ax, low) if not options.logy else (low,):
                panel.set_ylim(bottom=0)
        about = describe(data.attrs["runs"])
        finish(fig, top, options, joined(names[0], about) if len(names) == 1 else about, bottom)
    return Drawn(fig, [*top, *bottom], table)


def plot_routing(source: Source, out: str | Path, options: PlotOptions = DEFAULTS) -> Path:
    """Draw :func:`draw_routing` into ``out``."""
    return emit(draw_routing(source, options), out, options)
