"""What a plot reads: run directories, sweep directories (filtered), or a replay CSV."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from experiments import store
from experiments.sweep import format_value
from sim.config.loader import parse_override
from sim.errors import KvsimError

Source = str | Path | Sequence[str | Path]


Limits = tuple[float | None, float | None]


@dataclass(frozen=True)
class PlotOptions:
    """Choices for a figure: what to draw (filters, x, metric, series, panels) and how.

    ``None`` leaves a choice to the figure: its default title and labels, automatic limits,
    a log axis where the values span a wide range, the legend outside the panels when it
    would crowd them, the KV detail strip of ``hbm-pressure`` when KV is a sliver of HBM.
    ``data_out`` is a CSV file that receives the numbers the figure draws.
    """

    where: tuple[str, ...] = ()
    x: str | None = None
    metric: str | None = None
    hue: tuple[str, ...] | None = None
    panel: str | None = None
    title: str | None = None
    xlabel: str | None = None
    ylabel: str | None = None
    xlim: Limits | None = None
    ylim: Limits | None = None
    legend: str | None = None
    logx: bool | None = None
    logy: bool | None = None
    kv_detail: bool | None = None
    data_out: Path | None = None


DEFAULTS = PlotOptions()


@dataclass(frozen=True)
class Run:
    """One run directory to draw, its label, and the label of its configuration (no seed)."""

    path: Path
    label: str
    config: str = ""
    params: dict[str, Any] = field(default_factory=dict)


def as_paths(source: Source) -> list[Path]:
    """One path or several, as a list."""
    if isinstance(source, str | Path):
        return [Path(source)]
    return [Path(s) for s in source]


def is_sweep(path: Path) -> bool:
    """Whether ``path`` is a sweep directory."""
    return (path / store.RESULTS).is_file()


def is_run(path: Path) -> bool:
    """Whether ``path`` is a run directory."""
    return (path / "timeline.parquet").is_file()


def filter_rows(frame: pd.DataFrame, where: Sequence[str], name: str) -> pd.DataFrame:
    """Rows of a results table matching every ``KEY=VALUE`` (compared as text).

    ``KEY=V1|V2|...`` keeps the rows whose value is any of the alternatives.
    """
    for text in where:
        path, _ = parse_override(text)
        key = ".".join(path)
        if key not in frame.columns:
            axes = ", ".join([*frame.attrs.get("axes", []), "seed"])
            raise KvsimError(f"--where {text}: {name} has no column {key!r}; axes: {axes}")
        raw = text.partition("=")[2]
        wanted = {format_value(parse_override(f"{key}={alt}")[1]) for alt in raw.split("|")}
        frame = frame[frame[key].map(format_value).isin(wanted)]
        if frame.empty:
            raise KvsimError(f"--where {text}: no point of {name} matches")
    return frame


def sweep_rows(path: Path, options: PlotOptions) -> pd.DataFrame:
    """The finished points of a sweep that pass the filters (``attrs['axes']`` kept)."""
    frame = store.load(path)
    axes = frame.attrs["axes"]
    frame = filter_rows(frame[frame.status == "done"], options.where, str(path))
    if frame.empty:
        raise KvsimError(f"{path}: no finished point to plot")
    frame.attrs["axes"] = axes
    return frame


def varying(frame: pd.DataFrame, columns: Sequence[str]) -> list[str]:
    """The columns that take more than one value in ``frame``."""
    return [c for c in columns if frame[c].map(format_value).nunique() > 1]


def label_of(row: pd.Series, columns: Sequence[str], default: str) -> str:
    """``kv.mode=hbm, hardware=h100-sxm`` for the given columns, else ``default``."""
    parts = [f"{c}={format_value(row[c])}" for c in columns]
    return ", ".join(parts) if parts else default


def _sweep_runs(path: Path, options: PlotOptions) -> list[Run]:
    frame = sweep_rows(path, options)
    axes = varying(frame, frame.attrs["axes"])
    with_seed = axes + (["seed"] if frame.seed.nunique() > 1 else [])
    return [
        Run(
            store.run_dir(path, row.point_id),
            label_of(row, with_seed, path.name),
            label_of(row, axes, path.name),
            {a: row[a] for a in [*frame.attrs["axes"], "seed"]},
        )
        for _, row in frame.iterrows()
    ]


def runs(source: Source, options: PlotOptions = DEFAULTS) -> list[Run]:
    """Every run to draw: run directories as given, and the finished points of sweeps."""
    found: list[Run] = []
    for path in as_paths(source):
        if is_sweep(path):
            found.extend(_sweep_runs(path, options))
        elif is_run(path):
            found.append(Run(path, path.name, path.name))
        else:
            raise KvsimError(
                f"{path}: not a run directory (no timeline.parquet) nor a sweep directory "
                f"(no {store.RESULTS}); run 'kvsim run' or 'kvsim sweep' first"
            )
    return found


def one_sweep(source: Source, kind: str) -> Path:
    """The single sweep directory a sweep plot needs."""
    paths = as_paths(source)
    if len(paths) != 1 or not is_sweep(paths[0]):
        raise KvsimError(
            f"{kind} plots a sweep: give one directory written by 'kvsim sweep' "
            f"(with {store.RESULTS}); got {', '.join(map(str, paths))}"
        )
    return paths[0]


def read_replay_csv(path: Path, columns: Sequence[str], what: str = "") -> pd.DataFrame:
    """A ``kvsim replay`` CSV that has ``columns`` (``what``: why they are needed)."""
    if not path.is_file():
        raise KvsimError(f"{path}: no such file")
    table = pd.read_csv(path)
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise KvsimError(
            f"{path}: not a 'kvsim replay' CSV{what}; missing column(s) {', '.join(missing)} "
            f"(expected {', '.join(columns)})"
        )
    return table


def determined(frame: pd.DataFrame, by: list[str], axis: str) -> bool:
    """Whether ``axis`` takes one value within each group of ``by`` (e.g. zipped with x)."""
    if not by:
        return frame[axis].map(format_value).nunique() <= 1
    text = frame[[*by, axis]].map(format_value)
    return bool((text.groupby(by)[axis].nunique() <= 1).all())


def check_loose(frame: pd.DataFrame, loose: list[str]) -> None:
    """Refuse axes that vary but are drawn by nothing (not x, a hue nor the panel)."""
    if loose:
        values = frame[loose[0]].map(format_value).unique()
        raise KvsimError(
            f"axis {loose[0]!r} varies ({', '.join(values[:4])}) but is not --x, --hue nor "
            f"--panel; fix it with --where {loose[0]}={values[0]} or add it to --hue"
        )
