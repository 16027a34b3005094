"""The reader's choices laid on a drawn figure, and writing it with the numbers it draws.

A plot draws its panels, then :func:`finish` applies ``--title``, ``--xlabel``,
``--ylabel``, ``--xlim``, ``--ylim``, ``--logx``/``--logy`` and ``--legend``, and
:func:`emit` saves the figure and, with ``--data-out``, the table it was drawn from.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pandas as pd
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from experiments.plots.sources import Limits, PlotOptions
from experiments.plots.style import check_out, plt, save, styled
from sim.errors import KvsimError

LOCATIONS = (
    "best", "upper right", "upper left", "lower left", "lower right", "right", "center left",
    "center right", "lower center", "upper center", "center",
)  # fmt: skip
LEGENDS = ("outside", "none", *LOCATIONS)
CROWDED = 4  # legend entries beyond which a legend inside a panel would cover its data


@dataclass
class Drawn:
    """A drawn figure, its panels and the table of the numbers it draws (axis units)."""

    fig: Figure
    axes: list[Axes]
    data: pd.DataFrame


def parse_limits(text: str, flag: str = "--xlim") -> Limits:
    """``LOW,HIGH`` as two numbers; a side left empty stays automatic (``0,``)."""
    low, sep, high = text.partition(",")
    expected = "expected LOW,HIGH in the axis' unit, one side may be empty (e.g. 0,100 or 0,)"
    try:
        if not sep or "," in high:
            raise ValueError
        limits = tuple(float(v) if v.strip() else None for v in (low, high))
    except ValueError:
        raise KvsimError(f"{flag} {text!r}: {expected}") from None
    if any(v is not None and not math.isfinite(v) for v in limits):
        raise KvsimError(f"{flag} {text!r}: {expected}; got a value that is not finite")
    if limits[0] is not None and limits[1] is not None and limits[0] >= limits[1]:
        raise KvsimError(f"{flag} {text!r}: LOW must be below HIGH")
    return limits[0], limits[1]


def check_legend(text: str) -> str:
    """A ``--legend`` placement: ``outside``, ``none`` or a matplotlib location."""
    if text not in LEGENDS:
        raise KvsimError(f"--legend {text!r}: expected one of: {', '.join(LEGENDS)}")
    return text


def _scale(ax: Axes, axis: str, log: bool | None) -> None:
    """Log or linear as asked (a plot that already chose it keeps its own log base)."""
    current = ax.get_xscale() if axis == "x" else ax.get_yscale()
    if log is None or (current == "log") == log:
        return
    if axis == "x":
        ax.set_xscale("log" if log else "linear")
        ax.set_autoscalex_on(True)  # NOTE: a plot may have pinned limits a log axis cannot take
        ax.autoscale_view(scaley=False)
    else:
        ax.set_yscale("log" if log else "linear")
        ax.set_autoscaley_on(True)
        ax.autoscale_view(scalex=False)


def _on(scale: str, limits: Limits, flag: str) -> Limits:
    """The limits, if the axis can take them (a log axis has no 0 or below)."""
    if scale == "log" and any(v is not None and v <= 0 for v in limits):
        shown = ",".join("" if v is None else f"{v:g}" for v in limits)
        raise KvsimError(f"{flag} {shown}: the axis is logarithmic; expected limits above 0")
    return limits


def _x_options(ax: Axes, options: PlotOptions) -> None:
    if options.xlabel is not None and ax.get_xlabel():
        ax.set_xlabel(options.xlabel)
    _scale(ax, "x", options.logx)
    if options.xlim is not None:
        ax.set_xlim(*_on(ax.get_xscale(), options.xlim, "--xlim"))


def _y_options(ax: Axes, options: PlotOptions) -> None:
    if options.ylabel is not None:
        ax.set_ylabel(options.ylabel)
    _scale(ax, "y", options.logy)
    if options.ylim is not None:
        ax.set_ylim(*_on(ax.get_yscale(), options.ylim, "--ylim"))


def legend_entries(axes: Sequence[Axes]) -> tuple[list[Artist], list[str]]:
    """The labelled artists of all panels, each label once, in order of appearance."""
    found: dict[str, Artist] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            found.setdefault(label, handle)
    return list(found.values()), list(found)


def _legend(fig: Figure, axes: Sequence[Axes], every: Sequence[Axes], choice: str | None) -> None:
    handles, labels = legend_entries(every)
    if not labels or choice == "none":
        return
    if choice is None:  # NOTE: inside a panel only while it is small and the panel alone
        choice = "outside" if len(axes) > 1 or len(labels) > CROWDED else "best"
    if choice == "outside":
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5),
                   frameon=False, ncol=1 if len(labels) <= 16 else 2)  # fmt: skip
    else:
        axes[0].legend(handles, labels, loc=cast(Any, choice), frameon=False)  # NOTE: checked


def axis_options(ax: Axes, options: PlotOptions) -> None:
    """The reader's labels, limits and log scales on one panel."""
    _x_options(ax, options)
    _y_options(ax, options)


def finish(
    fig: Figure,
    axes: Sequence[Axes],
    options: PlotOptions,
    title: str,
    strips: Sequence[Axes] = (),
) -> None:
    """Apply the reader's options to the panels (``strips`` take the x options only), set
    the title (``options.title``, else ``title``: on the panel when there is one, else above
    the figure), lay the figure out and place the legend."""
    for ax in axes:
        _x_options(ax, options)
        _y_options(ax, options)
    for ax in strips:
        _x_options(ax, options)
    text = options.title if options.title is not None else title
    if len(axes) == 1:
        axes[0].set_title(text)
    elif text:
        fig.suptitle(text)
    fig.tight_layout()
    _legend(fig, axes, [*axes, *strips], options.legend)


def write_data(data: pd.DataFrame, path: str | Path) -> Path:
    """The figure's numbers as CSV (``--data-out``)."""
    path = Path(path)
    if path.suffix.lower() != ".csv":
        raise KvsimError(f"--data-out {path}: expected a .csv file")
    path.parent.mkdir(parents=True, exist_ok=True)
    data.to_csv(path, index=False)
    return path


def emit(drawn: Drawn, out: str | Path, options: PlotOptions) -> Path:
    """Save the figure (and its data, with ``options.data_out``); close it either way."""
    try:
        out = check_out(out)
        if options.data_out is not None:
            write_data(drawn.data, options.data_out)
        with styled():
            return save(drawn.fig, out)
    finally:
        plt.close(drawn.fig)
