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
MAX_PANELS = 12
MAX_LINES = 12
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


def panels(n: int, width: float = 4.2, height: float = 2.8) -> tuple[Figure, list[Axes]]:
    """A figure with ``n`` panels in up to three columns (cell size in inches)."""
    if n > MAX_PANELS:
        raise KvsimError(
            f"{n} panels is more than {MAX_PANELS}; choose fewer runs (--where KEY=VALUE)"
        )
    cols = min(n, 3 if n > 4 else 2) if n > 1 else 1
    rows = math.ceil(n / cols)
    fig, grid = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    axes = list(grid.flat)
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def save(fig: Figure, out: str | Path) -> Path:
    """Write the figure (PNG at 300 dpi, or vector PDF/SVG) and close it."""
    out = check_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=PNG_DPI)
    plt.close(fig)
    return out


def figure_legend(fig: Figure, axes: list[Axes], ncol: int = 4) -> None:
    """One legend for all panels, above them (labels taken from the first panel)."""
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=ncol,
               frameon=False)  # fmt: skip
