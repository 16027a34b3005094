"""Figures from run directories (they read the run files only, never the engine)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

GIB = 2.0**30
HBM_PARTS = (
    ("hbm_weights_bytes", "weights", "#4c72b0"),
    ("hbm_reserve_bytes", "runtime reserve", "#8c8c8c"),
    ("hbm_activation_bytes", "activations", "#dd8452"),
    ("hbm_kv_bytes", "KV cache", "#55a868"),
)


def hbm_pressure_data(run_dir: str | Path) -> pd.DataFrame:
    """The series the HBM pressure plot stacks: time and GiB of each part."""
    timeline = pd.read_parquet(Path(run_dir) / "timeline.parquet")
    data = pd.DataFrame({"time_s": timeline.time_s})
    for column, _, _ in HBM_PARTS:
        data[column] = timeline[column] / GIB
    data["capacity_gib"] = (
        timeline[[c for c, _, _ in HBM_PARTS]].sum(axis=1) + timeline.hbm_free_bytes
    ) / GIB
    data["kv_pool_gib"] = timeline.hbm_kv_pool_bytes / GIB
    return data


def plot_hbm_pressure(run_dir: str | Path, out: str | Path) -> Path:
    """Stacked area of HBM use over time against capacity and the KV pool's ceiling."""
    data = hbm_pressure_data(run_dir)
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=150)
    ax.stackplot(
        data.time_s,
        *[data[c] for c, _, _ in HBM_PARTS],
        labels=[label for _, label, _ in HBM_PARTS],
        colors=[color for _, _, color in HBM_PARTS],
        step="post",
        alpha=0.9,
    )
    ax.axhline(data.capacity_gib.iloc[0], color="black", lw=1.2, label="HBM capacity")
    ceiling = data[[c for c, _, _ in HBM_PARTS[:2]]].sum(axis=1) + data.kv_pool_gib
    ax.plot(data.time_s, ceiling, color="#c44e52", lw=1, ls="--", label="KV pool limit")
    ax.set(
        xlabel="simulated time (s)", ylabel="HBM (GiB)", title=f"HBM pressure: {Path(run_dir).name}"
    )
    ax.set_xlim(0, data.time_s.max() if len(data) else 1)
    ax.set_ylim(0, data.capacity_gib.iloc[0] * 1.3)
    ax.legend(loc="upper left", ncol=3, fontsize=8, framealpha=0.9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


PLOTS = {"hbm-pressure": plot_hbm_pressure}
