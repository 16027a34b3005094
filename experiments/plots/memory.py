"""Timeline figures, one panel per run: HBM pressure and host-link utilisation."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from experiments.plots.sources import DEFAULTS, PlotOptions, Run, Source, runs
from experiments.plots.style import GIB, color, figure_legend, panels, plt, save, styled

HBM_PARTS = (
    ("hbm_weights_bytes", "weights", "#4c72b0"),
    ("hbm_reserve_bytes", "runtime reserve", "#8c8c8c"),
    ("hbm_activation_bytes", "activations", "#dd8452"),
    ("hbm_kv_running_bytes", "KV running", "#55a868"),
    ("hbm_kv_cached_bytes", "KV cached", "#a6d8a8"),
    ("hbm_staging_bytes", "staging", "#8172b3"),
)
LINK_PARTS = (("h2d_util", "host → device (H2D)"), ("d2h_util", "device → host (D2H)"))


def _timeline(run_dir: str | Path) -> pd.DataFrame:
    return pd.read_parquet(Path(run_dir) / "timeline.parquet")


def hbm_pressure_data(run_dir: str | Path) -> pd.DataFrame:
    """The series the HBM pressure plot stacks: time and GiB of each part, capacity, pool.

    Run files from before KV was split into running / cached / staging count all KV as
    running.
    """
    timeline = _timeline(run_dir)
    if "hbm_kv_running_bytes" not in timeline:
        timeline = timeline.assign(
            hbm_kv_running_bytes=timeline.hbm_kv_bytes, hbm_kv_cached_bytes=0.0,
            hbm_staging_bytes=0.0,
        )  # fmt: skip
    data = pd.DataFrame({"time_s": timeline.time_s})
    parts = [column for column, _, _ in HBM_PARTS]
    for column in [*parts, "hbm_kv_bytes"]:
        data[column] = timeline[column] / GIB
    data["capacity_gib"] = (timeline[parts].sum(axis=1) + timeline.hbm_free_bytes) / GIB
    data["kv_pool_gib"] = timeline.hbm_kv_pool_bytes / GIB
    return data


def _hbm_panel(ax: plt.Axes, run: Run) -> None:
    data = hbm_pressure_data(run.path)
    ax.stackplot(
        data.time_s,
        *[data[c] for c, _, _ in HBM_PARTS],
        labels=[label for _, label, _ in HBM_PARTS],
        colors=[c for _, _, c in HBM_PARTS],
        step="post",
        alpha=0.9,
        linewidth=0,
    )
    capacity = data.capacity_gib.iloc[0] if len(data) else 0.0
    ax.axhline(capacity, color="black", lw=1.2, label="HBM capacity")
    ceiling = data.hbm_weights_bytes + data.hbm_reserve_bytes + data.kv_pool_gib
    ax.plot(data.time_s, ceiling, color="#c44e52", lw=1, ls="--", label="KV pool limit",
            drawstyle="steps-post")  # fmt: skip
    ax.set(xlabel="simulated time (s)", ylabel="HBM (GiB)", title=run.label)
    ax.set_xlim(0, max(float(data.time_s.max()), 1e-9) if len(data) else 1)
    ax.set_ylim(0, max(capacity, 1e-9) * 1.08)


def plot_hbm_pressure(source: Source, out: str | Path, options: PlotOptions = DEFAULTS) -> Path:
    """Stacked HBM use over time against capacity and the KV pool, one panel per run."""
    found = runs(source, options)
    with styled():
        fig, axes = panels(len(found))
        for ax, run in zip(axes, found, strict=True):
            _hbm_panel(ax, run)
        fig.tight_layout()
        figure_legend(fig, axes)
        return save(fig, out)


def link_data(run_dir: str | Path) -> pd.DataFrame:
    """Time and H2D / D2H utilisation (fraction of each step the link was busy)."""
    timeline = _timeline(run_dir)
    return pd.DataFrame({"time_s": timeline.time_s, **{c: timeline[c] for c, _ in LINK_PARTS}})


def plot_link(source: Source, out: str | Path, options: PlotOptions = DEFAULTS) -> Path:
    """H2D and D2H utilisation of the host link over time, one panel per run."""
    found = runs(source, options)
    with styled():
        fig, axes = panels(len(found), height=2.4)
        for ax, run in zip(axes, found, strict=True):
            data = link_data(run.path)
            for i, (column, label) in enumerate(LINK_PARTS):
                ax.plot(data.time_s, data[column] * 100, color=color(i), label=label,
                        drawstyle="steps-post", lw=1.0)  # fmt: skip
            ax.set(xlabel="simulated time (s)", ylabel="link utilisation (%)", title=run.label)
            ax.set_ylim(0, 105)
            ax.set_xlim(0, max(float(data.time_s.max()), 1e-9) if len(data) else 1)
        fig.tight_layout()
        figure_legend(fig, axes, ncol=2)
        return save(fig, out)
