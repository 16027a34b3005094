"""The numbers of the routing figure: each router's TTFT and prefix hit rate, by tier.

From a sweep over ``cluster.router.kind``: a category per router, in the sweep's order; a
series per value of the other axes that vary (``--hue``; by default every one not zipped
with the router or the panel), a panel per value of ``--panel`` (default ``workload`` where
it varies). Each cell is the mean over seeds of the points it holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from experiments import store
from experiments.plots.labels import value_labels
from experiments.plots.sources import (
    DEFAULTS,
    PlotOptions,
    Source,
    check_loose,
    determined,
    one_sweep,
    sweep_rows,
    varying,
)
from experiments.sweep import format_value
from sim.errors import KvsimError

ROUTER = "cluster.router.kind"
PANEL = "workload"
TIERS = ("hbm", "dram", "ssd", "pool")
HIT_METRICS = {"hit": "{}_hit_rate", "reuse": "{}_reuse_hit_rate"}  # --metric: the name form
LATENCIES = ("ttft_p50_s", "ttft_p99_s")
KEYS = ["panel", "series", "router"]


@dataclass(frozen=True)
class Facets:
    """The axis on x (the routers), the panel axis (or none) and the series axes."""

    x: str
    panel: str | None
    hue: tuple[str, ...]


def _router_axis(axes: list[str], chosen: str | None) -> str:
    """``--x``, else ``cluster.router.kind``; an axis of the sweep either way."""
    if chosen is not None and chosen not in axes:
        raise KvsimError(f"--x {chosen}: not an axis of this sweep; axes: {', '.join(axes)}")
    if chosen is None and ROUTER not in axes:
        raise KvsimError(
            f"routing compares routers: it draws a sweep over {ROUTER} (e.g. grid: "
            f"{{{ROUTER}: [round_robin, prefix_aware, kv_aware]}}, as "
            "experiments/configs/cluster-routing.yaml); this sweep's axes are "
            f"{', '.join(axes) or 'none'}; name another axis for the categories with --x AXIS"
        )
    return chosen or ROUTER


def _panel_axis(frame: pd.DataFrame, options: PlotOptions, x: str) -> str | None:
    """``--panel`` (``''``: none), else ``workload`` where it varies."""
    axes = list(frame.attrs["axes"])
    if options.panel is None:
        return PANEL if x != PANEL and PANEL in varying(frame, axes) else None
    if options.panel and options.panel not in axes:
        raise KvsimError(
            f"--panel {options.panel}: not an axis of this sweep; axes: {', '.join(axes)}"
        )
    if options.panel == x:
        raise KvsimError(f"--panel {x}: that axis is on x already; choose another")
    return options.panel or None


def facets(frame: pd.DataFrame, options: PlotOptions) -> Facets:
    """The router, panel and series axes; refuses an axis that varies within a bar."""
    axes = list(frame.attrs["axes"])
    x = _router_axis(axes, options.x)
    panel = _panel_axis(frame, options, x)
    fixed = [a for a in (x, panel) if a is not None]
    others = [a for a in varying(frame, axes) if a not in fixed and not determined(frame, fixed, a)]
    hue = list(options.hue) if options.hue is not None else others
    for axis in hue:
        if axis not in axes:
            raise KvsimError(f"--hue {axis}: not an axis of this sweep; axes: {', '.join(axes)}")
        if axis in fixed:
            raise KvsimError(f"--hue {axis}: that axis is on x or --panel already")
    loose = [a for a in others if a not in hue and not determined(frame, [*fixed, *hue], a)]
    check_loose(frame, loose)
    return Facets(x, panel, tuple(hue))


def hit_columns(frame: pd.DataFrame, metric: str | None) -> dict[str, str]:
    """The summary column of each tier's hit rate: ``--metric hit`` (default, ``TIER_hit_rate``:
    every admission's lookups) or ``reuse`` (``TIER_reuse_hit_rate``: cross-request)."""
    form = HIT_METRICS.get(metric or "hit")
    if form is None:
        raise KvsimError(
            f"--metric {metric}: routing draws the prefix hit rate; expected one of: "
            f"{', '.join(HIT_METRICS)}"
        )
    columns = {tier: form.format(tier) for tier in TIERS}
    missing = [c for t, c in columns.items() if t != "pool" and c not in frame.columns]
    missing += [c for c in LATENCIES if c not in frame.columns]
    if missing:
        raise KvsimError(
            f"the sweep's results have no {', '.join(missing)} (written by an older kvsim?); "
            "rerun the sweep" + (", or draw --metric hit" if metric == "reuse" else "")
        )
    return columns


def _labelled(frame: pd.DataFrame, chosen: Facets) -> pd.DataFrame:
    """The rows with their ``panel``, ``series`` and ``router`` labels."""

    def labels(axis: str, named: bool = True) -> pd.Series:
        return frame[axis].map(format_value).map(value_labels(axis, frame[axis], named))

    series = [labels(axis) for axis in chosen.hue]
    return frame.assign(
        panel=labels(chosen.panel) if chosen.panel else "",
        series=pd.concat(series, axis=1).agg(", ".join, axis=1) if series else "",
        router=labels(chosen.x, named=False),
    )


def _mean(rows: pd.DataFrame, values: list[str]) -> pd.DataFrame:
    """Mean of ``values`` and the count per panel, series and router, in the sweep's order."""
    grouped = rows.groupby(KEYS, sort=False)
    data = grouped[values].mean().join(grouped.size().rename("n")).reset_index()
    rank = {k: data[k].map({v: i for i, v in enumerate(dict.fromkeys(rows[k]))}) for k in KEYS}
    order = pd.DataFrame(rank).sort_values(KEYS, kind="stable").index
    return data.loc[order].reset_index(drop=True)


def routing_data(source: Source, options: PlotOptions = DEFAULTS) -> pd.DataFrame:
    """Per panel, series and router: ``ttft_p50_s``, ``ttft_p99_s`` and each tier's hit rate
    (a fraction of the prompt blocks looked up; no pool is 0), means over seeds, and ``n``
    (the points averaged). ``attrs``: the facets, the hit columns, ``pool`` (whether a point
    has a pool), ``runs`` (the run directories)."""
    path = one_sweep(source, "routing")
    frame = sweep_rows(path, options)
    chosen = facets(frame, options)
    columns = hit_columns(frame, options.metric)
    pool = columns["pool"] in frame.columns and bool(frame[columns["pool"]].notna().any())
    rows = _labelled(frame, chosen)
    pool_column = columns["pool"]  # NOTE: no pool (NaN, or no column at all) is no pool hit
    known = pool_column in rows.columns
    rows[pool_column] = pd.to_numeric(rows[pool_column]).fillna(0.0) if known else 0.0
    data = _mean(rows, [*LATENCIES, *columns.values()])
    runs = [store.run_dir(path, p) for p in frame.point_id]
    data.attrs.update(facets=chosen, hits=columns, pool=pool, runs=runs, metric=options.metric)
    return data
