"""Fit the host link's chunk efficiency to published copy-bandwidth measurements by size.

``validation/data/host_copy_bandwidth.csv`` holds achieved host-to-device bandwidths of copies
made of chunks of a given size, each with its source (``fit`` = 1: rows the fit uses). The
model is :func:`sim.memory.links.chunk_efficiency`: chunks of ``s`` bytes get
``peak / (1 + (h/s)^p)^(1/p)``. It is fitted, in log space, to the batched (back-to-back
``cuMemcpyBatchAsync``) rows and the large-copy plateau of one GPU, with ``peak`` held at the
profile's ``link.h2d``. ``h / peak`` is the per-chunk cost in seconds (descriptor submission,
a host-side cost): other links carry it over as ``h = cost x their bandwidth``
(``docs/tiering.md``). ``python -m validation.copyfit`` prints the fit and its errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from sim.config import load_hardware
from sim.memory.links import chunk_efficiency

POINTS = Path(__file__).parent / "data" / "host_copy_bandwidth.csv"
PROFILES = {"h100": "h100-sxm"}  # each GPU's profile: its link.h2d is the peak


@dataclass(frozen=True)
class CopyFit:
    """The fitted chunk curve of one link and its error on the points."""

    half_efficiency_bytes: float
    blend: float
    peak: float
    errors: pd.DataFrame  # the points with predicted GB/s and APE

    @property
    def chunk_cost_s(self) -> float:
        """Seconds each chunk costs: ``h / peak``."""
        return self.half_efficiency_bytes / self.peak


def read_points(path: str | Path = POINTS) -> pd.DataFrame:
    """The measured points: ``gpu``, ``regime``, ``chunk_bytes``, ``gbps``, ``fit``, ``source``."""
    return pd.read_csv(path)


def predict_gbps(chunk_bytes: np.ndarray, peak: float, half: float, blend: float) -> np.ndarray:
    """Achieved GB/s of copies in chunks of ``chunk_bytes`` (the simulator's own function)."""
    eff = [chunk_efficiency(float(s), half, blend) for s in np.asarray(chunk_bytes)]
    return peak * np.asarray(eff) / 1e9


def fit_chunk_curve(points: pd.DataFrame, gpu: str = "h100", peak: float | None = None) -> CopyFit:
    """Fit ``half_efficiency_bytes`` and ``chunk_blend`` to one GPU's ``fit`` rows (``peak``:
    its profile's ``link.h2d`` unless given)."""
    if peak is None:
        peak = load_hardware(PROFILES[gpu]).link.h2d
    rows = points[(points.gpu == gpu) & (points.fit == 1)]
    size, gbps = rows.chunk_bytes.to_numpy(float), rows.gbps.to_numpy(float)

    def residuals(x: np.ndarray) -> np.ndarray:
        return np.log(predict_gbps(size, peak, np.exp(x[0]), 1.0 + np.exp(x[1])) / gbps)

    result = least_squares(residuals, x0=np.array([np.log(32e3), 0.0]))
    half, blend = float(np.exp(result.x[0])), float(1.0 + np.exp(result.x[1]))
    return CopyFit(half, blend, peak, with_errors(points[points.gpu == gpu], peak, half, blend))


def with_errors(points: pd.DataFrame, peak: float, half: float, blend: float) -> pd.DataFrame:
    """``points`` with the curve's prediction (``predicted``) and its APE (``ape``)."""
    out = points.copy()
    out["predicted"] = predict_gbps(out.chunk_bytes.to_numpy(float), peak, half, blend)
    out["ape"] = (out.predicted / out.gbps - 1.0).abs()
    return out


def main() -> None:
    """Print the H100 fit, its per-chunk cost, and the errors on every point."""
    fit = fit_chunk_curve(read_points())
    print(
        f"half_efficiency_bytes {fit.half_efficiency_bytes:.0f} B, chunk_blend {fit.blend:.3f}, "
        f"per-chunk cost {fit.chunk_cost_s * 1e6:.3f} us at {fit.peak / 1e9:g} GB/s"
    )
    cols = ["regime", "chunk_bytes", "gbps", "predicted", "ape", "fit"]
    print(fit.errors[cols].to_string(index=False))


if __name__ == "__main__":
    main()
