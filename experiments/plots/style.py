"""One look for every figure: fonts, colours, panel grids, and saving PNG or PDF."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from sim.errors import KvsimError

FORMATS = (".png", ".pdf", ".svg")
PNG_DPI = 300
MAX_PANELS = 9  # a 3 x 3 grid
MAX_LINES = 8  # one colour of PALETTE each: no colour is repeated within a figure
# Okabe-Ito: distinguishable with the common colour-vision deficiencies, and in greyscale.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
STYLE: dict[str, Any] = {
    "font.size": 9,
    "axes.titlesize": 9,
    "axes.labelsize": 9,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.5,
    "lines.linewidth": 1.4,
    "pdf.fonttype": 42,  # NOTE: TrueType in PDFs, as publishers ask
    "savefig.bbox": "tight",
}
GIB = 2.0**30


@contextmanager
def styled() -> Iterator[None]:
    """Within the block, new figures take the house style (:data:`STYLE`)."""
    with plt.rc_context(STYLE):  # type: ignore[arg-type]  # NOTE: stubs want literal keys
        yield


def check_lines(n: int, what: str = "lines") -> None:
    """Refuse more series than :data:`MAX_LINES` distinguishable ones."""
    if n > MAX_LINES:
        raise KvsimError(
            f"{n} {what} is more than the {MAX_LINES} a figure keeps distinguishable (one "
            "colour each); keep fewer with --where KEY=V1|V2|..., fix an axis with --where "
            "KEY=VALUE, or split them into panels with --panel AXIS"
        )


def color(i: int) -> str:
    """The i-th series colour."""
    return PALETTE[i % len(PALETTE)]


def marker(i: int) -> str:
    """The i-th series marker (shifted each time the colours wrap, so no pair repeats)."""
    return MARKERS[(i + i // len(PALETTE)) % len(MARKERS)]


def linestyle(i: int) -> str:
    """The i-th series line style: solid, then dashed once the colours wrap."""
    return "-" if i < len(PALETTE) else "--"


def check_out(out: str | Path) -> Path:
    """The output path, if its suffix is a format we write."""
    out = Path(out)
    if out.suffix.lower() not in FORMATS:
        raise KvsimError(f"{out}: unknown figure format; expected one of: {', '.join(FORMATS)}")
    return out


def _grid(n: int) -> tuple[int, int]:
    """(rows, columns) for ``n`` panels in up to three columns; refuses too many."""
    if n > MAX_PANELS:
        raise KvsimError(
            f"{n} panels is more than {MAX_PANELS}; choose fewer runs (--where KEY=VALUE)"
        )
    cols = min(n, 3 if n > 4 else 2) if n > 1 else 1
    return math.ceil(n / cols), cols


def panels(n: int, width: float = 4.2, height: float = 2.8) -> tuple[Figure, list[Axes]]:
    """A figure with ``n`` panels in up to three columns (cell size in inches)."""
    rows, cols = _grid(n)
    fig, grid = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    axes = list(grid.flat)
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def panel_pairs(
    n: int, width: float = 4.2, height: float = 2.8, strip: float = 0.45
) -> tuple[Figure, list[Axes], list[Axes]]:
    """Like :func:`panels`, each panel with a strip below it (``strip`` of its height) that
    shares its x axis: (figure, main panels, strips)."""
    rows, cols = _grid(n)
    fig, grid = plt.subplots(
        2 * rows, cols, figsize=(width * cols, height * (1 + strip) * rows), squeeze=False,
        gridspec_kw={"height_ratios": [1.0, strip] * rows},
    )  # fmt: skip
    cells = [(grid[2 * (i // cols), i % cols], grid[2 * (i // cols) + 1, i % cols])
             for i in range(rows * cols)]  # fmt: skip
    for top, bottom in cells[n:]:
        top.set_visible(False)
        bottom.set_visible(False)
    for top, bottom in cells[:n]:
        bottom.sharex(top)
        top.tick_params(labelbottom=False)
    return fig, [top for top, _ in cells[:n]], [bottom for _, bottom in cells[:n]]


def save(fig: Figure, out: str | Path) -> Path:
    """Write the figure (PNG at 300 dpi, or vector PDF/SVG) and close it."""
    out = check_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=PNG_DPI)
    plt.close(fig)
    return out


def figure_legend(fig: Figure, axes: list[Axes], ncol: int = 4) -> None:
    """One legend for all panels, above them (labels taken from the first panel; the
    gallery script's; ``kvsim plot`` places its legends with :mod:`experiments.plots.layout`)."""
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=ncol,
               frameon=False)  # fmt: skip
