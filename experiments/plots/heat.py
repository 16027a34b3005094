"""KV heat: blocks (y) over time (x), colour = accesses, colour family = the block's tier.

It needs per-block access data, which the run files written today do not hold: the
timeline has per-step totals only. The figure reads ``kv_heat.parquet`` (one row per step
and block read: ``time_s``, ``block``, ``accesses``, ``tier``) when a run directory has
one, and otherwise refuses rather than draw something the run did not record.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.colors import LogNorm

from experiments.plots.sources import DEFAULTS, PlotOptions, Source, runs
from experiments.plots.style import plt, save, styled
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
            f"{run_dir}: no per-block access data; the heatmap needs {HEAT_FILE} (one row per "
            f"step and block: {', '.join(HEAT_COLUMNS)}), and the run files hold per-step "
            "totals only (timeline.parquet), not which block was read when or where it lived; "
            "the simulator does not record it yet, so there is no KV heat to draw"
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


def _draw_tiers(ax: plt.Axes, data: pd.DataFrame, fig: plt.Figure) -> None:
    """Each cell in the colours of the tier that served most of its accesses."""
    t_edges = np.append(data.attrs["time_edges"], data.time_bin.max() + 1e-9)
    b_values = np.arange(0, data.block_bin.max() + 1, data.attrs["block_width"])
    width = data.attrs["block_width"]
    b_edges = np.append(b_values, b_values[-1] + width)
    top = data.sort_values("accesses", kind="stable").drop_duplicates(
        ["time_bin", "block_bin"], keep="last"
    )
    norm = LogNorm(vmin=max(data.accesses[data.accesses > 0].min(), 1), vmax=data.accesses.max())
    for tier, cmap in TIER_MAPS.items():
        rows = top[top.tier == tier]
        if rows.empty:
            continue
        grid = np.full((len(b_values), len(t_edges) - 1), np.nan)
        ti = np.searchsorted(data.attrs["time_edges"], rows.time_bin)
        bi = (rows.block_bin // width).astype(int)
        grid[bi, ti] = rows.accesses.clip(lower=1)
        mesh = ax.pcolormesh(t_edges, b_edges, np.ma.masked_invalid(grid), cmap=cmap, norm=norm)
        fig.colorbar(mesh, ax=ax, pad=0.01, fraction=0.04, label=f"accesses ({tier.upper()})")


def plot_heatmap(source: Source, out: str | Path, options: PlotOptions = DEFAULTS) -> Path:
    """KV heat of one run: block id over time, coloured by accesses and tier."""
    found = runs(source, options)
    for run in found:
        _heat_path(run.path)  # NOTE: refuse for missing data before asking to narrow
    if len(found) != 1:
        raise KvsimError(f"heatmap draws one run; got {len(found)} (narrow with --where)")
    data = heatmap_data(found[0].path)
    if data.empty:
        raise KvsimError(f"{found[0].path}: {HEAT_FILE} has no rows")
    with styled():
        fig, ax = plt.subplots(figsize=(8.0, 4.2))
        _draw_tiers(ax, data, fig)
        ax.set(
            xlabel="simulated time (s)", ylabel="KV block id", title=f"KV heat: {found[0].label}"
        )
        ax.grid(False)
        return save(fig, out)
