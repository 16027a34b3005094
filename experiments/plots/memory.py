"""Timeline figures, one panel per run: HBM pressure and host-link utilisation.

A cluster run (a timeline with more than one ``instance``) gets one HBM pressure panel per
instance.

Where the KV is a sliver of HBM (a 70B model's weights leave a few GiB, or a light load
fills little of a large pool), the HBM pressure panel gets a strip below it that draws the
KV alone, to its own scale.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from experiments.plots.instances import (
    INSTANCE,
    by_instance,
    check_facets,
    instance_label,
    is_cluster,
)
from experiments.plots.layout import Drawn, emit, finish
from experiments.plots.sources import DEFAULTS, PlotOptions, Run, Source, runs
from experiments.plots.style import GIB, color, panel_pairs, panels, plt, styled
from experiments.plots.titles import describe, joined

HBM_PARTS = (
    ("hbm_weights_bytes", "weights", "#4c72b0"),
    ("hbm_reserve_bytes", "runtime reserve", "#8c8c8c"),
    ("hbm_activation_bytes", "activations", "#dd8452"),
    ("hbm_kv_running_bytes", "KV running", "#55a868"),
    ("hbm_kv_cached_bytes", "KV cached", "#a6d8a8"),
    ("hbm_staging_bytes", "staging", "#8172b3"),
)
KV_PARTS = HBM_PARTS[3:]  # KV running, KV cached, staging
SLIVER = 0.15  # KV held under this share of HBM: a strip zooms on it
LINK_PARTS = (("h2d_util", "host → device (H2D)"), ("d2h_util", "device → host (D2H)"))


def _timeline(run_dir: str | Path) -> pd.DataFrame:
    return pd.read_parquet(Path(run_dir) / "timeline.parquet")


def hbm_pressure_data(run_dir: str | Path) -> pd.DataFrame:
    """The series the HBM pressure plot stacks: time and GiB of each part, capacity, pool;
    and ``instance`` where the timeline has more than one.

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
    if is_cluster(timeline):
        data[INSTANCE] = timeline[INSTANCE].astype("int64")
    return data


def _part_name(column: str) -> str:
    """``hbm_kv_running_bytes`` -> ``kv_running_gib``: a part's column in the figure's data."""
    return column.removeprefix("hbm_").removesuffix("_bytes") + "_gib"


def _hbm_table(run: Run) -> pd.DataFrame:
    """One run's numbers as the HBM pressure figure draws them (GiB)."""
    data = hbm_pressure_data(run.path)
    table = pd.DataFrame({"run": run.label, "time_s": data.time_s})
    for column, _, _ in HBM_PARTS:
        table[_part_name(column)] = data[column]
    table["capacity_gib"] = data.capacity_gib
    table["kv_pool_gib"] = data.kv_pool_gib
    # where the stack's KV tops out when the pool is full: on the step's activations
    fixed = data.hbm_weights_bytes + data.hbm_reserve_bytes + data.hbm_activation_bytes
    table["kv_pool_limit_gib"] = fixed + data.kv_pool_gib
    if INSTANCE in data:
        table.insert(1, INSTANCE, data[INSTANCE])
    return table


def _kv_use(table: pd.DataFrame) -> float:
    """The most KV (running, cached and staging) HBM held at any step (GiB)."""
    kv = table[[_part_name(c) for c, _, _ in KV_PARTS]].sum(axis=1)
    return float(kv.max()) if len(table) else 0.0


def _wants_detail(tables: list[pd.DataFrame], choice: bool | None) -> bool:
    """The KV strip: as asked, else when the KV is a sliver of HBM in some run."""
    if choice is not None:
        return choice
    return any(len(t) and _kv_use(t) < SLIVER * t.capacity_gib.iloc[0] for t in tables)


def _kv_top(table: pd.DataFrame) -> float:
    """The strip's range: the KV it held, and the pool too unless it is over twice that."""
    use = _kv_use(table)
    pool = float(table.kv_pool_gib.max()) if len(table) else 0.0
    return use if 0 < use < pool / 2 else max(use, pool)


def _stack(ax: plt.Axes, table: pd.DataFrame, parts: tuple[tuple[str, str, str], ...]) -> None:
    ax.stackplot(
        table.time_s,
        *[table[_part_name(c)] for c, _, _ in parts],
        labels=[label for _, label, _ in parts],
        colors=[c for _, _, c in parts],
        step="post",
        alpha=0.9,
        linewidth=0,
    )


