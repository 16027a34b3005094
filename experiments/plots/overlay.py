"""Engine hit rate against pool size, with ``kvsim replay`` curves of the same requests over it.

The sweep gives one solid line per eviction policy (the mean over seeds, error bars of one
standard deviation); the replay CSV (``kvsim replay --block-tokens B --max-requests N``: the
same requests, in the engine's blocks) one dashed line per policy in the same colour, and
Belady's OPT in black: what a demand-cached pool of that many blocks could hit at most.
The replay CSV's policies choose the lines: engine rows of other policies are left out.

``kvsim plot SWEEP_DIR hits.csv --kind hit-rate-overlay`` draws it (:func:`plot_hit_rate_overlay`,
from the files); :func:`overlay_data` and :func:`draw_overlay` work on tables.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from experiments import store
from experiments.plots.layout import Drawn, axis_options, emit
from experiments.plots.sources import (
    DEFAULTS,
    PlotOptions,
    Source,
    as_paths,
    read_replay_csv,
    sweep_rows,
)
from experiments.plots.style import color, marker, panels, plt, styled
from experiments.sweep import format_value
from sim.config.loader import load_config
from sim.errors import KvsimError

ENGINE_X = "engine.kv_pool_blocks"
ENGINE_SERIES = "kv.eviction"
ENGINE_METRIC = "hbm_reuse_hit_rate"  # cross-request hits: what replay counts
OLD_METRIC = "hbm_hit_rate"  # results written before the reuse rates existed
REPLAY_COLUMNS = ("policy", "capacity_blocks", "hit_rate", "block_tokens", "requests")
DATA_COLUMNS = ["source", "series", "x", "mean", "std", "n"]
BOUND = "opt"
BOUND_COLOR = "#000000"
MAX_POLICIES = 7  # distinguishable colours besides OPT's black


def overlay_data(
    sweep: pd.DataFrame,
    replay: pd.DataFrame,
    *,
    x: str = ENGINE_X,
    series: str = ENGINE_SERIES,
    metric: str = ENGINE_METRIC,
) -> pd.DataFrame:
    """Per source (``engine``, ``replay``), policy and pool size: mean, std and count.

    Args:
        sweep: a sweep's results rows (one per point and seed), with columns ``x``,
            ``metric`` and (if it varies) ``series``.
        replay: a ``kvsim replay`` CSV as read (policy, capacity_blocks, hit_rate, ...).
        x, series, metric: the sweep's pool-size axis, policy axis (absent: one line,
            ``engine``) and hit-rate column.
    """
    for column in (x, metric):
        if column not in sweep.columns:
            raise KvsimError(f"the sweep has no column {column!r}; expected a sweep over {x}")
    missing = [c for c in REPLAY_COLUMNS[:3] if c not in replay.columns]
    if missing:
        raise KvsimError(f"the replay table lacks column(s) {', '.join(missing)}")
    labels = replay.policy.astype(str)
    names = sweep[series].map(format_value) if series in sweep.columns else None
    if names is None:
        names = pd.Series("engine", index=sweep.index)
    elif not names.isin(labels).any():
        raise KvsimError(
            f"none of the sweep's policies ({', '.join(names.unique())}) is in the replay "
            f"table ({', '.join(labels.unique())}); replay them (--policies)"
        )
    keep = names.isin(labels) | (names == "engine")
    engine = _points(names[keep], sweep[x][keep], sweep[metric][keep])
    frames = [engine.assign(source="engine"), _points(labels, replay.capacity_blocks,
              replay.hit_rate).assign(source="replay")]  # fmt: skip
    return pd.concat(frames, ignore_index=True)[DATA_COLUMNS]


def _points(series: pd.Series, x: pd.Series, y: pd.Series) -> pd.DataFrame:
    """Mean, std (0 for one value) and count of ``y`` per series and x; series in first-seen
    order, x ascending."""
    frame = pd.DataFrame({"series": series.to_numpy(), "x": x.to_numpy(float),
                          "y": y.to_numpy(float)})  # fmt: skip
    data = frame.groupby(["series", "x"], sort=False).y.agg(["mean", "std", "count"])
    data = data.reset_index().rename(columns={"count": "n"})
    data["std"] = data["std"].fillna(0.0)
    rank = data.series.map({s: i for i, s in enumerate(dict.fromkeys(frame.series))})
    return data.assign(_rank=rank).sort_values(["_rank", "x"]).drop(columns="_rank")


def draw_overlay(
    data: pd.DataFrame, *, title: str = "", xlabel: str = "KV pool (blocks)"
) -> Figure:
    """The figure of :func:`overlay_data`'s table (not saved); each line's ``gid`` is
    ``SOURCE:POLICY``."""
    policies = list(dict.fromkeys(data.series))
    online = [p for p in policies if p != BOUND]
    if len(online) > MAX_POLICIES:
        raise KvsimError(
            f"{len(online)} policies is more than {MAX_POLICIES} distinguishable lines; replay "
            "fewer (--policies) or keep fewer sweep points (--where KEY=VALUE)"
        )
    colors = {p: color(i) for i, p in enumerate(online)} | {BOUND: BOUND_COLOR}
    with styled():
        fig, (ax,) = panels(1, width=5.6, height=3.4)
        for (source, policy), rows in data.groupby(["source", "series"], sort=False):
            _line(ax, rows, str(source), str(policy), colors[str(policy)], policies)
        _axes(ax, data.x.to_numpy(float), xlabel, title)
        handles = [_handle(p, colors[p], policies.index(p)) for p in policies]
        handles.append(Line2D([], [], color="0.4", ls="-", label="engine"))
        handles.append(Line2D([], [], color="0.4", ls="--", label="replay (same requests)"))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    return fig


def _handle(policy: str, tint: str, i: int) -> Line2D:
    """A legend entry: the policy's colour and marker (OPT's line dashed: replay only)."""
    label = f"{policy} (bound)" if policy == BOUND else policy
    return Line2D([], [], color=tint, ls="--" if policy == BOUND else "-", marker=marker(i),
                  label=label)  # fmt: skip


def _line(
    ax: plt.Axes, rows: pd.DataFrame, source: str, policy: str, tint: str, order: list[str]
) -> None:
    """One policy's line: solid with error bars (engine) or dashed (replay)."""
    xs, ys = rows.x.to_numpy(float), rows["mean"].to_numpy(float) * 100
    gid, mark = f"{source}:{policy}", marker(order.index(policy))
    if source == "engine":
        bars = ax.errorbar(xs, ys, yerr=rows["std"].to_numpy(float) * 100, color=tint, marker=mark,
                           ms=4, capsize=2.5)  # fmt: skip
        bars.lines[0].set_gid(gid)
        return
    width = 1.8 if policy == BOUND else 1.2
    ax.plot(xs, ys, color=tint, ls="--", lw=width, marker=mark, ms=3, mfc="none", gid=gid)


