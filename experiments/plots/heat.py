"""KV heat: blocks (y) over time (x), colour = accesses, colour family = the block's tier.

It needs per-block access data: ``kv_heat.parquet`` (one row per step and block read:
``time_s``, ``block``, ``accesses``, ``tier``), which a run writes with
``engine.kv_heat: true``; without it the figure refuses and says so. Each tier's
colourbar sits in its own cell of a row under the map, so they never overlap.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.colors import LogNorm

from experiments.plots.layout import Drawn, emit, finish
from experiments.plots.sources import DEFAULTS, PlotOptions, Source, runs
from experiments.plots.style import plt, styled
from experiments.plots.titles import describe, joined
from sim.errors import KvsimError

HEAT_FILE = "kv_heat.parquet"
HEAT_COLUMNS = ("time_s", "block", "accesses", "tier")
TIER_MAPS = {"hbm": "Reds", "dram": "Blues", "ssd": "Greys"}
BINS = 300  # cells per axis at most


def _heat_path(run_dir: Path) -> Path:
    """The run's per-block access file, or a clear refusal when the run has none."""
    path = run_dir / HEAT_FILE
    if not path.is_file():
        raise KvsimError(
            f"{run_dir}: no {HEAT_FILE}, the per-block access data the heatmap draws; a run "
            "writes it with engine.kv_heat: true (e.g. kvsim run CONFIG --set "
            "engine.kv_heat=true --out DIR; engine.kv_heat_interval_s bounds its size)"
        )
    return path


def _read_heat(run_dir: Path) -> pd.DataFrame:
    path = _heat_path(run_dir)
    heat = pd.read_parquet(path)
    missing = [c for c in HEAT_COLUMNS if c not in heat.columns]
    if missing:
        raise KvsimError(f"{path}: missing column(s) {', '.join(missing)}")
    unknown = sorted(set(heat.tier) - set(TIER_MAPS))
    if unknown:
        raise KvsimError(f"{path}: unknown tier(s) {unknown}; expected {', '.join(TIER_MAPS)}")
    return heat


def heatmap_data(run_dir: str | Path, bins: int = BINS) -> pd.DataFrame:
    """Accesses summed per (time cell, block cell, tier): ``time_bin``, ``block_bin`` (left
    edges), ``tier``, ``accesses``."""
    heat = _read_heat(Path(run_dir))
    times = np.unique(heat.time_s.to_numpy())
    t_edges = times if len(times) <= bins else np.linspace(times[0], times[-1], bins + 1)[:-1]
    blocks = int(heat.block.max()) + 1 if len(heat) else 1
    b_width = max(int(np.ceil(blocks / bins)), 1)
    cells = heat.assign(
        time_bin=t_edges[np.searchsorted(t_edges, heat.time_s.to_numpy(), side="right") - 1],
        block_bin=(heat.block // b_width) * b_width,
    )
    data = cells.groupby(["time_bin", "block_bin", "tier"], as_index=False)["accesses"].sum()
    data.attrs.update(block_width=b_width, time_edges=t_edges)
    return data


def _cells(data: pd.DataFrame) -> pd.DataFrame:
    """The cells the map draws: each in the tier that served most of its accesses."""
    top = data.sort_values("accesses", kind="stable").drop_duplicates(
        ["time_bin", "block_bin"], keep="last"
    )
    return top.sort_values(["time_bin", "block_bin"]).reset_index(drop=True)


def _draw_tiers(fig: plt.Figure, ax: plt.Axes, caxes: list[plt.Axes], data: pd.DataFrame,
                cells: pd.DataFrame) -> None:  # fmt: skip
    """Each tier's cells in its colours, with its colourbar in its own cell below."""
    t_edges = np.append(data.attrs["time_edges"], data.time_bin.max() + 1e-9)
    width = data.attrs["block_width"]
    b_values = np.arange(0, data.block_bin.max() + 1, width)
    b_edges = np.append(b_values, b_values[-1] + width)
    norm = LogNorm(vmin=max(data.accesses[data.accesses > 0].min(), 1), vmax=data.accesses.max())
    tiers = [t for t in TIER_MAPS if (cells.tier == t).any()]
    for cax, tier in zip(caxes, tiers, strict=True):
        rows = cells[cells.tier == tier]
        grid = np.full((len(b_values), len(t_edges) - 1), np.nan)
        ti = np.searchsorted(data.attrs["time_edges"], rows.time_bin)
        bi = (rows.block_bin // width).astype(int)
        grid[bi, ti] = rows.accesses.clip(lower=1)
        mesh = ax.pcolormesh(t_edges, b_edges, np.ma.masked_invalid(grid), cmap=TIER_MAPS[tier],
                             norm=norm)  # fmt: skip
        fig.colorbar(mesh, cax=cax, orientation="horizontal", label=f"accesses ({tier.upper()})")


def draw_heatmap(source: Source, options: PlotOptions = DEFAULTS) -> Drawn:
    """KV heat of one run: block id over time, coloured by accesses and tier."""
    found = runs(source, options)
    for run in found:
        _heat_path(run.path)  # NOTE: refuse for missing data before asking to narrow
    if len(found) != 1:
        raise KvsimError(f"heatmap draws one run; got {len(found)} (narrow with --where)")
    data = heatmap_data(found[0].path)
    if data.empty:
        raise KvsimError(f"{found[0].path}: {HEAT_FILE} has no rows")
    cells = _cells(data)
    tiers = cells.tier.nunique()
    with styled():
        fig = plt.figure(figsize=(8.0, 4.6))
        grid = fig.add_gridspec(2, tiers, height_ratios=(1.0, 0.045))
        ax = fig.add_subplot(grid[0, :])
        caxes = [fig.add_subplot(grid[1, i]) for i in range(tiers)]
        _draw_tiers(fig, ax, caxes, data, cells)
        ax.set(xlabel="simulated time (s)", ylabel="KV block id")
        ax.grid(False)
        title = joined(f"KV heat: {found[0].label}", describe([found[0].path]))
        finish(fig, [ax], options, title)
    table = cells.rename(columns={"time_bin": "time_s", "block_bin": "block"})
    return Drawn(fig, [ax], table[["time_s", "block", "tier", "accesses"]])


def plot_heatmap(source: Source, out: str | Path, options: PlotOptions = DEFAULTS) -> Path:
    """Draw :func:`draw_heatmap` into ``out``."""
    return emit(draw_heatmap(source, options), out, options)