def _hbm_panel(ax: plt.Axes, table: pd.DataFrame, title: str) -> None:
    _stack(ax, table, HBM_PARTS)
    capacity = table.capacity_gib.iloc[0] if len(table) else 0.0
    ax.axhline(capacity, color="black", lw=1.2, label="HBM capacity")
    ax.plot(table.time_s, table.kv_pool_limit_gib, color="#c44e52", lw=1, ls="--",
            label="KV pool limit", drawstyle="steps-post")  # fmt: skip
    ax.set(xlabel="simulated time (s)", ylabel="HBM per GPU (GiB)", title=title)
    ax.set_xlim(0, max(float(table.time_s.max()), 1e-9) if len(table) else 1)
    ax.set_ylim(0, max(capacity, 1e-9) * 1.08)


def _kv_strip(ax: plt.Axes, top: plt.Axes, table: pd.DataFrame) -> None:
    """KV alone, to its own scale: legible where it is a sliver of the HBM (the pool's line
    is off the top where the pool is over twice the KV it held)."""
    _stack(ax, table, KV_PARTS)
    ax.plot(table.time_s, table.kv_pool_gib, color="#c44e52", lw=1, ls=":", label="KV pool",
            drawstyle="steps-post")  # fmt: skip
    ax.set(xlabel=top.get_xlabel(), ylabel="KV per GPU (GiB)")
    top.set_xlabel("")
    ax.set_xlim(top.get_xlim())
    ax.set_ylim(0, max(_kv_top(table), 1e-9) * 1.08)


def draw_hbm_pressure(source: Source, options: PlotOptions = DEFAULTS) -> Drawn:
    """Stacked HBM use over time against capacity and the KV pool, one panel per run (per
    instance of a cluster run); a strip below each zooms on the KV when it is a sliver of
    HBM (``options.kv_detail``)."""
    found = runs(source, options)
    tables = [_hbm_table(run) for run in found]
    facets = [
        (instance_label(run.label, instance, len(found) == 1), rows)
        for run, table in zip(found, tables, strict=True)
        for instance, rows in by_instance(table)
    ]  # a panel per run, or per instance of a cluster run
    check_facets(len(facets), len(found))
    with styled():
        if _wants_detail([rows for _, rows in facets], options.kv_detail):
            fig, axes, strips = panel_pairs(len(facets))
        else:
            (fig, axes), strips = panels(len(facets)), []
        for i, (ax, (label, rows)) in enumerate(zip(axes, facets, strict=True)):
            _hbm_panel(ax, rows, label)
            if strips:
                _kv_strip(strips[i], ax, rows)
        about = describe(run.path for run in found)
        title = joined(found[0].label, about) if len(found) == 1 else about
        finish(fig, axes, options, title, strips)
    return Drawn(fig, axes, pd.concat(tables, ignore_index=True))


def plot_hbm_pressure(source: Source, out: str | Path, options: PlotOptions = DEFAULTS) -> Path:
    """Draw :func:`draw_hbm_pressure` into ``out``."""
    return emit(draw_hbm_pressure(source, options), out, options)


def link_data(run_dir: str | Path) -> pd.DataFrame:
    """Time and H2D / D2H utilisation (fraction of each step the link was busy)."""
    timeline = _timeline(run_dir)
    return pd.DataFrame({"time_s": timeline.time_s, **{c: timeline[c] for c, _ in LINK_PARTS}})


def _link_table(run: Run) -> pd.DataFrame:
    """One run's link utilisation as the figure draws it (%)."""
    data = link_data(run.path)
    return pd.DataFrame({"run": run.label, "time_s": data.time_s,
                         **{f"{c}_pct": data[c] * 100 for c, _ in LINK_PARTS}})  # fmt: skip


def draw_link(source: Source, options: PlotOptions = DEFAULTS) -> Drawn:
    """H2D and D2H utilisation of the host link over time, one panel per run."""
    found = runs(source, options)
    tables = [_link_table(run) for run in found]
    single = len(found) == 1
    with styled():
        fig, axes = panels(len(found), height=2.4)
        for ax, run, table in zip(axes, found, tables, strict=True):
            for i, (column, label) in enumerate(LINK_PARTS):
                ax.plot(table.time_s, table[f"{column}_pct"], color=color(i), label=label,
                        drawstyle="steps-post", lw=1.0)  # fmt: skip
            ax.set(xlabel="simulated time (s)", ylabel="link utilisation (%)",
                   title="" if single else run.label)  # fmt: skip
            ax.set_ylim(0, 105)
            ax.set_xlim(0, max(float(table.time_s.max()), 1e-9) if len(table) else 1)
        about = describe(run.path for run in found)
        finish(fig, axes, options, joined(found[0].label, about) if single else about)
    return Drawn(fig, axes, pd.concat(tables, ignore_index=True))


def plot_link(source: Source, out: str | Path, options: PlotOptions = DEFAULTS) -> Path:
    """Draw :func:`draw_link` into ``out``."""
    return emit(draw_link(source, options), out, options)