def _axes(ax: plt.Axes, xs: np.ndarray, xlabel: str, title: str) -> None:
    """Labels, a log2 x axis over a wide power-of-two range, the y axis from 0."""
    ax.set(xlabel=xlabel, ylabel="prefix hit rate (%)", title=title)
    ax.set_ylim(bottom=0)
    if xs.min() > 0 and xs.max() / xs.min() >= 8:
        ax.set_xscale("log", base=2 if np.allclose(np.log2(xs) % 1, 0) else 10)
        ticks = sorted(set(xs.tolist()))
        if len(ticks) <= 12:
            ax.set_xticks(ticks, [format_value(int(t) if t.is_integer() else t) for t in ticks])
            ax.minorticks_off()


def plot_hit_rate_overlay(source: Source, out: str | Path, options: PlotOptions = DEFAULTS) -> Path:
    """``kvsim plot SWEEP_DIR REPLAY.csv --kind hit-rate-overlay`` (and ``--data-out``)."""
    return emit(draw_hit_rate_overlay(source, options), out, options)


def draw_hit_rate_overlay(source: Source, options: PlotOptions = DEFAULTS) -> Drawn:
    """:func:`overlay_figure` with the reader's title, labels, limits and scales; its data
    is :func:`overlay_data`'s table."""
    fig, data = overlay_figure(source, options)
    ax = fig.axes[0]
    axis_options(ax, options)
    if options.title is not None:
        ax.set_title(options.title)
    return Drawn(fig, [ax], data)


