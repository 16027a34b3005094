"""How fast memory-bound kernels stream HBM, card by card, from published measurements.

``validation/data/memory_streaming.csv`` holds streaming benchmarks (BabelStream, OpenCL-
Benchmark) and weight-streaming GEMVs, each with its source. From them:

- a profile's ``efficiency.hbm`` is its card's measured triad (or, with none, its read
  stream) as a fraction of ``hbm.bandwidth``;
- ``efficiency.gemm_memory`` of a card whose other GEMM parameters are carried from the
  H100 fit (the same Hopper die and clocks) is fitted to its own GEMVs with that carried
  ``gemm_latency`` held: one token's row through an ``n x k`` weight, priced by the cost
  model's own GEMM (:func:`sim.cost.roofline.gemm_seconds`), least squares in relative
  error;
- decode attention, fitted on H100 kernels only, is carried to another Hopper card as the
  H100's ratio of decode-attention to weight-streaming bandwidth times the card's own
  weight-streaming fraction, and never above the fastest stream measured on the card (its
  read-only stream, or its triad where that came out faster).

``python -m validation.streamfit`` prints each card's figures and the error of the fit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import minimize_scalar

from sim.config import load_hardware
from sim.cost.roofline import CostParams, gemm_seconds
from validation.fit import read_data

DATA = Path(__file__).parent / "data" / "memory_streaming.csv"
REFERENCE = "h100-sxm"  # the profile whose decode-attention and GEMM fits the others carry
CARRIERS = ("h200-sxm", "gh200")  # the Hopper profiles that carry them (same die, own memory)
TRIADS = ("babelstream-triad",)
READS = ("babelstream-dot", "opencl-coalesced-read")
DTYPE_BYTES = {"fp16": 2, "bf16": 2}


@dataclass(frozen=True)
class StreamFit:
    """A card's fitted weight-streaming fraction and its error on the GEMV rows."""

    gpu: str
    gemm_memory: float
    errors: pd.Series  # predicted / measured - 1, by row (fit rows)
    checks: pd.Series  # the same for the check rows


def load_points(path: Path = DATA) -> pd.DataFrame:
    """The measurements, one row each."""
    return read_data(path)


def _fraction(rows: pd.DataFrame, gpu: str, kernels: tuple[str, ...]) -> float | None:
    """The best of ``gpu``'s ``kernels`` streams, as a fraction of its profile's peak."""
    picked = rows[(rows.gpu == gpu) & rows.kernel.isin(kernels)]
    if picked.empty:
        return None
    return float(picked.tbps.max()) * 1e12 / load_hardware(gpu).hbm.bandwidth


def hbm_fraction(gpu: str, rows: pd.DataFrame | None = None) -> float | None:
    """``efficiency.hbm`` as measured: the triad stream, else the read stream."""
    rows = load_points() if rows is None else rows
    triad = _fraction(rows, gpu, TRIADS)
    return triad if triad is not None else _fraction(rows, gpu, READS)


def read_ceiling(gpu: str, rows: pd.DataFrame | None = None) -> float | None:
    """The fastest stream measured on ``gpu``, read-only or triad, as a fraction of peak
    (None: none measured): no read-only kernel runs slower than that, and none faster is on
    record."""
    return _fraction(load_points() if rows is None else rows, gpu, READS + TRIADS)


def _gemv_seconds(params: CostParams, rows: pd.DataFrame) -> np.ndarray:
    """The cost model's time of each row's one-token GEMV."""
    return np.array(
        [
            gemm_seconds(params, 1, r.k, r.n, DTYPE_BYTES[r.dtype])
            for r in rows.itertuples(index=False)
        ]
    )


def _measured_seconds(rows: pd.DataFrame) -> np.ndarray:
    """Each row's time: its weights and vectors over its measured bandwidth."""
    width = rows.dtype.map(DTYPE_BYTES).to_numpy(dtype=float)
    moved = (rows.n * rows.k + rows.n + rows.k).to_numpy(dtype=float) * width
    return moved / (rows.tbps.to_numpy(dtype=float) * 1e12)


def _errors(params: CostParams, rows: pd.DataFrame) -> pd.Series:
    """Each GEMV row priced with ``params``: predicted / measured - 1."""
    return pd.Series(_gemv_seconds(params, rows) / _measured_seconds(rows) - 1.0, rows.index)


def fit_streaming(gpu: str, rows: pd.DataFrame | None = None) -> StreamFit:
    """``gemm_memory`` for ``gpu`` from its GEMV rows, the rest of its GEMM as its profile
    has it (carried)."""
    rows = load_points() if rows is None else rows
    gemv = rows[(rows.kind == "gemv") & (rows.gpu == gpu)]
    fit, check = gemv[gemv.role == "fit"], gemv[gemv.role == "check"]
    base = CostParams.from_hardware(load_hardware(gpu))

    def loss(memory: float) -> float:
        errors = _errors(replace(base, gemm_memory_efficiency=memory), fit)
        return float(np.sum(errors.to_numpy() ** 2))

    memory = float(minimize_scalar(loss, bounds=(0.2, 1.0), method="bounded").x)
    params = replace(base, gemm_memory_efficiency=memory)
    return StreamFit(gpu, memory, _errors(params, fit), _errors(params, check))


def priced(gpu: str, rows: pd.DataFrame | None = None) -> pd.Series:
    """``gpu``'s GEMV rows priced by its profile as it is: predicted / measured - 1."""
    rows = load_points() if rows is None else rows
    gemv = rows[(rows.kind == "gemv") & (rows.gpu == gpu)]
    return _errors(CostParams.from_hardware(load_hardware(gpu)), gemv)


def carried_decode(gpu: str, rows: pd.DataFrame | None = None) -> float:
    """The decode-attention fraction a Hopper card carries from the H100 fit: the H100's
    ratio of decode attention to weight streaming times the card's weight-streaming fraction
    (``gemm_memory``, else ``hbm``), at most the fastest stream measured on it."""
    rows = load_points() if rows is None else rows
    ref, eff = load_hardware(REFERENCE).efficiency, load_hardware(gpu).efficiency
    value = ref.decode_attention / ref.gemm_memory * (eff.gemm_memory or eff.hbm)
    ceiling = read_ceiling(gpu, rows)
    return value if ceiling is None else min(value, ceiling)


def main() -> None:
    """Print each card's streaming figures and the GEMV fit."""
    rows = load_points()
    for gpu in sorted(set(rows.gpu)):
        hbm, ceiling = hbm_fraction(gpu, rows), read_ceiling(gpu, rows)
        line = f"{gpu}: hbm {hbm:.4f}, read ceiling {ceiling:.4f}"
        if gpu in CARRIERS:
            line += f", decode_attention carried {carried_decode(gpu, rows):.4f}"
        gemv = rows[(rows.gpu == gpu) & (rows.kind == "gemv")]
        if (gemv.role == "fit").any():
            fit = fit_streaming(gpu, rows)
            line += (
                f"; gemm_memory {fit.gemm_memory:.4f} (max error "
                f"{fit.errors.abs().max():.1%}); checks "
                + ", ".join(f"{e:+.1%}" for e in fit.checks)
            )
        elif not gemv.empty:
            line += "; GEMV checks " + ", ".join(f"{e:+.1%}" for e in priced(gpu, rows))
        print(line)


if __name__ == "__main__":
    main()