def overlay_figure(source: Source, options: PlotOptions = DEFAULTS) -> tuple[Figure, pd.DataFrame]:
    """The sweep's hit rate (``--metric``, default hbm_reuse_hit_rate) against ``--x`` (default
    engine.kv_pool_blocks) with the replay's curves, checked to count the same requests in
    the same blocks; the title names the model, the hardware and the KV mode."""
    sweep_dir, csv_path = _two_sources(source)
    frame = sweep_rows(sweep_dir, options)
    x, series = options.x or ENGINE_X, ENGINE_SERIES
    _check_fixed(frame, [x, series])
    replay = _read_replay(csv_path)
    config = load_config(store.run_dir(sweep_dir, frame.point_id.iloc[0]) / "config.resolved.yaml")
    if series not in frame.columns:  # one policy for all points: the config names it
        frame = frame.assign(**{series: format_value(config.kv.eviction_for("hbm"))})
    _check_units(frame, replay, config.engine.block_tokens, csv_path)
    default = ENGINE_METRIC if ENGINE_METRIC in frame.columns else OLD_METRIC
    data = overlay_data(frame, replay, x=x, series=series, metric=options.metric or default)
    title = (
        f"{config.model.name} on {config.hardware.name}, kv.mode={config.kv.mode}: first "
        f"{int(replay.requests.iloc[0]):,} requests, {config.engine.block_tokens}-token blocks"
    )
    return draw_overlay(data, title=title, xlabel=f"KV pool ({x}, blocks)"), data


def _two_sources(source: Source) -> tuple[Path, Path]:
    """The sweep directory and the replay CSV, in either order."""
    paths = as_paths(source)
    csvs = [p for p in paths if p.suffix.lower() == ".csv"]
    sweeps = [p for p in paths if p not in csvs]
    if len(csvs) != 1 or len(sweeps) != 1 or not (sweeps[0] / store.RESULTS).is_file():
        raise KvsimError(
            "hit-rate-overlay draws a sweep directory (written by 'kvsim sweep') and a 'kvsim "
            f"replay --block-tokens B --max-requests N' CSV; got {', '.join(map(str, paths))}"
        )
    if not csvs[0].is_file():
        raise KvsimError(f"{csvs[0]}: no such file")
    return sweeps[0], csvs[0]


def _check_fixed(frame: pd.DataFrame, drawn: list[str]) -> None:
    """Refuse a sweep whose other axes vary among the points drawn (they would mix)."""
    for axis in frame.attrs["axes"]:
        values = frame[axis].map(format_value).unique()
        if axis not in drawn and len(values) > 1:
            raise KvsimError(
                f"axis {axis!r} varies ({', '.join(values[:4])}) but the overlay draws one "
                f"policy axis ({drawn[1]}) against {drawn[0]}; fix it with "
                f"--where {axis}={values[0]}"
            )


def _read_replay(path: Path) -> pd.DataFrame:
    """A ``kvsim replay`` CSV with every column the overlay needs."""
    return read_replay_csv(path, REPLAY_COLUMNS, " of this version")


def _check_units(frame: pd.DataFrame, replay: pd.DataFrame, block_tokens: int, path: Path) -> None:
    """The replay counted the sweep's requests in the sweep's blocks, or an error says how."""
    replayed = set(replay.block_tokens.dropna().astype(int).tolist())
    if replay.block_tokens.isna().any() or replayed != {block_tokens}:
        shown = "trace blocks" if replay.block_tokens.isna().any() else f"{sorted(replayed)}"
        raise KvsimError(
            f"{path}: block_tokens = {shown}, but the sweep's engine.block_tokens is "
            f"{block_tokens}; rerun 'kvsim replay ... --block-tokens {block_tokens}'"
        )
    loaded = _engine_requests(frame)
    counts = set(replay.requests.astype(int).tolist())
    if counts != {loaded}:
        raise KvsimError(
            f"{path}: requests = {sorted(counts)}, but each sweep point ran {loaded}; rerun "
            f"'kvsim replay ... --max-requests {loaded}' (the same first requests)"
        )


def _engine_requests(frame: pd.DataFrame) -> int:
    """The number of trace requests each point loaded (its summary's workload report)."""
    if "workload" not in frame.columns:
        raise KvsimError("the sweep's workload is not a trace; replay needs the same trace")
    counts = {int(json.loads(text)["requests"]) for text in frame.workload}
    if len(counts) != 1:
        raise KvsimError(
            f"the sweep's points ran different numbers of requests ({sorted(counts)}); "
            "fix workload.max_requests with --where"
        )
    return counts.pop()
